//! The q8 products streamed from memory with the weights on 4 KiB pages
//! (each its own allocation, as packed) against the same bytes copied end to
//! end into one 2 MiB-aligned buffer advised `MADV_HUGEPAGE` (what
//! `gguf/arena.py` does at load): SmolLM2's four Q4_1 shapes, 40 copies
//! (about 52 MB), 2 threads, n = 1, 5, 9 x rows, the two placements
//! alternated 21 times, medians. `HUGE=0`: the buffer without the advice (a
//! control for the copy's order alone). Prints the huge pages the process holds.
//!
//!     cargo run --release --example stream_bench
//!     HUGE=0 cargo run --release --example stream_bench
use _core::quant::{best_path, pack, qlinear, Act, QType};
use std::time::Instant;

extern "C" {
    fn madvise(addr: *mut std::ffi::c_void, len: usize, advice: i32) -> i32;
}

fn weight(m: usize, k: usize, seed: u64) -> Vec<u8> {
    let q = QType::Q4_1;
    let (bs, bb) = q.block();
    let nbytes = m * k / bs * bb;
    let mut s = seed;
    let mut w: Vec<u8> = (0..nbytes)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (s >> 33) as u8
        })
        .collect();
    for blk in 0..nbytes / bb {
        for sidx in 0..2 {
            w[blk * bb + 2 * sidx] = (blk as u8) & 0x3f;
            w[blk * bb + 2 * sidx + 1] = 0x2c;
        }
    }
    pack(&w, q, m, k).unwrap()
}

fn main() {
    let shapes = [(576usize, 576usize), (192, 576), (1536, 576), (576, 1536)];
    let copies = 40;
    let mut sep: Vec<(Vec<u8>, usize, usize)> = Vec::new();
    for c in 0..copies {
        for &(m, k) in &shapes {
            sep.push((weight(m, k, c as u64 * 7 + m as u64), m, k));
        }
    }
    let total: usize = sep.iter().map(|w| w.0.len()).sum();
    let align = 2 << 20;
    let size = total.div_ceil(align) * align + align;
    let layout = std::alloc::Layout::from_size_align(size, align).unwrap();
    let arena = unsafe { std::alloc::alloc(layout) };
    let huge = std::env::var("HUGE").map(|v| v == "1").unwrap_or(true);
    if huge {
        // SAFETY: the range is this process's allocation of `size` bytes; 14 = MADV_HUGEPAGE
        unsafe { assert_eq!(madvise(arena as *mut _, size, 14), 0) };
    }
    let mut offs = Vec::new();
    let mut at = 0;
    for w in &sep {
        unsafe { std::ptr::copy_nonoverlapping(w.0.as_ptr(), arena.add(at), w.0.len()) };
        offs.push(at);
        at += w.0.len().div_ceil(64) * 64;
    }
    println!(
        "total {} MB; AnonHugePages: {}",
        total >> 20,
        std::fs::read_to_string("/proc/self/smaps_rollup")
            .unwrap()
            .lines()
            .find(|l| l.starts_with("AnonHugePages"))
            .unwrap()
    );
    let path = best_path();
    for n in [1usize, 5, 9] {
        let x: Vec<f32> = (0..n * 1536).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        let mut out = vec![0.0f32; n * 1536];
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for rep in 0..21 {
            for which in [rep % 2, 1 - rep % 2] {
                let t = Instant::now();
                for (i, w) in sep.iter().enumerate() {
                    let (m, k) = (w.1, w.2);
                    let p: &[u8] = if which == 0 {
                        &w.0
                    } else {
                        unsafe { std::slice::from_raw_parts(arena.add(offs[i]), w.0.len()) }
                    };
                    qlinear(
                        &x[..n * k],
                        p,
                        QType::Q4_1,
                        &mut out[..n * m],
                        n,
                        k,
                        m,
                        2,
                        path,
                        Act::Q8,
                    )
                    .unwrap();
                }
                let e = t.elapsed().as_secs_f64() * 1e3;
                if which == 0 {
                    a.push(e)
                } else {
                    b.push(e)
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(3));
        }
        a.sort_by(|x, y| x.partial_cmp(y).unwrap());
        b.sort_by(|x, y| x.partial_cmp(y).unwrap());
        println!(
            "n={n}: 4K pages {:.2} ms, arena {:.2} ms, arena/4K {:.3}",
            a[10],
            b[10],
            b[10] / a[10]
        );
    }
}
