//! The q8 tiles alone: one packed weight of SmolLM2's MLP shape (1536 × 576,
//! about 0.5 MB, so it stays in L2) through `quant::qlinear` on one thread,
//! n x rows, the best of REPS calls; printed as microseconds a call and
//! cycles per 16-row block and x row at a nominal 2.96 GHz (the Intel
//! host's; the figure compares builds and shapes, not hosts).
//!
//!     cargo run --release --example tile_bench -- [FORMAT] [NS] [REPS] [avx512]
//!     cargo run --release --example tile_bench -- q4_1 1,5,9,17 2000
//!     cargo run --release --example tile_bench -- q8_0 5 2000 avx512
//!
//! FORMAT: q4_1 (default), q4_0 or q8_0; NS: x row counts (default
//! 1,2,3,4,5,8,9,16,17); "avx512": the AVX-512 path without VNNI instead of
//! the host's best. The weight's scales are small normal float16 values
//! (no subnormal operands), its codes pseudo-random.

use _core::quant::{best_path, pack, path_available, qlinear, Act, Path, QType};
use std::time::Instant;

fn main() {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let q = match raw.first().map(String::as_str).unwrap_or("q4_1") {
        "q8_0" => QType::Q8_0,
        "q4_0" => QType::Q4_0,
        "q4_1" => QType::Q4_1,
        other => panic!("FORMAT: q4_1, q4_0 or q8_0, not {other}"),
    };
    let ns: Vec<usize> = raw.get(1).map_or(vec![1, 2, 3, 4, 5, 8, 9, 16, 17], |s| {
        s.split(',')
            .map(|v| v.parse().expect("NS: x row counts, e.g. 1,5,9"))
            .collect()
    });
    let reps: usize = raw.get(2).map_or(2000, |s| s.parse().expect("REPS: a count"));
    let path = match raw.get(3).map(String::as_str) {
        Some("avx512") => Path::Avx512,
        _ => best_path(),
    };
    assert!(path_available(path), "this host lacks the {path:?} path");
    let (m, k) = (1536usize, 576usize);
    let (per_block, block_bytes) = q.block();
    let bytes = m * k / per_block * block_bytes;
    let mut state = 12345u64;
    let mut w: Vec<u8> = (0..bytes)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as u8
        })
        .collect();
    // every block's float16 scale (and Q4_1's min) about 2^-4: normal, finite
    let scales = if q == QType::Q4_1 { 2 } else { 1 };
    for blk in 0..bytes / block_bytes {
        for s in 0..scales {
            w[blk * block_bytes + 2 * s] = (blk as u8) & 0x3f;
            w[blk * block_bytes + 2 * s + 1] = 0x2c;
        }
    }
    let packed = pack(&w, q, m, k).expect("a packable weight");
    for n in ns {
        let x: Vec<f32> = (0..n * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        let mut out = vec![0.0f32; n * m];
        let mut best = f64::MAX;
        for _ in 0..reps {
            let t = Instant::now();
            qlinear(&x, &packed, q, &mut out, n, k, m, 1, path, Act::Q8).expect("the product");
            best = best.min(t.elapsed().as_secs_f64());
        }
        let units = (m / 16 * k / 32 * n) as f64;
        println!(
            "{q:?} {path:?} n={n:2} {:7.2} us {:5.2} cycles a block and row (checksum {})",
            best * 1e6,
            best * 2.96e9 / units,
            out.iter().sum::<f32>()
        );
    }
}
