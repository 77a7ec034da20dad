//! The attention kernel alone over SmolLM2-135M's 30 layers (9 query heads,
//! 3 key-value heads of 64): n new positions after `past` cached ones, the
//! best of 20 runs (`ATTN_RUNS`: another count).
//!
//!     cargo run --release --example attn_bench -- PAST N THREADS [PATH] [CACHE] [cold] [q8]
//!     cargo run --release --example attn_bench -- 2048 1 2
//!     cargo run --release --example attn_bench -- 2048 1 2 Avx2
//!     cargo run --release --example attn_bench -- 2048 1 2 best f16
//!
//! PATH names an instruction path (`quant::Path`, as Debug prints it;
//! "best" or none: the host's best); CACHE the stored type, f32 (default),
//! f16 or q8_0; "q8": q8 activations (with a q8_0 cache, the scores by
//! integer block products); "cold": each run reads another copy of the caches, so that none
//! is in the last-level cache (as in a forward, where the weights stream
//! between the layers' attention), else the same copy (warm where it fits).

use _core::attention::attention;
use _core::kv::Kv;
use _core::llama::{Cache, Segment, Shape};
use _core::quant::{best_path, path_available, Act, Path};
use std::time::Instant;

fn main() {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<usize> = raw.iter().take(3).map(|a| a.parse().expect("PAST N THREADS")).collect();
    let path = match raw.get(3).map(String::as_str) {
        None | Some("best") => best_path(),
        Some(name) => Path::all()
            .into_iter()
            .find(|p| format!("{p:?}") == name && path_available(*p))
            .expect("a path this host has"),
    };
    let (past, n, threads) = (args[0], args[1], args[2]);
    // "q8": the activations' mode (a q8_0 cache's scores by integer block products)
    let act = if raw.iter().any(|a| a == "q8") {
        Act::Q8
    } else {
        Act::F32
    };
    let layers = 30;
    let s = Shape::llama(576, 9, 3, 64, 1536, 1e-5);
    let d = 64;
    let cap = past + n + 16;
    let bytes = 2 * layers * 3 * cap * d * 4;
    let copies = if raw.get(5).is_some_and(|c| c == "cold") {
        (1usize << 30).div_ceil(bytes).max(2)
    } else {
        1
    };
    let mut ks: Vec<Vec<f32>> = (0..layers * copies)
        .map(|l| (0..3 * cap * d).map(|i| ((i * 7 + l) % 13) as f32 * 0.01).collect())
        .collect();
    let mut vs = ks.clone();
    let cache = raw.get(4).map_or("f32", String::as_str);
    let halves = |xs: &[Vec<f32>]| -> Vec<Vec<half::f16>> {
        xs.iter()
            .map(|x| x.iter().map(|&v| half::f16::from_f32(v)).collect())
            .collect()
    };
    let (mut kh, mut vh) = if cache == "f16" {
        (halves(&ks), halves(&vs))
    } else {
        (Vec::new(), Vec::new())
    };
    // q8_0 rows, written as a layer writes them
    let q8s = |xs: &[Vec<f32>]| -> Vec<Vec<u8>> {
        xs.iter()
            .map(|x| {
                let rows = x.len() / d;
                let (mut k, mut spare) = (vec![0u8; rows * d / 32 * 34], vec![0u8; rows * d / 32 * 34]);
                let mut kv = Kv::Q8 {
                    keys: &mut k,
                    values: &mut spare,
                };
                for r in 0..rows {
                    kv.write(r, &x[r * d..(r + 1) * d], &x[r * d..(r + 1) * d]);
                }
                k
            })
            .collect()
    };
    let (mut kq, mut vq) = if cache == "q8_0" {
        (q8s(&ks), q8s(&vs))
    } else {
        (Vec::new(), Vec::new())
    };
    let row = (9 + 6) * d;
    let qkv: Vec<f32> = (0..n * row).map(|i| (i % 17) as f32 * 0.01).collect();
    let mut out = vec![0.0f32; n * 9 * d];
    let mut best = f64::MAX;
    // ATTN_RUNS: more runs (a profile of the kernel alone, past the setup)
    let runs: usize = std::env::var("ATTN_RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(20);
    for run in 0..runs {
        let t = Instant::now();
        for l in (run % copies) * layers..(run % copies + 1) * layers {
            let kv = match cache {
                "f16" => Kv::F16 {
                    keys: &mut kh[l],
                    values: &mut vh[l],
                },
                "q8_0" => Kv::Q8 {
                    keys: &mut kq[l],
                    values: &mut vq[l],
                },
                _ => Kv::F32 {
                    keys: &mut ks[l],
                    values: &mut vs[l],
                },
            };
            let segs = [Segment {
                n,
                cache: Cache {
                    kv,
                    capacity: cap,
                    past,
                },
                mask: None,
            }];
            attention(&qkv, &mut out, &segs, s, threads, path, act);
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!(
        "past {past} n {n} threads {threads} {path:?} {} {}: {:.3} ms (30 layers)",
        cache,
        act.name(),
        best * 1e3
    );
}
