//! The contexts this process holds (primary retains, created contexts),
//! for the graceful exit to synchronize and release.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::Mutex;

use crate::abi::cu;
use crate::CUresult;

/// The book of contexts.
#[derive(Debug, Default)]
pub struct Contexts {
    book: Mutex<Book>,
}

#[derive(Debug, Default, Clone)]
pub struct Book {
    /// Device ordinal -> primary-context retain count.
    pub primary: HashMap<c_int, u32>,
    /// Contexts made with cuCtxCreate.
    pub created: Vec<usize>,
}

impl Contexts {
    fn with(&self, f: impl FnOnce(&mut Book)) {
        f(&mut self.book.lock().unwrap_or_else(|e| e.into_inner()));
    }
    pub fn retained(&self, dev: c_int, rc: CUresult) -> CUresult {
        if rc == cu::SUCCESS {
            self.with(|b| *b.primary.entry(dev).or_default() += 1);
        }
        rc
    }
    pub fn released(&self, dev: c_int, rc: CUresult) -> CUresult {
        if rc == cu::SUCCESS {
            self.with(|b| {
                if let Some(n) = b.primary.get_mut(&dev) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        b.primary.remove(&dev);
                    }
                }
            });
        }
        rc
    }
    pub fn reset(&self, dev: c_int, rc: CUresult) -> CUresult {
        if rc == cu::SUCCESS {
            self.with(|b| {
                b.primary.remove(&dev);
            });
        }
        rc
    }
    /// `ctx`: the context the driver returned (read after the call).
    pub fn created(&self, rc: CUresult, ctx: impl FnOnce() -> u64) -> CUresult {
        if rc == cu::SUCCESS {
            let h = ctx() as usize;
            self.with(|b| b.created.push(h));
        }
        rc
    }
    pub fn destroyed(&self, ctx: *mut c_void, rc: CUresult) -> CUresult {
        if rc == cu::SUCCESS {
            self.with(|b| b.created.retain(|&c| c != ctx as usize));
        }
        rc
    }
    /// Holds the book (while a fork copies the process).
    pub fn hold(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Empties the book, returning what was in it.
    pub fn take(&self) -> Book {
        std::mem::take(&mut *self.book.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn context_book() {
        let c = Contexts::default();
        c.retained(0, 0);
        c.retained(0, 0);
        c.retained(1, 2);
        c.released(0, 0);
        c.created(0, || 0x10);
        c.created(1, || 0x30);
        c.destroyed(0x20 as *mut c_void, 0);
        let b = c.take();
        assert_eq!(b.primary, HashMap::from([(0, 1)]));
        assert_eq!(b.created, vec![0x10]);
        assert!(c.take().primary.is_empty());
    }
}
