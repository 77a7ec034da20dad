//! Skinny matrix products for a target's verification forward:
//! `out = x · Wᵀ` for a few rows `x` (n, k) against a large weight `W` (m, k).
//!
//! On a CPU a forward over a handful of positions is bound by reading the
//! weights, yet BLAS libraries pack `W` for every such product and take
//! nearly n times as long as for one row. Here a panel of 8 weight rows is
//! read once and multiplied into every row of `x` while it sits in cache, so
//! a product over 4 rows costs little more than one over 1 row.
//!
//! It runs on the calling thread: the products of a small model's forward
//! take 20–300 µs each, and waking a pool's threads for every one of them
//! costs more than the second core gives back (measured in BENCHMARKS.md).
//!
//! Every output entry is summed in the same order whatever n is: 8 lanes of
//! fused multiply-adds over `k` in steps of 8, the lanes added pairwise, then
//! the last `k mod 8` terms. A row's result is therefore bitwise the same
//! alone or in a batch, and on the AVX2 path or the portable one.

use crate::error::SpecError;

/// Lanes per accumulator (one 256-bit vector of f32).
const LANES: usize = 8;
/// Most rows of `x` kept in registers at once.
const X_BLOCK: usize = 4;

/// `out[r, o] = Σ_j x[r, j] · w[o, j]` for row-major `x` (n, k), `w` (m, k)
/// and `out` (n, m).
pub fn linear(x: &[f32], w: &[f32], out: &mut [f32], n: usize, k: usize, m: usize) -> crate::Result<()> {
    if x.len() != n * k || w.len() != m * k || out.len() != n * m {
        return Err(SpecError::Invalid(format!(
            "linear: x has {} entries, w {} and out {}; expected n·k = {}, m·k = {} and n·m = {} \
             for n = {n}, k = {k}, m = {m}",
            x.len(),
            w.len(),
            out.len(),
            n * k,
            m * k,
            n * m
        )));
    }
    // a panel of 8 weight rows is read from memory once and stays in cache
    // while every block of x rows passes over it
    for panel in (0..m).step_by(LANES) {
        let panel_end = (panel + LANES).min(m);
        for r0 in (0..n).step_by(X_BLOCK) {
            let xr = X_BLOCK.min(n - r0);
            let mut o = panel;
            while o < panel_end {
                // 8 accumulators in all: fewer x rows, more weight rows per block
                let ow = (LANES / xr).min(panel_end - o);
                let tile = Tile { k, r0, xr, o, ow };
                for (i, row) in block(x, w, tile).iter().enumerate().take(ow) {
                    for (r, &v) in row.iter().enumerate().take(xr) {
                        out[(r0 + r) * m + o + i] = v;
                    }
                }
                o += ow;
            }
        }
    }
    Ok(())
}

/// One block of the product: weight rows `o..o + ow` against x rows
/// `r0..r0 + xr`, over rows of length `k` (here ow · xr ≤ 8; quant.rs's
/// tiles are larger, and for a block format lie in one panel).
#[derive(Clone, Copy)]
pub(crate) struct Tile {
    pub(crate) k: usize,
    pub(crate) r0: usize,
    pub(crate) xr: usize,
    pub(crate) o: usize,
    pub(crate) ow: usize,
}

impl Tile {
    /// The columns summed in vectors of LANES; the rest are added one by one.
    fn full(self) -> usize {
        self.k - self.k % LANES
    }
}

/// The tile's dot products, as `sums[weight row][x row]`.
fn block(x: &[f32], w: &[f32], t: Tile) -> [[f32; X_BLOCK]; LANES] {
    let mut lanes = [[[0.0f32; LANES]; X_BLOCK]; LANES];
    #[cfg(target_arch = "x86_64")]
    {
        if vector_fma() {
            // SAFETY: the CPU has AVX2 and FMA (checked above); indices are in bounds by construction.
            unsafe { lanes_avx2(x, w, t, &mut lanes) };
        } else {
            lanes_portable(x, w, t, &mut lanes);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    lanes_portable(x, w, t, &mut lanes);
    let (k, full) = (t.k, t.full());
    let mut sums = [[0.0f32; X_BLOCK]; LANES];
    for i in 0..t.ow {
        let wrow = &w[(t.o + i) * k..(t.o + i + 1) * k];
        for r in 0..t.xr {
            let xrow = &x[(t.r0 + r) * k..(t.r0 + r + 1) * k];
            let mut s = reduce(&lanes[i][r]);
            for j in full..k {
                s = wrow[j].mul_add(xrow[j], s);
            }
            sums[i][r] = s;
        }
    }
    sums
}

/// The lanes of an accumulator added pairwise, as a 256-bit horizontal sum does.
#[inline(always)]
fn reduce(l: &[f32; LANES]) -> f32 {
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

/// Whether the AVX2 + FMA path may run (checked once by std, then cached).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn vector_fma() -> bool {
    std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
}

/// Whether this build and CPU run `linear` on the vector path.
#[cfg(not(target_arch = "x86_64"))]
pub fn vector_fma() -> bool {
    false
}

/// The vector lanes of the tile's accumulators, in portable code.
fn lanes_portable(x: &[f32], w: &[f32], t: Tile, lanes: &mut [[[f32; LANES]; X_BLOCK]; LANES]) {
    let k = t.k;
    for j in (0..t.full()).step_by(LANES) {
        for i in 0..t.ow {
            let wv = &w[(t.o + i) * k + j..(t.o + i) * k + j + LANES];
            for r in 0..t.xr {
                let xv = &x[(t.r0 + r) * k + j..(t.r0 + r) * k + j + LANES];
                for l in 0..LANES {
                    lanes[i][r][l] = wv[l].mul_add(xv[l], lanes[i][r][l]);
                }
            }
        }
    }
}

/// `lanes_portable` in AVX2 registers: `ow · xr ≤ 8` accumulators, each
/// weight vector loaded once per step and each x vector once per step.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn lanes_avx2(x: &[f32], w: &[f32], t: Tile, lanes: &mut [[[f32; LANES]; X_BLOCK]; LANES]) {
    match (t.ow, t.xr) {
        (8, 1) => avx2_block::<8, 1>(x, w, t, lanes),
        (4, 2) => avx2_block::<4, 2>(x, w, t, lanes),
        (2, 3) => avx2_block::<2, 3>(x, w, t, lanes),
        (2, 4) => avx2_block::<2, 4>(x, w, t, lanes),
        _ => {
            // the last weight rows of a panel, one at a time
            for (i, slot) in lanes.iter_mut().enumerate().take(t.ow) {
                let row = Tile { o: t.o + i, ow: 1, ..t };
                let mut part = [[[0.0f32; LANES]; X_BLOCK]; LANES];
                match t.xr {
                    1 => avx2_block::<1, 1>(x, w, row, &mut part),
                    2 => avx2_block::<1, 2>(x, w, row, &mut part),
                    3 => avx2_block::<1, 3>(x, w, row, &mut part),
                    _ => avx2_block::<1, 4>(x, w, row, &mut part),
                }
                *slot = part[0];
            }
        }
    }
}

/// `OW` weight rows times `XR` x rows, with the accumulators in registers
/// (index loops over the const bounds, which the compiler unrolls).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::needless_range_loop)]
unsafe fn avx2_block<const OW: usize, const XR: usize>(
    x: &[f32],
    w: &[f32],
    t: Tile,
    lanes: &mut [[[f32; LANES]; X_BLOCK]; LANES],
) {
    use std::arch::x86_64 as v;
    let (k, full, r0, o) = (t.k, t.full(), t.r0, t.o);
    debug_assert!((o + OW) * k <= w.len() && (r0 + XR) * k <= x.len());
    let mut acc = [[v::_mm256_setzero_ps(); XR]; OW];
    let wp = w.as_ptr().add(o * k);
    let xp = x.as_ptr().add(r0 * k);
    let mut j = 0;
    while j < full {
        let mut wv = [v::_mm256_setzero_ps(); OW];
        for (i, slot) in wv.iter_mut().enumerate() {
            *slot = v::_mm256_loadu_ps(wp.add(i * k + j));
        }
        for r in 0..XR {
            let xv = v::_mm256_loadu_ps(xp.add(r * k + j));
            for i in 0..OW {
                acc[i][r] = v::_mm256_fmadd_ps(wv[i], xv, acc[i][r]);
            }
        }
        j += LANES;
    }
    for i in 0..OW {
        for r in 0..XR {
            v::_mm256_storeu_ps(lanes[i][r].as_mut_ptr(), acc[i][r]);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A fixed, irregular sequence of `len` values (also the quant.rs tests' inputs).
    pub(crate) fn data(len: usize, seed: u32) -> Vec<f32> {
        // a fixed, irregular sequence with mixed signs and magnitudes
        (0..len)
            .map(|i| {
                let h = (i as u32)
                    .wrapping_mul(2_654_435_761)
                    .wrapping_add(seed.wrapping_mul(40_503));
                ((h >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * (1.0 + (h % 7) as f32)
            })
            .collect()
    }

    /// The documented order, written out plainly.
    fn reference(x: &[f32], w: &[f32], n: usize, k: usize, m: usize) -> Vec<f32> {
        let full = k - k % LANES;
        let mut out = vec![0.0f32; n * m];
        for r in 0..n {
            for o in 0..m {
                let mut l = [0.0f32; LANES];
                for j in (0..full).step_by(LANES) {
                    for (lane, acc) in l.iter_mut().enumerate() {
                        *acc = w[o * k + j + lane].mul_add(x[r * k + j + lane], *acc);
                    }
                }
                let mut s = reduce(&l);
                for j in full..k {
                    s = w[o * k + j].mul_add(x[r * k + j], s);
                }
                out[r * m + o] = s;
            }
        }
        out
    }

    #[test]
    fn equals_the_documented_order_bitwise_for_every_shape() {
        for &(n, k, m) in &[
            (1, 1, 1),
            (1, 8, 3),
            (2, 7, 5),
            (3, 17, 9),
            (4, 64, 130),
            (5, 576, 193),
            (9, 33, 67),
            (16, 40, 64),
        ] {
            let (x, w) = (data(n * k, 1), data(m * k, 2));
            let mut out = vec![f32::NAN; n * m];
            linear(&x, &w, &mut out, n, k, m).unwrap();
            let want = reference(&x, &w, n, k, m);
            assert!(
                out.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                "n={n} k={k} m={m}"
            );
        }
    }

    #[test]
    fn a_row_gives_the_same_bits_alone_or_in_a_batch() {
        let (n, k, m) = (7, 100, 70);
        let (x, w) = (data(n * k, 3), data(m * k, 4));
        let mut all = vec![0.0f32; n * m];
        linear(&x, &w, &mut all, n, k, m).unwrap();
        for r in 0..n {
            let mut one = vec![0.0f32; m];
            linear(&x[r * k..(r + 1) * k], &w, &mut one, 1, k, m).unwrap();
            assert_eq!(
                one.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                all[r * m..(r + 1) * m].iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn the_portable_path_equals_the_vector_one_bitwise() {
        let (k, m) = (45, 16);
        let (x, w) = (data(4 * k, 5), data(m * k, 6));
        let full = k - k % LANES;
        for xr in 1..=4 {
            for ow in 1..=(LANES / xr) {
                let mut a = [[[0.0f32; LANES]; X_BLOCK]; LANES];
                let t = Tile { k, r0: 0, xr, o: 3, ow };
                lanes_portable(&x, &w, t, &mut a);
                let b = block(&x, &w, t);
                for i in 0..ow {
                    for r in 0..xr {
                        let mut s = reduce(&a[i][r]);
                        for j in full..k {
                            s = w[(3 + i) * k + j].mul_add(x[r * k + j], s);
                        }
                        assert_eq!(s.to_bits(), b[i][r].to_bits(), "xr={xr} ow={ow} i={i} r={r}");
                    }
                }
            }
        }
    }

    #[test]
    fn wrong_lengths_are_an_error() {
        let mut out = vec![0.0f32; 4];
        assert!(linear(&[0.0; 6], &[0.0; 6], &mut out, 2, 3, 2).is_ok());
        assert!(linear(&[0.0; 5], &[0.0; 6], &mut out, 2, 3, 2).is_err());
        assert!(linear(&[0.0; 6], &[0.0; 6], &mut out, 2, 3, 3).is_err());
    }
}
