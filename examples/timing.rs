use std::time::Instant;
use _core::prob::{check_row, sample_residual};
use _core::Loc;
fn main() {
    let v = 49152;
    let mut p = vec![0f32; v]; let mut q = vec![0f32; v];
    for i in 0..v { p[i] = ((i * 7919) % 1000) as f32 + 1.0; q[i] = ((i * 104729) % 1000) as f32 + 1.0; }
    let (sp, sq): (f32, f32) = (p.iter().sum(), q.iter().sum());
    p.iter_mut().for_each(|x| *x /= sp); q.iter_mut().for_each(|x| *x /= sq);
    let l = Loc::new("p", None, 0);
    let n = 2000;
    let t = Instant::now(); let mut z=0.0; for _ in 0..n { z += sum_only(std::hint::black_box(&p)); } println!("warm sum_only {:.2} us {}", t.elapsed().as_secs_f64() / n as f64 * 1e6, z);
    let t = Instant::now();
    for _ in 0..n { check_row(std::hint::black_box(&p), l).unwrap(); }
    println!("check_row {:.2} us", t.elapsed().as_secs_f64() / n as f64 * 1e6);
    let t = Instant::now();
    let mut s = 0;
    for i in 0..n { s += sample_residual(std::hint::black_box(&p), &q, i as f64 / n as f64, l, l).unwrap(); }
    let t = Instant::now(); let mut z=0.0; for _ in 0..n { z += sum_only(std::hint::black_box(&p)); } println!("sum_only {:.2} us {}", t.elapsed().as_secs_f64() / n as f64 * 1e6, z);
    let t = Instant::now(); let mut z=0.0; for _ in 0..n { z += sum_ok(std::hint::black_box(&p)).0; } println!("sum_ok {:.2} us {}", t.elapsed().as_secs_f64() / n as f64 * 1e6, z);
    let t = Instant::now(); let mut z=0.0; for _ in 0..n { z += min_max(std::hint::black_box(&p)).0; } println!("min_max {:.2} us {}", t.elapsed().as_secs_f64() / n as f64 * 1e6, z);
    println!("residual {:.2} us {}", t.elapsed().as_secs_f64() / n as f64 * 1e6, s);
}
#[inline(never)]
pub fn sum_only(row: &[f32]) -> f64 {
    let mut acc = [0.0f64; 8];
    for c in row.chunks_exact(8) { for l in 0..8 { acc[l] += c[l] as f64; } }
    acc.iter().sum()
}
#[inline(never)]
pub fn sum_ok(row: &[f32]) -> (f64, bool) {
    let mut acc = [0.0f64; 8];
    let mut bad = [0u8; 8];
    for c in row.chunks_exact(8) { for l in 0..8 { let x = c[l] as f64; acc[l] += x; bad[l] |= (!(x >= 0.0 && x < f64::INFINITY)) as u8; } }
    (acc.iter().sum(), bad.iter().all(|&b| b == 0))
}
#[inline(never)]
pub fn min_max(row: &[f32]) -> (f64, f32, f32) {
    let mut acc = [0.0f64; 8];
    let mut mn = [f32::INFINITY; 8]; let mut mx = [0f32; 8];
    for c in row.chunks_exact(8) { for l in 0..8 { let x = c[l]; acc[l] += x as f64; mn[l] = mn[l].min(x); mx[l] = mx[l].max(x);} }
    (acc.iter().sum(), mn.iter().cloned().fold(f32::INFINITY, f32::min), mx.iter().cloned().fold(0.0, f32::max))
}
