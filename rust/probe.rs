//! Measurements for the benchmarks' rooflines and breakdowns: the phases of
//! the Llama layer (`llama.rs` adds each phase's nanoseconds while
//! profiling is on; off, it costs one relaxed load a phase), the host's
//! read bandwidth and its fused multiply-add peak.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// The layer's phases, in the order `llama::layer` runs them.
pub const PHASES: [&str; 8] = [
    "norms",
    "qkv products",
    "rope and cache writes",
    "attention",
    "o product",
    "gate_up product",
    "activation",
    "down product",
];

static ON: AtomicBool = AtomicBool::new(false);
static NANOS: [AtomicU64; 8] = [const { AtomicU64::new(0) }; 8];

/// Start (or stop) adding phase times, from zero.
pub fn profile(on: bool) {
    for n in &NANOS {
        n.store(0, Ordering::Relaxed);
    }
    ON.store(on, Ordering::Relaxed);
}

/// Seconds spent in each phase since `profile(true)`.
pub fn totals() -> Vec<(&'static str, f64)> {
    PHASES
        .iter()
        .zip(&NANOS)
        .map(|(p, n)| (*p, n.load(Ordering::Relaxed) as f64 * 1e-9))
        .collect()
}

/// A phase timer: `lap(i)` adds the time since the last lap to phase i.
pub struct Laps(Option<Instant>);

impl Laps {
    pub fn start() -> Laps {
        Laps(ON.load(Ordering::Relaxed).then(Instant::now))
    }

    #[inline]
    pub fn lap(&mut self, phase: usize) {
        if let Some(t) = self.0 {
            let now = Instant::now();
            NANOS[phase].fetch_add((now - t).as_nanos() as u64, Ordering::Relaxed);
            self.0 = Some(now);
        }
    }
}

/// Bytes per second read by `threads` threads summing `bytes` of memory
/// (the best of `repeats` passes, after one that faults the pages in).
pub fn read_bandwidth(bytes: usize, threads: usize, repeats: usize) -> f64 {
    let words = (bytes / 8).max(threads);
    let data: Vec<u64> = (0..words as u64).collect();
    let chunk = words.div_ceil(threads);
    let mut best = f64::INFINITY;
    for _ in 0..repeats + 1 {
        let t = Instant::now();
        std::thread::scope(|s| {
            for part in data.chunks(chunk) {
                s.spawn(move || std::hint::black_box(part.iter().fold(0u64, |a, &b| a.wrapping_add(b))));
            }
        });
        best = best.min(t.elapsed().as_secs_f64());
    }
    (words * 8) as f64 / best
}

/// Float32 fused multiply-adds per second on `threads` threads, by the
/// widest vectors this CPU has (16 independent chains each).
pub fn fma_peak(threads: usize) -> f64 {
    let iters = 20_000_000u64;
    let t = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(move || std::hint::black_box(fma_chains(iters)));
        }
    });
    (iters * 16 * lanes() as u64 * threads as u64) as f64 / t.elapsed().as_secs_f64()
}

fn lanes() -> usize {
    match crate::quant::best_path() {
        p if p.avx512() => 16,
        crate::quant::Path::Portable => 1,
        _ => 8,
    }
}

fn fma_chains(iters: u64) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        let p = crate::quant::best_path();
        if p.avx512() {
            // SAFETY: the CPU has AVX-512 (best_path checked it).
            return unsafe { chains_avx512(iters) };
        }
        if p.vector() {
            // SAFETY: as above, AVX2 and FMA.
            return unsafe { chains_avx2(iters) };
        }
    }
    let mut a = [1.0f32; 16];
    for _ in 0..iters {
        for v in a.iter_mut() {
            *v = v.mul_add(1.000_000_1, 1e-7);
        }
    }
    a.iter().sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn chains_avx512(iters: u64) -> f32 {
    use std::arch::x86_64 as v;
    let (b, c) = (v::_mm512_set1_ps(1.000_000_1), v::_mm512_set1_ps(1e-7));
    let mut a = [v::_mm512_set1_ps(1.0); 16];
    for _ in 0..iters {
        for x in a.iter_mut() {
            *x = v::_mm512_fmadd_ps(*x, b, c);
        }
    }
    a.iter().map(|x| v::_mm512_reduce_add_ps(*x)).sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn chains_avx2(iters: u64) -> f32 {
    use std::arch::x86_64 as v;
    let (b, c) = (v::_mm256_set1_ps(1.000_000_1), v::_mm256_set1_ps(1e-7));
    let mut a = [v::_mm256_set1_ps(1.0); 16];
    for _ in 0..iters {
        for x in a.iter_mut() {
            *x = v::_mm256_fmadd_ps(*x, b, c);
        }
    }
    let mut out = [0.0f32; 8];
    let mut total = 0.0;
    for x in a {
        v::_mm256_storeu_ps(out.as_mut_ptr(), x);
        total += out.iter().sum::<f32>();
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_add_up_only_while_on() {
        profile(false);
        let mut laps = Laps::start();
        laps.lap(0);
        assert!(totals().iter().all(|(_, s)| *s == 0.0));
        profile(true);
        let mut laps = Laps::start();
        std::thread::sleep(std::time::Duration::from_millis(2));
        laps.lap(3);
        assert!(totals()[3].1 >= 0.002);
        profile(false);
        assert!(read_bandwidth(1 << 20, 2, 1) > 0.0 && fma_peak(1) > 0.0);
    }
}
