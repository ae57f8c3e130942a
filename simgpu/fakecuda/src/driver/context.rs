//! Contexts: primary and created ones, the calling thread's current
//! context stack, and context-wide synchronization.

use super::*;

pub(super) fn ctx_dev(l: &Local, h: usize) -> R<usize> {
    match l.objs.get(&h) {
        Some(Obj::Ctx { dev }) => Ok(*dev),
        _ => Err(cu::INVALID_CONTEXT),
    }
}

pub fn primary_retain(d: c_int) -> R<Handle> {
    let p = proc_()?;
    p.dev(d)?;
    let dev = d as usize;
    attach(p, dev)?;
    check(p, dev)?;
    let mut l = p.local();
    let existing = l.clients[dev].as_ref().and_then(|c| c.primary);
    let h = match existing {
        Some((h, _)) => h,
        None => {
            let h = alloc_id(&mut l);
            l.objs.insert(h, Obj::Ctx { dev });
            h
        }
    };
    if let Some(c) = l.clients[dev].as_mut() {
        let n = c.primary.map_or(0, |x| x.1);
        if n == 0 {
            c.contexts += 1;
        }
        c.primary = Some((h, n + 1));
    }
    Ok(h as Handle)
}

pub fn primary_release(d: c_int) -> R<()> {
    let p = proc_()?;
    let dev = usize::try_from(d)
        .ok()
        .filter(|&i| i < p.devs.len())
        .ok_or(cu::INVALID_DEVICE)?;
    let mut l = p.local();
    let Some(c) = l.clients[dev].as_mut() else {
        return Err(cu::INVALID_CONTEXT);
    };
    let Some((h, n)) = c.primary else {
        return Err(cu::INVALID_CONTEXT);
    };
    if n > 1 {
        c.primary = Some((h, n - 1));
        return Ok(());
    }
    c.primary = None;
    end_context(p, l, dev, h);
    Ok(())
}

/// Forgets context `h` of device `dev` (its object, its count, this
/// thread's stack); the process detaches from the GPU with its last one.
pub(super) fn end_context(p: &Proc, mut l: std::sync::MutexGuard<'_, Local>, dev: usize, h: usize) {
    l.objs.remove(&h);
    let last = match l.clients[dev].as_mut() {
        Some(c) => {
            c.contexts = c.contexts.saturating_sub(1);
            c.contexts == 0
        }
        None => false,
    };
    drop(l);
    CTX_STACK.with(|s| s.borrow_mut().retain(|&x| x != h));
    if last {
        detach(p, dev);
    }
}

pub fn primary_reset(d: c_int) -> R<()> {
    while primary_release(d).is_ok() {}
    Ok(())
}

pub fn primary_state(d: c_int) -> R<bool> {
    let p = proc_()?;
    p.dev(d)?;
    Ok(p.local().clients[d as usize]
        .as_ref()
        .and_then(|c| c.primary)
        .is_some())
}

pub fn ctx_create(d: c_int) -> R<Handle> {
    let p = proc_()?;
    p.dev(d)?;
    let dev = d as usize;
    attach(p, dev)?;
    check(p, dev)?;
    let mut l = p.local();
    let h = alloc_id(&mut l);
    l.objs.insert(h, Obj::Ctx { dev });
    if let Some(c) = l.clients[dev].as_mut() {
        c.contexts += 1;
    }
    drop(l);
    CTX_STACK.with(|s| s.borrow_mut().push(h));
    Ok(h as Handle)
}

pub fn ctx_destroy(ctx: Handle) -> R<()> {
    let p = proc_()?;
    let h = ctx as usize;
    let l = p.local();
    let dev = ctx_dev(&l, h)?;
    if l.clients[dev].as_ref().and_then(|c| c.primary).map(|x| x.0) == Some(h) {
        return Err(cu::INVALID_CONTEXT);
    }
    end_context(p, l, dev, h);
    Ok(())
}

pub fn ctx_set_current(ctx: Handle) -> R<()> {
    let p = proc_()?;
    let h = ctx as usize;
    if h != 0 {
        ctx_dev(&p.local(), h)?;
    }
    CTX_STACK.with(|s| {
        let mut s = s.borrow_mut();
        s.pop();
        if h != 0 {
            s.push(h);
        }
    });
    Ok(())
}

pub fn current_ctx() -> Handle {
    CTX_STACK.with(|s| s.borrow().last().copied().unwrap_or(0)) as Handle
}

pub fn ctx_push(ctx: Handle) -> R<()> {
    let p = proc_()?;
    ctx_dev(&p.local(), ctx as usize)?;
    CTX_STACK.with(|s| s.borrow_mut().push(ctx as usize));
    Ok(())
}

pub fn ctx_pop() -> R<Handle> {
    proc_()?;
    CTX_STACK
        .with(|s| s.borrow_mut().pop())
        .map(|h| h as Handle)
        .ok_or(cu::INVALID_CONTEXT)
}

pub fn current_dev() -> R<usize> {
    let p = proc_()?;
    let h = CTX_STACK
        .with(|s| s.borrow().last().copied())
        .ok_or(cu::INVALID_CONTEXT)?;
    let dev = ctx_dev(&p.local(), h)?;
    Ok(dev)
}

/// The process and the calling thread's current device, checked (context
/// current, client not terminated, device not lost, no sticky error).
pub(super) fn current() -> R<(&'static Proc, usize)> {
    let p = proc_()?;
    let dev = current_dev()?;
    check(p, dev)?;
    Ok((p, dev))
}

pub fn check_current() -> R<()> {
    current().map(|_| ())
}

pub(super) fn sleep_until(t: u64) {
    loop {
        let now = now_ns();
        if now >= t {
            return;
        }
        std::thread::sleep(std::time::Duration::from_nanos((t - now).min(50_000_000)));
    }
}

pub fn ctx_synchronize() -> R<()> {
    let (p, dev) = current()?;
    let tail = p
        .local()
        .tails
        .values()
        .filter(|(d, _)| *d == dev)
        .map(|(_, t)| *t)
        .max()
        .unwrap_or(0);
    sleep_until(tail);
    check(p, dev)
}
