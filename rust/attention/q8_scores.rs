//! Attention scores by integer block products: queries quantized as q8
//! against keys cached as q8_0, the function of llama.cpp's attention over
//! a q8_0 key cache (the query quantized by `quantize_row_q8_0`, each score
//! a `vec_dot_q8_0_q8_0`). It runs where the activations are q8
//! (`Act::Q8`) and the cache is q8_0: another target function, exact by
//! itself. Float32 activations keep the float scores of the cached values
//! (the attention module's docs).
//!
//! A query row (d values, d a multiple of 32) is quantized per 32-block as
//! `q8::Q8Rows` quantizes activations: codes q_i in [−127, 127] and a scale
//! dq_b (rounded to float16, held as float32). A key row is stored as q8_0
//! (`kv`): codes k_i in [−127, 127] and a float16 scale dk_b. For block b
//! the integer I_b = Σ_{i in b} q_i·k_i is exact (|I_b| ≤ 32·127² < 2²⁴,
//! so float32 holds it too), and so is w_b = dq_b·dk_b (two 11-bit
//! significands). The score of a key is
//!
//! ```text
//! s = (acc = fma(I_b, w_b, acc) over the blocks in order, from +0) · scale
//! ```
//!
//! with the layer's `scale` (1/√d). Every path computes the same integers
//! (grouped as it likes: integer sums are exact) and these float operations
//! in this order, so a score has the same bits on every path, alone or in
//! any batch. The scores of a block of 16 keys go where the float kernels
//! put theirs (a query's row of `span` in the task's scratch, key block b
//! at (b − b0)·16); softmax and the values are then the float function's.
//!
//! AVX-512 VNNI: 16 keys' codes transposed once (lane = key, a 32-bit lane
//! = 4 codes), the codes made unsigned (k + 128) and `vpdpbusd` against
//! each query's 4 codes broadcast: I = Σ (k + 128)·q − 128·Σ q. AVX2 (and
//! AVX-512 without VNNI): 8 keys a vector, `vpmaddubsw` of |q| and k with
//! q's sign (pairs of at most 2·127², no saturation), `vpmaddwd` by ones.

// Index loops over lanes, keys and blocks read like the order they document.
#![allow(clippy::needless_range_loop)]

use crate::kv::{Q8_BLOCK, Q8_BYTES};
use crate::q8::{f16_to_f32, Q8Rows};
use crate::quant::Path;

/// Keys per block (the lanes of a score vector), as in the float kernels.
const KB: usize = super::KB;

/// Queries quantized per 32-block (`q8::Q8Rows`): `q` (queries, d) codes,
/// `d` and `sum` (queries, d / 32) scales and code sums. `attention`
/// quantizes each key-value head's queries once per call (its tasks take
/// views of them).
pub(super) struct Q8Queries {
    q: Vec<i8>,
    d: Vec<f32>,
    sum: Vec<i32>,
    dim: usize,
}

/// Queries q0..q0 + len of a `Q8Queries` (a task's).
#[derive(Clone, Copy)]
pub(super) struct Q8View<'a> {
    q: &'a [i8],
    d: &'a [f32],
    sum: &'a [i32],
    dim: usize,
}

impl Q8Queries {
    /// The query rows `rows` (queries, d) quantized.
    pub(super) fn of(rows: &[f32], d: usize) -> Q8Queries {
        let q = Q8Rows::of(rows, rows.len() / d, d, false, true);
        Q8Queries {
            q: q.q,
            d: q.d,
            sum: q.sum,
            dim: d,
        }
    }

    /// Queries q0..q0 + len.
    pub(super) fn view(&self, q0: usize, len: usize) -> Q8View<'_> {
        let (d, nb) = (self.dim, self.dim / Q8_BLOCK);
        Q8View {
            q: &self.q[q0 * d..(q0 + len) * d],
            d: &self.d[q0 * nb..(q0 + len) * nb],
            sum: &self.sum[q0 * nb..(q0 + len) * nb],
            dim: d,
        }
    }
}

impl Q8View<'_> {
    fn len(&self) -> usize {
        self.d.len() / (self.dim / Q8_BLOCK)
    }
}

/// The scaled scores of every query of `q` against the key blocks b0..b1
/// (keys b·16..) of a head's q8_0 rows at `keys` (`total` keys written):
/// query qi's scores of block b at `out` + qi·span + (b − b0)·16; the
/// lanes of keys past `total` get 0 (the softmax never sees them).
///
/// # Safety
/// `keys` holds rows 0..total of d / 32 · 34 bytes; `out` holds
/// queries · span values, span ≥ (b1 − b0)·16; `path` is available.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn scores(
    keys: *const u8,
    d: usize,
    total: usize,
    (b0, b1): (usize, usize),
    q: &Q8View<'_>,
    scale: f32,
    out: *mut f32,
    span: usize,
    path: Path,
) {
    let w = d / Q8_BLOCK * Q8_BYTES;
    for b in b0..b1 {
        let j0 = b * KB;
        let at = out.add((b - b0) * KB);
        if j0 + KB > total {
            block_lanes(keys, w, d, j0, total - j0, q, scale, at, span);
            continue;
        }
        #[cfg(target_arch = "x86_64")]
        {
            super::fetch_rows(keys as *const crate::kv::Q8, d, (b + 2) * KB, KB);
            if path == Path::Avx512Vnni {
                x86::block_vnni(keys, w, d, j0, q, scale, at, span);
                continue;
            }
            if path.vector() {
                x86::block_avx2(keys, w, d, j0, q, scale, at, span);
                continue;
            }
        }
        let _ = path;
        block_lanes(keys, w, d, j0, KB, q, scale, at, span);
    }
}

/// Block j0.. of `lanes` keys (the rest of the 16 lanes 0), one score at a time.
#[allow(clippy::too_many_arguments)]
unsafe fn block_lanes(
    keys: *const u8,
    w: usize,
    d: usize,
    j0: usize,
    lanes: usize,
    q: &Q8View<'_>,
    scale: f32,
    at: *mut f32,
    span: usize,
) {
    let nb = d / Q8_BLOCK;
    for qi in 0..q.len() {
        for lane in 0..KB {
            let mut acc = 0.0f32;
            if lane < lanes {
                let row = keys.add((j0 + lane) * w);
                for b in 0..nb {
                    let block = row.add(b * Q8_BYTES);
                    let dk = f16_to_f32(u16::from_le_bytes([*block, *block.add(1)]));
                    let codes = block.add(2) as *const i8;
                    let qs = &q.q[qi * d + b * Q8_BLOCK..qi * d + (b + 1) * Q8_BLOCK];
                    let mut i = 0i32;
                    for c in 0..Q8_BLOCK {
                        i += qs[c] as i32 * *codes.add(c) as i32;
                    }
                    acc = (i as f32).mul_add(q.d[qi * nb + b] * dk, acc);
                }
                acc *= scale;
            }
            *at.add(qi * span + lane) = acc;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use std::arch::x86_64 as v;

    /// The 16 keys' float16 scales of block `b` (rows `w` bytes apart from `base`).
    #[inline(always)]
    unsafe fn key_scales16(base: *const u8, w: usize, b: usize) -> v::__m512 {
        let offsets = v::_mm512_mullo_epi32(
            v::_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            v::_mm512_set1_epi32(w as i32),
        );
        // each lane's 4 bytes start with the block's scale (its low 16 bits)
        let words = v::_mm512_i32gather_epi32::<1>(offsets, base.add(b * Q8_BYTES) as *const _);
        v::_mm512_cvtph_ps(v::_mm512_cvtepi32_epi16(words))
    }

    /// 16 full keys j0.. by `vpdpbusd`, two 32-blocks (a 16 × 16 transpose of
    /// their 32-bit lanes) at a time.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn block_vnni(
        keys: *const u8,
        w: usize,
        d: usize,
        j0: usize,
        q: &Q8View<'_>,
        scale: f32,
        at: *mut f32,
        span: usize,
    ) {
        let nb = d / Q8_BLOCK;
        let base = keys.add(j0 * w);
        let flip = v::_mm512_set1_epi8(-128);
        let mut b = 0;
        while b < nb {
            let pair = b + 1 < nb;
            let mut r = [v::_mm512_setzero_ps(); KB];
            for lane in 0..KB {
                let row = base.add(lane * w + b * Q8_BYTES + 2);
                let lo = v::_mm256_loadu_si256(row as *const v::__m256i);
                let hi = if pair {
                    v::_mm256_loadu_si256(row.add(Q8_BYTES) as *const v::__m256i)
                } else {
                    v::_mm256_setzero_si256()
                };
                r[lane] = v::_mm512_castsi512_ps(v::_mm512_inserti64x4::<1>(v::_mm512_castsi256_si512(lo), hi));
            }
            // t[k]: lane = key, 4 codes k (blocks b: k < 8, b + 1: k ≥ 8), as k + 128
            let cols = crate::attention::x86::transpose_16x16(r);
            let mut t = [v::_mm512_setzero_si512(); KB];
            for k in 0..KB {
                t[k] = v::_mm512_xor_si512(v::_mm512_castps_si512(cols[k]), flip);
            }
            let dk0 = key_scales16(base, w, b);
            let dk1 = if pair { key_scales16(base, w, b + 1) } else { dk0 };
            for qi in 0..q.len() {
                let codes = q.q.as_ptr().add(qi * d + b * Q8_BLOCK) as *const i32;
                let (mut e0, mut o0, mut e1, mut o1) = (
                    v::_mm512_setzero_si512(),
                    v::_mm512_setzero_si512(),
                    v::_mm512_setzero_si512(),
                    v::_mm512_setzero_si512(),
                );
                for k in (0..8).step_by(2) {
                    e0 = v::_mm512_dpbusd_epi32(e0, t[k], v::_mm512_set1_epi32(codes.add(k).read_unaligned()));
                    o0 = v::_mm512_dpbusd_epi32(o0, t[k + 1], v::_mm512_set1_epi32(codes.add(k + 1).read_unaligned()));
                    if pair {
                        e1 = v::_mm512_dpbusd_epi32(
                            e1,
                            t[8 + k],
                            v::_mm512_set1_epi32(codes.add(8 + k).read_unaligned()),
                        );
                        o1 = v::_mm512_dpbusd_epi32(
                            o1,
                            t[9 + k],
                            v::_mm512_set1_epi32(codes.add(9 + k).read_unaligned()),
                        );
                    }
                }
                let row = at.add(qi * span);
                let mut acc = if b == 0 {
                    v::_mm512_setzero_ps()
                } else {
                    v::_mm512_loadu_ps(row)
                };
                for (blk, e, o, dk) in [(b, e0, o0, dk0), (b + 1, e1, o1, dk1)] {
                    if blk == nb {
                        break;
                    }
                    let unsigned = v::_mm512_add_epi32(e, o);
                    let i = v::_mm512_sub_epi32(unsigned, v::_mm512_set1_epi32(128 * q.sum[qi * nb + blk]));
                    let wb = v::_mm512_mul_ps(dk, v::_mm512_set1_ps(q.d[qi * nb + blk]));
                    acc = v::_mm512_fmadd_ps(v::_mm512_cvtepi32_ps(i), wb, acc);
                }
                let last = b + 2 >= nb;
                let acc = if last {
                    v::_mm512_mul_ps(acc, v::_mm512_set1_ps(scale))
                } else {
                    acc
                };
                v::_mm512_storeu_ps(row, acc);
            }
            b += 2;
        }
    }

    /// 16 full keys j0.. as two vectors of 8, one 32-block at a time (an
    /// 8 × 8 transpose of its 32-bit lanes), by `vpmaddubsw` of |q| and k
    /// with q's sign, then `vpmaddwd` by ones.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn block_avx2(
        keys: *const u8,
        w: usize,
        d: usize,
        j0: usize,
        q: &Q8View<'_>,
        scale: f32,
        at: *mut f32,
        span: usize,
    ) {
        let nb = d / Q8_BLOCK;
        let ones = v::_mm256_set1_epi16(1);
        for half in 0..2 {
            let base = keys.add((j0 + 8 * half) * w);
            for b in 0..nb {
                // each key's 32 codes as 8 lanes of 4 (float lanes: the transpose only moves bits)
                let mut r = [v::_mm256_setzero_ps(); 8];
                let mut bits = [0i16; 8];
                for lane in 0..8 {
                    let block = base.add(lane * w + b * Q8_BYTES);
                    r[lane] = v::_mm256_loadu_ps(block.add(2) as *const f32);
                    bits[lane] = (block as *const i16).read_unaligned();
                }
                // t[k]: lane = key, its 4 codes k
                let cols = crate::attention::x86_avx2::transpose_8x8(r);
                let mut t = [v::_mm256_setzero_si256(); 8];
                for k in 0..8 {
                    t[k] = v::_mm256_castps_si256(cols[k]);
                }
                let dk = v::_mm256_cvtph_ps(v::_mm_loadu_si128(bits.as_ptr() as *const v::__m128i));
                for qi in 0..q.len() {
                    let codes = q.q.as_ptr().add(qi * d + b * Q8_BLOCK) as *const i32;
                    let mut i = v::_mm256_setzero_si256();
                    for k in 0..8 {
                        let qk = v::_mm256_set1_epi32(codes.add(k).read_unaligned());
                        let pairs = v::_mm256_maddubs_epi16(v::_mm256_abs_epi8(qk), v::_mm256_sign_epi8(t[k], qk));
                        i = v::_mm256_add_epi32(i, v::_mm256_madd_epi16(pairs, ones));
                    }
                    let row = at.add(qi * span + 8 * half);
                    let acc = if b == 0 {
                        v::_mm256_setzero_ps()
                    } else {
                        v::_mm256_loadu_ps(row)
                    };
                    let wb = v::_mm256_mul_ps(dk, v::_mm256_set1_ps(q.d[qi * nb + b]));
                    let acc = v::_mm256_fmadd_ps(v::_mm256_cvtepi32_ps(i), wb, acc);
                    let acc = if b + 1 == nb {
                        v::_mm256_mul_ps(acc, v::_mm256_set1_ps(scale))
                    } else {
                        acc
                    };
                    v::_mm256_storeu_ps(row, acc);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::Kv;
    use crate::quant::path_available;

    /// Keys of every sign and size, and at rows 3 and 4 the extremes: codes
    /// ±127 whose block products reach 32·127² (`vpmaddubsw`'s pairs at
    /// their bound, `vpdpbusd`'s unsigned codes at 1 and 255).
    fn rows(n: usize, d: usize, seed: u32) -> Vec<f32> {
        (0..n * d)
            .map(|i| {
                let (r, c) = (i / d, i % d);
                if r == 3 || r == 4 {
                    return if (c + r) % 2 == 0 { 2.5 } else { -2.5 };
                }
                let h = (i as u32)
                    .wrapping_mul(2_654_435_761)
                    .wrapping_add(seed.wrapping_mul(97))
                    >> 8;
                ((h % 2001) as f32 / 500.0 - 2.0) * (1.0 + (r % 5) as f32)
            })
            .collect()
    }

    /// The module docs' score, from the float query and the stored key
    /// bytes: the query quantized by the scalar code, I_b summed in i64.
    fn documented(query: &[f32], key: &[u8], scale: f32) -> f32 {
        let d = query.len();
        let q = Q8Rows::of(query, 1, d, false, false);
        let mut acc = 0.0f32;
        for b in 0..d / Q8_BLOCK {
            let block = &key[b * Q8_BYTES..(b + 1) * Q8_BYTES];
            let dk = f16_to_f32(u16::from_le_bytes([block[0], block[1]]));
            let i: i64 = (0..Q8_BLOCK)
                .map(|c| q.q[b * Q8_BLOCK + c] as i64 * block[2 + c] as i8 as i64)
                .sum();
            assert!(i.abs() < 1 << 24);
            acc = (i as f32).mul_add(q.d[b] * dk, acc);
        }
        acc * scale
    }

    /// Every path, head size (one block alone, pairs, an odd count), query
    /// count and partial last block: the documented scores, bit for bit.
    #[test]
    fn integer_scores_are_the_documented_function_on_every_path() {
        for d in [32, 64, 96, 128] {
            let w = d / Q8_BLOCK * Q8_BYTES;
            for total in [5, 16, 37, 64] {
                let keys_f = rows(total, d, 1);
                let mut keys = vec![0u8; total * w];
                let mut spare = vec![0u8; total * w];
                for r in 0..total {
                    let key = &keys_f[r * d..(r + 1) * d];
                    Kv::Q8 {
                        keys: &mut keys,
                        values: &mut spare,
                    }
                    .write(r, key, key);
                }
                for n in [1, 3, 9] {
                    let queries = rows(n, d, 2 + n as u32);
                    let all = Q8Queries::of(&queries, d);
                    let q = all.view(0, n);
                    let blocks = (0, total.div_ceil(KB));
                    let span = blocks.1 * KB;
                    let want: Vec<u32> = (0..n * span)
                        .map(|at| {
                            let (i, j) = (at / span, at % span);
                            if j >= total {
                                return 0.0f32.to_bits();
                            }
                            documented(&queries[i * d..(i + 1) * d], &keys[j * w..(j + 1) * w], 0.125).to_bits()
                        })
                        .collect();
                    for path in Path::all().into_iter().filter(|p| path_available(*p)) {
                        let mut out = vec![f32::NAN; n * span];
                        unsafe { scores(keys.as_ptr(), d, total, blocks, &q, 0.125, out.as_mut_ptr(), span, path) };
                        let got: Vec<u32> = out.iter().map(|x| x.to_bits()).collect();
                        assert_eq!(got, want, "d {d}, {total} keys, {n} queries, {path:?}");
                    }
                }
            }
        }
    }
}
