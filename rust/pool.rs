//! A small pool of worker threads that stay awake between the products of
//! one forward.
//!
//! A decoder step calls about two hundred products of 20–500 µs each, with a
//! few torch operations between them. A pool whose threads sleep after a few
//! microseconds (rayon's) pays a wake-up for every product; these workers
//! spin for `SPIN` after their last job, then park, so within a forward a
//! job starts in about a microsecond and an idle process burns nothing.
//!
//! `run(parts, job)` calls `job(0..parts)`: part 0 on the calling thread,
//! the others on workers, and returns when all are done. Jobs never
//! overlap (one lock). A panic in the caller's part is resumed after the
//! workers finish; one in a worker's part is caught there (the kernels do
//! not panic: their inputs are checked before they run).

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

/// How long an idle worker spins before it parks.
const SPIN: Duration = Duration::from_micros(2000);
/// The most workers the pool starts (beyond the calling thread).
pub const MAX_WORKERS: usize = 63;

type Job = dyn Fn(usize) + Sync;

/// A raw output pointer that a job's parts share, each writing its own
/// entries (the caller keeps them disjoint and in bounds).
#[derive(Clone, Copy)]
pub(crate) struct SharedOut(pub(crate) *mut f32);
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// The pointer `offset` entries on. A method, so a closure captures the
    /// whole (Sync) value rather than its raw pointer field.
    pub(crate) unsafe fn at(self, offset: usize) -> *mut f32 {
        self.0.add(offset)
    }
}

struct Shared {
    /// Incremented for every job; a worker runs a job when it sees a new one.
    epoch: AtomicU64,
    /// Parts of the current job not yet finished by the workers.
    pending: AtomicUsize,
    /// Parts the current job has (workers with an index below it take part).
    parts: AtomicUsize,
    /// The current job, valid while `pending` > 0.
    job: UnsafeCell<Option<*const Job>>,
    /// Sleeping workers wait here.
    lock: Mutex<u64>,
    wake: Condvar,
}

// SAFETY: `job` is written only by the caller holding `Pool::busy`, before
// it publishes the epoch (Release), and read by workers after they observe
// it (Acquire); the caller waits for `pending` to reach 0 before returning,
// so the pointee outlives every read.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

pub struct Pool {
    shared: Arc<Shared>,
    workers: usize,
    busy: Mutex<()>,
}

impl Pool {
    fn start(workers: usize) -> Pool {
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            pending: AtomicUsize::new(0),
            parts: AtomicUsize::new(0),
            job: UnsafeCell::new(None),
            lock: Mutex::new(0),
            wake: Condvar::new(),
        });
        let mut started = 0;
        for index in 1..=workers {
            let s = Arc::clone(&shared);
            let ok = thread::Builder::new()
                .name(format!("specdec-kernel-{index}"))
                .spawn(move || worker(s, index))
                .is_ok();
            if !ok {
                break; // fewer workers: the caller does more
            }
            started += 1;
        }
        Pool {
            shared,
            workers: started,
            busy: Mutex::new(()),
        }
    }

    /// job(0), ..., job(parts - 1), part 0 here and the others on workers
    /// (all here when the pool has too few).
    pub fn run(&self, parts: usize, job: &(dyn Fn(usize) + Sync + '_)) {
        if parts <= 1 || self.workers == 0 {
            for p in 0..parts {
                job(p);
            }
            return;
        }
        let _one_at_a_time = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        let helpers = (parts - 1).min(self.workers);
        let s = &self.shared;
        // SAFETY: see `Shared`; no worker reads `job` until the epoch moves.
        unsafe { *s.job.get() = Some(std::mem::transmute::<&(dyn Fn(usize) + Sync + '_), *const Job>(job)) };
        s.parts.store(helpers + 1, Ordering::Relaxed);
        s.pending.store(helpers, Ordering::Relaxed);
        {
            let mut epoch = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            *epoch += 1;
            s.epoch.store(*epoch, Ordering::Release);
        }
        s.wake.notify_all();
        // this thread's share: part 0 and those beyond the helpers
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            job(0);
            for p in helpers + 1..parts {
                job(p);
            }
        }));
        while s.pending.load(Ordering::Acquire) > 0 {
            std::hint::spin_loop();
        }
        unsafe { *s.job.get() = None };
        if let Err(panic) = result {
            std::panic::resume_unwind(panic);
        }
    }
}

fn worker(s: Arc<Shared>, index: usize) {
    let mut seen = 0u64;
    loop {
        let mut idle = Instant::now();
        let mut spins = 0u32;
        loop {
            let epoch = s.epoch.load(Ordering::Acquire);
            if epoch != seen {
                seen = epoch;
                if index < s.parts.load(Ordering::Relaxed) {
                    // SAFETY: see `Shared`.
                    if let Some(job) = unsafe { *s.job.get() } {
                        let job: &Job = unsafe { &*job };
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(index)));
                    }
                    s.pending.fetch_sub(1, Ordering::AcqRel);
                }
                idle = Instant::now();
                continue;
            }
            spins += 1;
            if spins.is_multiple_of(1024) && idle.elapsed() > SPIN {
                break;
            }
            std::hint::spin_loop();
        }
        let mut epoch = s.lock.lock().unwrap_or_else(|e| e.into_inner());
        while *epoch == seen {
            epoch = s.wake.wait(epoch).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// The process's pool, started on first use with `workers` threads (the
/// count of the first call; later calls reuse it).
pub fn global(workers: usize) -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool::start(workers.min(MAX_WORKERS)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_part_runs_once_per_job() {
        let pool = Pool::start(3);
        for parts in [1, 2, 4, 7] {
            let hits: Vec<AtomicU32> = (0..parts).map(|_| AtomicU32::new(0)).collect();
            for _ in 0..50 {
                pool.run(parts, &|p| {
                    hits[p].fetch_add(1, Ordering::Relaxed);
                });
            }
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 50), "parts={parts}");
        }
    }

    #[test]
    fn a_parked_pool_wakes_up() {
        let pool = Pool::start(1);
        std::thread::sleep(SPIN * 3);
        let hits = AtomicU32::new(0);
        pool.run(2, &|_| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 2);
    }
}
