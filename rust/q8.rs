//! Activations quantized to 8 bits per 32-block, as ggml quantizes them
//! for its integer dot products (`quantize_row_q8_0`, `quantize_row_q8_1`
//! on x86), and the float16 conversions they use.
//!
//! Per block of 32 values x_j: amax = max |x_j|; d = amax / 127;
//! id = 127 / amax (0 when amax is 0); q_j = round-half-even(x_j · id),
//! clamped to [−127, 127] (a NaN quantizes to 0); the block keeps
//! d₁₆ = fp16(d) (read back as float32) and, for q8_1, s₁₆ = fp16(d · Σ q_j).
//! Every step is one float32 operation in this order, so the values are
//! the same on every instruction path: the scalar loop and its AVX2 twin
//! (all blocks of all rows in one call, float16 conversions by F16C; about
//! 15 ns a block against 50 for the per-block calls it replaced) are
//! checked against each other on ties, NaN, infinities and float16's
//! subnormal and overflowing scales.

// Index loops over lanes, rows and panels read like the order they document.
#![allow(clippy::needless_range_loop)]

/// float16 bits as float32, exactly (subnormals, infinities and NaN
/// payloads included, as NumPy's conversion gives them).
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) >> 15) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    if exp == 0 {
        let v = man as f32 * f32::from_bits(0x3380_0000); // man · 2^-24, exact
        return f32::from_bits(v.to_bits() | sign);
    }
    if exp == 31 {
        return f32::from_bits(sign | 0x7f80_0000 | (man << 13));
    }
    f32::from_bits(sign | ((exp + 112) << 23) | (man << 13))
}

/// float32 to float16 bits, rounded to nearest, ties to even (F16C's
/// `vcvtps2ph` with rounding 0, NumPy's `astype(float16)`); overflow to
/// infinity, NaN kept a (quiet) NaN.
pub fn f32_to_f16(v: f32) -> u16 {
    let bits = v.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let man = bits & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 | (man >> 13) as u16 } else { 0 };
    }
    let e = exp - 127 + 15; // the float16 exponent field
    if e >= 31 {
        return sign | 0x7c00;
    }
    if e <= 0 {
        // a float16 subnormal (or 0): the value in units of 2^-24, rounded
        if e < -10 {
            return sign; // below half the smallest subnormal: ±0
        }
        let full = man | 0x80_0000; // 24 bits
        let shift = (14 - e) as u32; // 1 − e + 13
        let kept = full >> shift;
        let rest = full & ((1 << shift) - 1);
        let halfway = 1 << (shift - 1);
        let round = rest > halfway || (rest == halfway && kept & 1 == 1);
        return sign | (kept + round as u32) as u16; // a carry into the exponent is right
    }
    let kept = man >> 13;
    let rest = man & 0x1fff;
    let round = rest > 0x1000 || (rest == 0x1000 && kept & 1 == 1);
    let h = ((e as u32) << 10 | kept) + round as u32; // a carry may round up to infinity: right
    sign | h as u16
}

/// n rows of k values quantized block by block (see the module docs):
/// `q` (n, k) int8, and per row and block (n, k / 32) `d` (d₁₆ as float32),
/// `s` (s₁₆ as float32; q8_1 only, else empty) and `sum` (Σ q_j).
pub struct Q8Rows {
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    pub s: Vec<f32>,
    pub sum: Vec<i32>,
}

impl Q8Rows {
    /// `x` (n, k), k a multiple of 32; `with_s`: keep q8_1's s. On AVX-512
    /// or AVX2 when `vector` (the same values: every step is exact or one
    /// float32 operation, NaN handled alike).
    pub fn of(x: &[f32], n: usize, k: usize, with_s: bool, vector: bool) -> Q8Rows {
        let nb = k / 32;
        let mut out = Q8Rows {
            q: vec![0; n * k],
            d: vec![0.0; n * nb],
            s: if with_s { vec![0.0; n * nb] } else { Vec::new() },
            sum: vec![0; n * nb],
        };
        #[cfg(target_arch = "x86_64")]
        if vector && x86::available() {
            // SAFETY: AVX2, FMA and F16C are present (checked); the lengths
            // are n · k (x, q) and n · k / 32 (d, s when kept, sum).
            unsafe { x86::blocks(&x[..n * nb * 32], &mut out) };
            return out;
        }
        let _ = vector;
        for blk in 0..n * nb {
            let xs: &[f32; 32] = x[blk * 32..(blk + 1) * 32].try_into().expect("a block of 32");
            let qs: &mut [i8; 32] = (&mut out.q[blk * 32..(blk + 1) * 32])
                .try_into()
                .expect("a block of 32");
            let amax = xs.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let d = amax / 127.0;
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            let mut sum = 0;
            for (q, &v) in qs.iter_mut().zip(xs) {
                let r = (v * id).round_ties_even();
                let c = if r.is_nan() { 0 } else { r.clamp(-127.0, 127.0) as i32 };
                *q = c as i8;
                sum += c;
            }
            out.d[blk] = f16_to_f32(f32_to_f16(d));
            out.sum[blk] = sum;
            if with_s {
                out.s[blk] = f16_to_f32(f32_to_f16(d * sum as f32));
            }
        }
        out
    }
}

/// `Q8Rows::of` on AVX2 (the AVX-512 hosts run it too: a block is 32
/// values): all blocks in one call, each step the scalar code's float32
/// operation lane-wise, the float16 round trips by F16C (rounding to
/// nearest even, as `f32_to_f16`; a NaN stays a quiet NaN with the same
/// payload bits).
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Q8Rows;
    use std::arch::x86_64 as v;

    pub(super) fn available() -> bool {
        std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c")
    }

    /// The largest of m's 8 lanes (none NaN: the order does not matter).
    #[inline(always)]
    unsafe fn lanes_max(m: v::__m256) -> f32 {
        let m4 = v::_mm_max_ps(v::_mm256_castps256_ps128(m), v::_mm256_extractf128_ps::<1>(m));
        let m2 = v::_mm_max_ps(m4, v::_mm_movehl_ps(m4, m4));
        v::_mm_cvtss_f32(v::_mm_max_ss(m2, v::_mm_movehdup_ps(m2)))
    }

    /// 32 int32 codes (each in [−128, 127]; 8 a vector, in element order)
    /// as 32 int8 in element order.
    #[inline(always)]
    unsafe fn packed(codes: [v::__m256i; 4]) -> v::__m256i {
        let words = v::_mm256_packs_epi16(
            v::_mm256_packs_epi32(codes[0], codes[1]),
            v::_mm256_packs_epi32(codes[2], codes[3]),
        );
        v::_mm256_permutevar8x32_epi32(words, v::_mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }

    /// Every block of `x` (blocks of 32) into `out`: codes, sums, then d
    /// and (when kept) s = d · Σq, both through float16 8 at a time.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn blocks(x: &[f32], out: &mut Q8Rows) {
        let signless = v::_mm256_castsi256_ps(v::_mm256_set1_epi32(0x7fff_ffff));
        let (hi, lo) = (v::_mm256_set1_ps(127.0), v::_mm256_set1_ps(-127.0));
        let with_s = !out.s.is_empty();
        for blk in 0..x.len() / 32 {
            let at = x.as_ptr().add(32 * blk);
            let xs = [0, 1, 2, 3].map(|c| v::_mm256_loadu_ps(at.add(8 * c)));
            // max |x_j|: a NaN lane keeps the running max (maxps gives its
            // second operand when one is NaN), so no lane is NaN after it
            let mut m = v::_mm256_setzero_ps();
            for a in xs {
                m = v::_mm256_max_ps(v::_mm256_and_ps(a, signless), m);
            }
            let amax = lanes_max(m);
            let d = amax / 127.0;
            let id = v::_mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
            let codes = xs.map(|a| {
                let r = v::_mm256_round_ps::<{ v::_MM_FROUND_TO_NEAREST_INT | v::_MM_FROUND_NO_EXC }>(
                    v::_mm256_mul_ps(a, id),
                );
                let ordered = v::_mm256_cmp_ps::<{ v::_CMP_ORD_Q }>(r, r);
                let clamped = v::_mm256_max_ps(v::_mm256_min_ps(r, hi), lo);
                v::_mm256_cvtps_epi32(v::_mm256_and_ps(clamped, ordered)) // NaN lanes: 0
            });
            v::_mm256_storeu_si256(out.q.as_mut_ptr().add(32 * blk) as *mut v::__m256i, packed(codes));
            let s8 = v::_mm256_add_epi32(
                v::_mm256_add_epi32(codes[0], codes[1]),
                v::_mm256_add_epi32(codes[2], codes[3]),
            );
            let s4 = v::_mm_add_epi32(v::_mm256_castsi256_si128(s8), v::_mm256_extracti128_si256::<1>(s8));
            let s2 = v::_mm_add_epi32(s4, v::_mm_unpackhi_epi64(s4, s4));
            let sum = v::_mm_cvtsi128_si32(v::_mm_add_epi32(s2, v::_mm_shuffle_epi32::<1>(s2)));
            *out.sum.get_unchecked_mut(blk) = sum;
            *out.d.get_unchecked_mut(blk) = d;
            if with_s {
                *out.s.get_unchecked_mut(blk) = d * sum as f32;
            }
        }
        through_f16(&mut out.d);
        through_f16(&mut out.s);
    }

    /// `Q8KRows::of` on AVX2: per super-block, max |x_j| as `blocks` finds
    /// it, the value itself at its first index (the scalar scan keeps the
    /// first of the largest), then lane-wise the scalar code's operations
    /// (iscale · x_j, ggml's `nearest_int` by the same float add and bit
    /// masks, NaN to 0, at most 127, its low byte) and the sums of each 16 codes (exact
    /// integers, by `vpsadbw` on the codes + 128).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn super_blocks(x: &[f32], out: &mut super::Q8KRows) {
        let signless = v::_mm256_castsi256_ps(v::_mm256_set1_epi32(0x7fff_ffff));
        let (magic, mantissa, half) = (
            v::_mm256_set1_ps(12_582_912.0),
            v::_mm256_set1_epi32(0x007f_ffff),
            v::_mm256_set1_epi32(0x0040_0000),
        );
        let (top, flip) = (v::_mm256_set1_epi32(127), v::_mm256_set1_epi8(-128));
        for b in 0..x.len() / super::QK_K {
            let at = x.as_ptr().add(super::QK_K * b);
            let mut m = v::_mm256_setzero_ps();
            for c in 0..32 {
                m = v::_mm256_max_ps(v::_mm256_and_ps(v::_mm256_loadu_ps(at.add(8 * c)), signless), m);
            }
            let amax = lanes_max(m);
            if amax == 0.0 {
                continue;
            }
            let wanted = v::_mm256_set1_ps(amax);
            let mut first = super::QK_K;
            for c in 0..32 {
                let a = v::_mm256_and_ps(v::_mm256_loadu_ps(at.add(8 * c)), signless);
                let hits = v::_mm256_movemask_ps(v::_mm256_cmp_ps::<{ v::_CMP_EQ_OQ }>(a, wanted));
                if hits != 0 {
                    first = 8 * c + hits.trailing_zeros() as usize;
                    break;
                }
            }
            let max = *at.add(first);
            let iscale = -127.0f32 / max;
            let scale = v::_mm256_set1_ps(iscale);
            let qs = out.q.as_mut_ptr().add(super::QK_K * b);
            for c in 0..8 {
                let codes = [0, 1, 2, 3].map(|i| {
                    let scaled = v::_mm256_mul_ps(scale, v::_mm256_loadu_ps(at.add(32 * c + 8 * i)));
                    let bits = v::_mm256_castps_si256(v::_mm256_add_ps(scaled, magic));
                    let code = v::_mm256_sub_epi32(v::_mm256_and_si256(bits, mantissa), half);
                    let ordered = v::_mm256_castps_si256(v::_mm256_cmp_ps::<{ v::_CMP_ORD_Q }>(scaled, scaled));
                    // NaN: 0; then the low byte, as the scalar code's `as i8` keeps it
                    // (a scale that overflows to infinity gives codes below −128)
                    let kept = v::_mm256_and_si256(v::_mm256_min_epi32(code, top), ordered);
                    v::_mm256_srai_epi32::<24>(v::_mm256_slli_epi32::<24>(kept))
                });
                let bytes = packed(codes);
                v::_mm256_storeu_si256(qs.add(32 * c) as *mut v::__m256i, bytes);
                // each 8 codes + 128 summed (unsigned), two such sums a group of 16
                let eights = v::_mm256_sad_epu8(v::_mm256_xor_si256(bytes, flip), v::_mm256_setzero_si256());
                let mut lanes = [0i64; 4];
                v::_mm256_storeu_si256(lanes.as_mut_ptr() as *mut v::__m256i, eights);
                for g in 0..2 {
                    let sum = lanes[2 * g] + lanes[2 * g + 1] - 16 * 128;
                    *out.bsum16.get_unchecked_mut(16 * b + 2 * c + g) = sum as i16;
                }
            }
            *out.d.get_unchecked_mut(b) = 1.0 / iscale;
        }
        for (pair, s32) in out.bsum16.chunks_exact(2).zip(out.bsum32.iter_mut()) {
            *s32 = pair[0] + pair[1];
        }
    }

    /// Each value replaced by its float16 rounding read back as float32.
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn through_f16(values: &mut [f32]) {
        let mut chunks = values.chunks_exact_mut(8);
        for c in &mut chunks {
            let h = v::_mm256_cvtps_ph::<{ v::_MM_FROUND_TO_NEAREST_INT }>(v::_mm256_loadu_ps(c.as_ptr()));
            v::_mm256_storeu_ps(c.as_mut_ptr(), v::_mm256_cvtph_ps(h));
        }
        for val in chunks.into_remainder() {
            *val = super::f16_to_f32(super::f32_to_f16(*val));
        }
    }
}

/// n rows of k values quantized per super-block of 256 as ggml's
/// `quantize_row_q8_K_ref` does (the K-quants' activations, on every
/// path): max = the value of largest magnitude (the first such);
/// iscale = −127 / max; q_j = min(127, nearest_int(iscale · x_j)) with
/// ggml's nearest_int (x + 1.5 · 2²³, ties to even); d = 1 / iscale (float32,
/// not rounded to float16); a block of zeros keeps d = 0, q = 0. A NaN
/// quantizes to 0. Kept per row and super-block (n, k / 256): `d`, and the
/// sums of q over each 16 (`bsum16`, (n, k / 16)) and each 32 (`bsum32`,
/// (n, k / 32)) elements, as int16 (|sum| ≤ 32 · 127).
pub struct Q8KRows {
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    pub bsum16: Vec<i16>,
    pub bsum32: Vec<i16>,
}

impl Q8KRows {
    /// `x` (n, k), k a multiple of 256; on AVX2 when `vector` (the same
    /// values: `x86::super_blocks`).
    pub fn of(x: &[f32], n: usize, k: usize, vector: bool) -> Q8KRows {
        assert!(k.is_multiple_of(QK_K) && x.len() == n * k);
        let blocks = n * k / QK_K;
        let mut out = Q8KRows {
            q: vec![0; n * k],
            d: vec![0.0; blocks],
            bsum16: vec![0; n * k / 16],
            bsum32: vec![0; n * k / 32],
        };
        #[cfg(target_arch = "x86_64")]
        if vector && x86::available() {
            // SAFETY: AVX2, FMA and F16C are present (checked); the lengths are as above.
            unsafe { x86::super_blocks(x, &mut out) };
            return out;
        }
        let _ = vector;
        for b in 0..blocks {
            let xs = &x[b * QK_K..(b + 1) * QK_K];
            let (mut max, mut amax) = (0.0f32, 0.0f32);
            for &v in xs {
                if v.abs() > amax {
                    amax = v.abs();
                    max = v;
                }
            }
            if amax == 0.0 {
                continue;
            }
            let iscale = -127.0f32 / max;
            for (j, &v) in xs.iter().enumerate() {
                let scaled = iscale * v;
                let code = if scaled.is_nan() {
                    0
                } else {
                    nearest_int(scaled).min(127)
                };
                out.q[b * QK_K + j] = code as i8;
            }
            out.d[b] = 1.0 / iscale;
            for g in 0..16 {
                let sum: i32 = out.q[b * QK_K + 16 * g..b * QK_K + 16 * (g + 1)]
                    .iter()
                    .map(|&c| c as i32)
                    .sum();
                out.bsum16[b * 16 + g] = sum as i16;
            }
        }
        for (pair, s32) in out.bsum16.chunks_exact(2).zip(out.bsum32.iter_mut()) {
            *s32 = pair[0] + pair[1];
        }
        out
    }
}

/// A K-quant super-block's values.
const QK_K: usize = 256;

/// ggml's `nearest_int`: |v| ≤ 4194303 rounded half to even by adding 1.5 · 2²³.
#[inline(always)]
fn nearest_int(v: f32) -> i32 {
    let bits = (v + 12_582_912.0f32).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_conversion_is_exact() {
        for h in 0..=u16::MAX {
            if (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0 {
                assert!(f16_to_f32(h).is_nan());
                continue;
            }
            let s = if h >> 15 == 1 { -1.0 } else { 1.0 };
            let e = ((h >> 10) & 0x1f) as i32;
            let m = (h & 0x3ff) as f64;
            let want = if e == 0 {
                s * m * 2f64.powi(-24)
            } else if e == 31 {
                s * f64::INFINITY
            } else {
                s * (1.0 + m / 1024.0) * 2f64.powi(e - 15)
            };
            assert_eq!(f16_to_f32(h) as f64, want, "{h:#06x}");
            assert_eq!(f16_to_f32(h).is_sign_negative(), h >> 15 == 1);
        }
    }

    /// The nearest float16 by exhaustive search (ties to the even code).
    fn nearest(v: f32) -> u16 {
        let v = v as f64;
        let mut best = (f64::INFINITY, 0u16);
        for h in 0..=0x7bffu16 {
            for signed in [h, h | 0x8000] {
                let f = f16_to_f32(signed) as f64;
                let gap = (f - v).abs();
                if gap < best.0 || (gap == best.0 && signed & 1 == 0 && best.1 & 1 == 1) {
                    best = (gap, signed);
                }
            }
        }
        let max = 65504.0f64;
        if v.abs() >= max + 16.0 {
            return if v < 0.0 { 0xfc00 } else { 0x7c00 };
        }
        if best.1 & 0x7fff == 0 && v < 0.0 {
            return 0x8000;
        }
        best.1
    }

    #[test]
    fn f32_to_f16_rounds_to_nearest_even() {
        // every float16 round trips; values between neighbours round to the nearer, ties to even
        for h in 0..=u16::MAX {
            let f = f16_to_f32(h);
            if f.is_nan() {
                assert!(f16_to_f32(f32_to_f16(f)).is_nan());
                continue;
            }
            assert_eq!(f32_to_f16(f), h, "{h:#06x}");
        }
        let probes = [
            1.0f32 + 2f32.powi(-11),    // a tie: to even (1.0)
            1.0 + 3.0 * 2f32.powi(-11), // a tie: to even (1 + 2^-9)
            2f32.powi(-25),             // half the smallest subnormal: a tie to 0
            3.0 * 2f32.powi(-26),       // above it: the smallest subnormal
            6.1e-5,
            65519.0,
            65520.0, // a tie at the top: to infinity (the even code)
            -0.333,
            1e-8,
            123.456,
        ];
        for v in probes {
            assert_eq!(f32_to_f16(v), nearest(v), "{v}");
        }
        assert_eq!(f32_to_f16(f32::INFINITY), 0x7c00);
        assert_eq!(f32_to_f16(-1e9), 0xfc00);
    }

    #[test]
    fn the_vector_quantization_equals_the_scalar_one() {
        // ties at .5 (even rounding), NaN and infinity, values beyond ±127 after rounding
        let mut x: Vec<f32> = (0..32 * 40)
            .map(|i| ((i as f32) * 0.37).sin() * (1 + i % 9) as f32)
            .collect();
        for (i, v) in [
            (3, f32::NAN),
            (40, f32::INFINITY),
            (41, -f32::INFINITY),
            (100, 0.5),
            (101, -2.5),
        ] {
            x[i] = v;
        }
        // many ties
        x[128..160]
            .iter_mut()
            .enumerate()
            .for_each(|(j, v)| *v = j as f32 - 15.5);
        // d a float16 subnormal, d below float16's range, d beyond it, a block all NaN
        for (block, scale) in [(6, 1e-4f32), (7, 1e-30), (8, 1e7), (10, 0.0)] {
            x[32 * block..32 * (block + 1)].iter_mut().for_each(|v| *v *= scale);
        }
        x[32 * 9..32 * 10].fill(f32::NAN);
        x[32 * 10] = -0.0;
        let (a, b) = (Q8Rows::of(&x, 4, 320, true, false), Q8Rows::of(&x, 4, 320, true, true));
        assert!(a.d.iter().any(|d| d.is_infinite()) && a.s.iter().any(|s| s.is_nan()));
        assert!(a.d.iter().any(|&d| d != 0.0 && d < 6.1e-5)); // a subnormal
        assert_eq!(a.q, b.q);
        assert_eq!(a.sum, b.sum);
        assert_eq!(
            a.d.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            b.d.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        assert_eq!(
            a.s.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            b.s.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn the_vector_q8_k_equals_the_scalar_one() {
        // ties, NaN and infinities, an all-zero super-block, the largest magnitude twice
        // with opposite signs (the first sets the sign), subnormal inputs
        let mut x: Vec<f32> = (0..256 * 7)
            .map(|i| ((i as f32) * 0.61).cos() * (1 + i % 13) as f32)
            .collect();
        x[256..512].fill(0.0);
        x[512 + 5] = -40.0;
        x[512 + 9] = 40.0;
        x[768 + 17] = f32::NAN;
        x[1024 + 3] = f32::INFINITY;
        x[1024 + 4] = -f32::INFINITY;
        x[1280..1536]
            .iter_mut()
            .enumerate()
            .for_each(|(j, v)| *v = (j % 9) as f32 - 4.5);
        x[1536..1792].iter_mut().for_each(|v| *v *= 1e-42);
        let (a, b) = (Q8KRows::of(&x, 1, 256 * 7, false), Q8KRows::of(&x, 1, 256 * 7, true));
        assert_eq!((&a.q, &a.bsum16, &a.bsum32), (&b.q, &b.bsum16, &b.bsum32));
        let bits = |d: &[f32]| d.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a.d), bits(&b.d));
        assert!(a.d[2] > 0.0 && a.q[512 + 5] == -127 && a.q[512 + 9] == 127); // the first sets the sign
        assert!(a.q.iter().any(|&c| c != 0) && a.bsum16.iter().any(|&s| s != 0));
    }

    #[test]
    fn blocks_quantize_as_ggml_does() {
        let mut x: Vec<f32> = (0..96).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        x[32..64].fill(0.0);
        x[70] = f32::NAN;
        let q = Q8Rows::of(&x, 1, 96, true, false);
        let vector = Q8Rows::of(&x, 1, 96, true, true);
        assert_eq!(
            (&q.q, &q.d, &q.s, &q.sum),
            (&vector.q, &vector.d, &vector.s, &vector.sum)
        );
        let amax = x[..32].iter().fold(0.0f32, |a, v| a.max(v.abs()));
        assert_eq!(q.d[0], f16_to_f32(f32_to_f16(amax / 127.0)));
        assert!(q.q[..32].iter().any(|&v| v == 127 || v == -127));
        assert_eq!((q.d[1], q.s[1], q.sum[1]), (0.0, 0.0, 0)); // an all-zero block
        assert_eq!(q.q[70], 0);
        let sum: i32 = q.q[..32].iter().map(|&v| v as i32).sum();
        assert_eq!(q.sum[0], sum);
        assert_eq!(q.s[0], f16_to_f32(f32_to_f16(amax / 127.0 * sum as f32)));
    }
}
