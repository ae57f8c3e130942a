//! The matcher's parallel steps on one kept pool of workers: a step splits
//! its work into `n` logical workers whose shares do not depend on which
//! thread runs them, and gets their results back in worker order, so a
//! round's result never depends on the scheduling. The pool is started
//! once, with [`crate::solver::SolveOptions`]' worker count (two at most:
//! the controller host also runs slurmctld); starting a thread per step
//! cost about 50 µs on the 2-core machine (2026-11-27), a tenth of a
//! replayed round's time.

use std::sync::OnceLock;

use rayon::prelude::*;

/// The matcher's pool.
fn pool() -> &'static rayon::ThreadPool {
    static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(crate::solver::SolveOptions::default().threads.max(1))
            .thread_name(|i| format!("muxflow-worker-{i}"))
            .build()
            .expect("the matcher's worker threads start")
    })
}

/// `work(t)` for every logical worker `t` in `0..n`, in parallel where
/// `n > 1`; the results in worker order. A worker's panic reaches the
/// caller.
pub(crate) fn each<T: Send>(n: usize, work: impl Fn(usize) -> T + Sync + Send) -> Vec<T> {
    if n <= 1 {
        return (0..n).map(work).collect();
    }
    pool().install(|| (0..n).into_par_iter().map(&work).collect())
}

/// `work(range)` for `n` items cut into `threads` contiguous blocks (the
/// last ones may be short or empty), the results in block order.
pub(crate) fn blocks<T: Send>(
    n: usize,
    threads: usize,
    work: impl Fn(std::ops::Range<usize>) -> T + Sync + Send,
) -> Vec<T> {
    let threads = threads.max(1);
    let block = n.div_ceil(threads);
    each(threads, |t| {
        work((t * block).min(n)..((t + 1) * block).min(n))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_back_in_worker_order() {
        assert_eq!(each(0, |t| t), Vec::<usize>::new());
        assert_eq!(each(1, |t| t * 10), [0]);
        assert_eq!(each(5, |t| t * 10), [0, 10, 20, 30, 40]);
        assert_eq!(blocks(5, 2, |r| r), [0..3, 3..5]);
        assert_eq!(blocks(1, 3, |r| r), [0..1, 1..1, 1..1]);
    }

    #[test]
    #[should_panic(expected = "worker 3")]
    fn a_workers_panic_reaches_the_caller() {
        each(4, |t| assert_ne!(t, 3, "worker 3"));
    }
}
