//! The row-wise steps of a decoder layer (RMSNorm, SiLU·up), each in one
//! fixed order per row, written lane-wise and compiled for AVX-512, AVX2
//! and portable code alike (the same float32 operations on every path,
//! never contracted into fused ones unless written so):
//! - RMSNorm: Σ x_j² in 16 lanes (lane j mod 16, in order), the lanes added
//!   pairwise; inv = 1 / sqrt(Σ / h + eps); out_j = w_j · (x_j · inv).
//! - SiLU·up: g / (1 + exp(−g)) · u, with `exp` below.
//! - GELU·up (the tanh form, Gemma's): 0.5·g·(1 + tanh(z/2)) = g / (1 +
//!   exp(−z)), z = g · (2√(2/π) + 2√(2/π)·0.044715 · g²), then · u.

// Index loops over lanes, rows and panels read like the order they document.
#![allow(clippy::needless_range_loop)]

use crate::quant::Path;

/// exp(x): 0 below −87.3 (past the smallest normal), +∞ above 88 (a
/// little before float32 overflows), else 2ⁿ · p(r) with n = round(x·log₂e),
/// r = x − n·ln2 (in two parts) and Cephes' degree-6 polynomial.
///
/// Written without branches (the polynomial of x clamped to the range, then
/// the saturated values selected), so a loop of it vectorizes: a row's
/// SiLU·up runs 16 lanes at a time on AVX-512, with the bits of one lane at
/// a time (the clamp changes no value inside the range).
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 · 2^23: adding it rounds to an integer
    let inside = x.clamp(-87.3, 88.0); // NaN stays NaN
    let t = inside.mul_add(std::f32::consts::LOG2_E, MAGIC);
    let n = t - MAGIC;
    let r = (-n).mul_add(0.693_359_4, inside);
    let r = (-n).mul_add(-2.121_944_4e-4, r);
    let mut p = 1.987_569_1e-4f32;
    for c in [1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5] {
        p = p.mul_add(r, c);
    }
    let p = (p * r).mul_add(r, r) + 1.0;
    // 2ⁿ: t's low mantissa bits hold n (t = n + MAGIC exactly), so its bits
    // minus MAGIC's are n, an integer operation a vector loop keeps
    let n_bits = (t.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
    let y = p * f32::from_bits((n_bits.wrapping_add(127) << 23) as u32);
    let y = if x > 88.0 { f32::INFINITY } else { y };
    if x < -87.3 {
        0.0
    } else {
        y
    }
}

#[inline(always)]
fn rms_norm_body(x: &[f32], w: &[f32], eps: f32, out: &mut [f32], h: usize) {
    for (row, dst) in x.chunks_exact(h).zip(out.chunks_exact_mut(h)) {
        let mut lanes = [0.0f32; 16];
        let full = h - h % 16;
        for c in row[..full].chunks_exact(16) {
            for l in 0..16 {
                lanes[l] = c[l].mul_add(c[l], lanes[l]);
            }
        }
        for (l, &v) in row[full..].iter().enumerate() {
            lanes[l] = v.mul_add(v, lanes[l]);
        }
        let mut width = 16;
        while width > 1 {
            width /= 2;
            for l in 0..width {
                lanes[l] += lanes[l + width];
            }
        }
        let inv = 1.0 / (lanes[0] / h as f32 + eps).sqrt();
        for j in 0..h {
            dst[j] = w[j] * (row[j] * inv);
        }
    }
}

#[inline(always)]
fn silu_mul_body(gu: &[f32], out: &mut [f32], inter: usize) {
    for (pair, dst) in gu.chunks_exact(2 * inter).zip(out.chunks_exact_mut(inter)) {
        let (gate, up) = pair.split_at(inter);
        for ((out, &g), &u) in dst.iter_mut().zip(gate).zip(up) {
            *out = g / (1.0 + exp(-g)) * u;
        }
    }
}

/// 2√(2/π) and 2√(2/π)·0.044715: GELU's tanh form as a sigmoid.
const GELU_Z: (f32, f32) = (1.595_769_2, 0.071_354_814);

#[inline(always)]
fn gelu_mul_body(gu: &[f32], out: &mut [f32], inter: usize) {
    for (pair, dst) in gu.chunks_exact(2 * inter).zip(out.chunks_exact_mut(inter)) {
        let (gate, up) = pair.split_at(inter);
        for ((out, &g), &u) in dst.iter_mut().zip(gate).zip(up) {
            let z = g * GELU_Z.1.mul_add(g * g, GELU_Z.0);
            *out = g / (1.0 + exp(-z)) * u;
        }
    }
}

/// The constrained target's logits (`structured.masked_logits`): row r of
/// `out` (`vocab` values a row) is the first `vocab` logits of row r of
/// `logits` (`width` ≥ `vocab` a row), with the ids that row r of `allowed`
/// (`vocab` flags a row, for the first `allowed.len() / vocab` rows) refuses
/// at −∞; the rows after them are copied as they are. A select, no
/// arithmetic: the same bits on every path.
#[cfg_attr(not(feature = "python"), allow(dead_code))]
fn mask_logits_body(logits: &[f32], width: usize, allowed: &[bool], out: &mut [f32], vocab: usize) {
    let masked = allowed.len() / vocab.max(1);
    for (r, dst) in out.chunks_exact_mut(vocab).enumerate() {
        let src = &logits[r * width..r * width + vocab];
        if r < masked {
            let flags = &allowed[r * vocab..(r + 1) * vocab];
            for ((o, &x), &a) in dst.iter_mut().zip(src).zip(flags) {
                *o = if a { x } else { f32::NEG_INFINITY };
            }
        } else {
            dst.copy_from_slice(src);
        }
    }
}

macro_rules! per_path {
    ($(#[$attr:meta])* $name:ident, $body:ident, ($($arg:ident: $ty:ty),*)) => {
        /// See the module docs; the same bits on every path.
        $(#[$attr])*
        pub(crate) fn $name(path: Path, $($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
                unsafe fn wide($($arg: $ty),*) { $body($($arg),*) }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn narrow($($arg: $ty),*) { $body($($arg),*) }
                if path.avx512() {
                    // SAFETY: the path's features are present (callers pass an available path).
                    return unsafe { wide($($arg),*) };
                }
                if path.vector() {
                    // SAFETY: as above.
                    return unsafe { narrow($($arg),*) };
                }
            }
            let _ = path;
            $body($($arg),*)
        }
    };
}

per_path!(rms_norm, rms_norm_body, (x: &[f32], w: &[f32], eps: f32, out: &mut [f32], h: usize));
per_path!(silu_mul, silu_mul_body, (gu: &[f32], out: &mut [f32], inter: usize));
per_path!(gelu_mul, gelu_mul_body, (gu: &[f32], out: &mut [f32], inter: usize));
per_path!(
    #[cfg_attr(not(feature = "python"), allow(dead_code))] // the Python boundary's (`_core.masked_logits`)
    mask_logits,
    mask_logits_body,
    (logits: &[f32], width: usize, allowed: &[bool], out: &mut [f32], vocab: usize)
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::path_available;

    /// `exp` as it was written before it lost its branches.
    fn branchy_exp(x: f32) -> f32 {
        if x < -87.3 {
            return 0.0;
        }
        if x > 88.0 {
            return f32::INFINITY;
        }
        const MAGIC: f32 = 12_582_912.0;
        let t = x.mul_add(std::f32::consts::LOG2_E, MAGIC);
        let n = t - MAGIC;
        let r = (-n).mul_add(0.693_359_4, x);
        let r = (-n).mul_add(-2.121_944_4e-4, r);
        let mut p = 1.987_569_1e-4f32;
        for c in [1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5] {
            p = p.mul_add(r, c);
        }
        let p = (p * r).mul_add(r, r) + 1.0;
        p * f32::from_bits((((n as i32) + 127) << 23) as u32)
    }

    /// The branchless `exp` keeps the bits of the branchy one everywhere
    /// (every 97th float32 from −∞ to +∞, both saturation edges, NaN).
    #[test]
    fn exp_keeps_its_bits_without_branches() {
        let mut bits = 0u32;
        loop {
            for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
                let (got, want) = (exp(x), branchy_exp(x));
                assert!(
                    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                    "{x}: {got} vs {want}"
                );
            }
            match bits.checked_add(97) {
                Some(b) if b < 0x7f80_0001 => bits = b,
                _ => break,
            }
        }
        for x in [-87.3f32, 88.0, -87.299995, 87.99999, f32::INFINITY, f32::NEG_INFINITY] {
            assert_eq!(exp(x).to_bits(), branchy_exp(x).to_bits(), "{x}");
        }
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn exp_is_accurate_and_saturates() {
        let mut x = -87.0f32;
        while x < 88.0 {
            let (got, want) = (exp(x) as f64, (x as f64).exp());
            assert!(((got - want) / want).abs() < 3e-7, "{x}: {got} vs {want}");
            x += 0.0173;
        }
        assert_eq!((exp(0.0), exp(-100.0), exp(100.0)), (1.0, 0.0, f32::INFINITY));
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
    }

    /// GELU·up against the tanh form in float64 (torch's `gelu(approximate="tanh")`).
    #[test]
    fn gelu_is_the_tanh_form() {
        let gate: Vec<f32> = (0..400).map(|i| (i as f32 - 200.0) * 0.05).collect();
        let mut gu = gate.clone();
        gu.extend(std::iter::repeat_n(1.0f32, gate.len()));
        let mut out = vec![0.0f32; gate.len()];
        gelu_mul(Path::Portable, &gu, &mut out, gate.len());
        for (g, got) in gate.iter().zip(&out) {
            let g = *g as f64;
            let want = 0.5 * g * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g.powi(3))).tanh());
            assert!(
                (*got as f64 - want).abs() <= 2e-7 * want.abs().max(1.0),
                "{g}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn every_path_gives_the_same_bits() {
        let (h, rows) = (100, 5);
        let x: Vec<f32> = (0..h * rows).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.37).collect();
        let w: Vec<f32> = (0..h).map(|i| 0.5 + (i % 7) as f32 * 0.1).collect();
        let paths: Vec<Path> = Path::all().into_iter().filter(|p| path_available(*p)).collect();
        let run = |p: Path| {
            let (mut a, mut b) = (vec![0.0f32; h * rows], vec![0.0f32; h / 2 * rows]);
            let mut c = b.clone();
            rms_norm(p, &x, &w, 1e-5, &mut a, h);
            silu_mul(p, &x, &mut b, h / 2);
            gelu_mul(p, &x, &mut c, h / 2);
            let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            (bits(&a), bits(&b), bits(&c))
        };
        let want = run(Path::Portable);
        for p in paths {
            assert_eq!(run(p), want, "{p:?}");
        }
    }

    /// Masked logits: refused ids at −∞ in the masked rows (whatever was
    /// there, NaN included), allowed ids and later rows bit for bit, the
    /// padding past `vocab` dropped; on every path.
    #[test]
    fn masked_logits_keep_the_allowed_bits() {
        let (width, vocab, rows, masked) = (70, 67, 4, 3);
        let logits: Vec<f32> = (0..width * rows)
            .map(|i| {
                if i % 13 == 5 {
                    f32::NAN
                } else {
                    (i as f32 * 0.61).sin() * 9.0
                }
            })
            .collect();
        let allowed: Vec<bool> = (0..vocab * masked).map(|i| i % 3 != 1).collect();
        for p in Path::all().into_iter().filter(|p| path_available(*p)) {
            let mut out = vec![0.0f32; vocab * rows];
            mask_logits(p, &logits, width, &allowed, &mut out, vocab);
            for r in 0..rows {
                for j in 0..vocab {
                    let (got, x) = (out[r * vocab + j], logits[r * width + j]);
                    if r < masked && !allowed[r * vocab + j] {
                        assert_eq!(got, f32::NEG_INFINITY, "{p:?} row {r} id {j}");
                    } else {
                        assert_eq!(got.to_bits(), x.to_bits(), "{p:?} row {r} id {j}");
                    }
                }
            }
        }
    }
}
