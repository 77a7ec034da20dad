//! K-quant super-blocks (Q4_K, Q5_K, Q6_K: 256 elements each) at their own
//! precision: the file's fields, their packed panel layout, gguf-py's
//! dequantization (the reference), and the tiles for float32 and q8_K
//! activations.
//!
//! File layouts (ggml's `block_q4_K`, `block_q5_K`, `block_q6_K`; d and
//! dmin float16, s = element / 32, t = element / 16):
//! - Q4_K (144 bytes): d, dmin, 12 bytes holding eight 6-bit scales sc and
//!   eight 6-bit mins mn (ggml's `get_scale_min_k4` packing), then 128
//!   bytes of 4-bit codes: element 64c + 32h + l is nibble h of byte 32c + l.
//!   w = (d · sc_s) · q − (dmin · mn_s).
//! - Q5_K (176): as Q4_K with 32 bytes qh before the codes: the fifth bit
//!   of element 32s + l is bit s of qh[l].
//! - Q6_K (210): ql (128), qh (64), 16 int8 scales, d. Element 128c + 64h + i
//!   has nibble h of ql[64c + i]; element 128c + 32u + l has bits 2u, 2u + 1
//!   of qh[32c + l] as its bits 4 and 5. w = (d · sc_t) · (q − 32).
//!
//! Each weight is gguf-py's float32 value: the scale's product, then the
//! code's product, then (Q4_K, Q5_K) the min's product subtracted. The
//! vector paths take the code's product and the subtraction as one fused
//! operation, which rounds to the same bits: d · sc has at most 17
//! significant bits (a float16's 11, a 6-bit scale) and is exact, and times
//! a code below 32 at most 22: exact too, so rounding (d · sc) · q − min
//! once is rounding the separate subtraction (checked for every float16 d).
//!
//! **q8 activations** (`Act::Q8`): x quantized per 256 as ggml's q8_K
//! (`q8::Q8KRows`), and per super-block the exact integer sums of
//! llama.cpp's `vec_dot_q4_K_q8_K` / `q5_K` / `q6_K`:
//! - Q4_K, Q5_K: S = Σ_s sc_s · Σ_{e∈s} q_e x_e and M = Σ_s mn_s · Σ_{e∈s} x_e,
//!   then `acc ← fma(d_w · d_x, S, acc)`, `acc ← fma(dmin_w · (−d_x), M, acc)`;
//! - Q6_K: S = Σ_t sc_t · (Σ_{e∈t} q_e x_e − 32 Σ_{e∈t} x_e), `acc ← fma(d_w · d_x, S, acc)`;
//!
//! super-block by super-block in order (llama.cpp's function up to its
//! summation order, as for the 32-block formats).
//!
//! **Packed panel block** (16 rows, one lane a row, as in `quant.rs`):
//! - Q4_K, Q5_K: d (16 float16), dmin (16 float16), sc[8][16] and mn[8][16]
//!   (one byte each: the 6-bit fields unpacked), the codes' low nibbles in
//!   Q4_0's order per 32 elements (row byte 16s + j: element 32s + j low,
//!   32s + 16 + j high) as 32 groups of 64 bytes (4 bytes of each row), then
//!   (Q5_K) 8 groups of fifth bits (group s: a u32 per row, bit 8j + i:
//!   element 32s + 4i + j, so byte j holds the bits of elements 4i + j, i = 0..8).
//! - Q6_K: d (16 float16), sc[16][16] (int8), the low nibbles as above, then
//!   16 groups of high bits (group t: a u32 per row, bits 8j + 2i, 8j + 2i + 1:
//!   element 16t + 4i + j).
//!
//! So the high bits of the 4 elements a 4-byte operand holds are one shift
//! and one mask away, each in its own byte.
//!
//! A packed row block is 148 (Q4_K), 180 (Q5_K) or 210 (Q6_K) bytes: the
//! file's 144, 176 and 210, the 6-bit fields one byte each.

// Index loops over lanes, rows and elements read like the order they document.
#![allow(clippy::needless_range_loop)]

use crate::kernels::Tile;
use crate::q8::Q8KRows;
use crate::quant::{half, Layout, QType, Sums, GROUP, PANEL, QK_K};

/// Offsets within a Q4_K / Q5_K panel block: dmin, scales, mins, codes.
const DMIN: usize = 32;
const SC: usize = 64;
const MN: usize = 192;
const QS: usize = 320;
/// Offsets within a Q6_K panel block: scales, codes.
const SC6: usize = 32;
const QS6: usize = 288;
/// Bytes of a panel's low nibbles (32 groups).
const NIBBLES: usize = 32 * GROUP;

/// Bytes of one row's super-block in the packed layout.
pub(crate) fn packed_block(q: QType) -> usize {
    match q {
        QType::Q4_K => 148,
        QType::Q5_K => 180,
        QType::Q6_K => 210,
        _ => unreachable!("{q:?} is not a K-quant"),
    }
}

/// (codes, high bits) offsets of a panel block.
pub(crate) fn offsets(q: QType) -> (usize, usize) {
    match q {
        QType::Q4_K => (QS, 0),
        QType::Q5_K => (QS, QS + NIBBLES),
        QType::Q6_K => (QS6, QS6 + NIBBLES),
        _ => unreachable!("{q:?} is not a K-quant"),
    }
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// One super-block's fields: d and dmin (float16 bits), the scales (8
/// unsigned 6-bit, or 16 int8 for Q6_K), the 8 mins, and every element's
/// unsigned code (4, 5 or 6 bits).
pub(crate) struct Super {
    d: u16,
    dmin: u16,
    sc: [u8; 16],
    mn: [u8; 8],
    codes: [u8; QK_K],
}

impl Super {
    /// The fields of a super-block in the file's layout.
    pub(crate) fn read(q: QType, b: &[u8]) -> Super {
        let mut s = Super {
            d: 0,
            dmin: 0,
            sc: [0; 16],
            mn: [0; 8],
            codes: [0; QK_K],
        };
        if q == QType::Q6_K {
            let (ql, qh) = (&b[..128], &b[128..192]);
            s.sc.copy_from_slice(&b[192..208]);
            s.d = le16(b, 208);
            for e in 0..QK_K {
                let (c, h, i) = (e / 128, (e / 64) % 2, e % 64);
                let (u, l) = ((e / 32) % 4, e % 32);
                let low = (ql[64 * c + i] >> (4 * h)) & 15;
                s.codes[e] = low | ((qh[32 * c + l] >> (2 * u)) & 3) << 4;
            }
            return s;
        }
        s.d = le16(b, 0);
        s.dmin = le16(b, 2);
        let k = &b[4..16];
        for i in 0..4 {
            s.sc[i] = k[i] & 63;
            s.mn[i] = k[4 + i] & 63;
            s.sc[4 + i] = (k[8 + i] & 15) | ((k[i] >> 2) & 0x30);
            s.mn[4 + i] = (k[8 + i] >> 4) | ((k[4 + i] >> 2) & 0x30);
        }
        let (qh, qs) = if q == QType::Q5_K {
            (&b[16..48], &b[48..176])
        } else {
            (&b[16..16], &b[16..144])
        };
        for e in 0..QK_K {
            let (c, h, l) = (e / 64, (e / 32) % 2, e % 32);
            let mut v = (qs[32 * c + l] >> (4 * h)) & 15;
            if q == QType::Q5_K {
                v |= ((qh[l] >> (e / 32)) & 1) << 4;
            }
            s.codes[e] = v;
        }
        s
    }

    /// The super-block in the file's layout (`read`'s inverse).
    pub(crate) fn write(&self, q: QType, b: &mut [u8]) {
        b.fill(0);
        if q == QType::Q6_K {
            for e in 0..QK_K {
                let (c, h, i) = (e / 128, (e / 64) % 2, e % 64);
                let (u, l) = ((e / 32) % 4, e % 32);
                b[64 * c + i] |= (self.codes[e] & 15) << (4 * h);
                b[128 + 32 * c + l] |= (self.codes[e] >> 4) << (2 * u);
            }
            b[192..208].copy_from_slice(&self.sc);
            b[208..210].copy_from_slice(&self.d.to_le_bytes());
            return;
        }
        b[..2].copy_from_slice(&self.d.to_le_bytes());
        b[2..4].copy_from_slice(&self.dmin.to_le_bytes());
        for i in 0..4 {
            b[4 + i] = self.sc[i] | (self.sc[4 + i] >> 4) << 6;
            b[8 + i] = self.mn[i] | (self.mn[4 + i] >> 4) << 6;
            b[12 + i] = (self.sc[4 + i] & 15) | (self.mn[4 + i] & 15) << 4;
        }
        let qs = if q == QType::Q5_K { 48 } else { 16 };
        for e in 0..QK_K {
            let (c, h, l) = (e / 64, (e / 32) % 2, e % 32);
            b[qs + 32 * c + l] |= (self.codes[e] & 15) << (4 * h);
            if q == QType::Q5_K {
                b[16 + l] |= (self.codes[e] >> 4) << (e / 32);
            }
        }
    }

    /// The 256 values as gguf-py computes them (the reference).
    pub(crate) fn dequant(&self, q: QType, out: &mut [f32]) {
        let d = half(&self.d.to_le_bytes(), 0);
        if q == QType::Q6_K {
            for t in 0..16 {
                let scale = d * (self.sc[t] as i8) as f32;
                for i in 0..16 {
                    out[16 * t + i] = scale * (self.codes[16 * t + i] as i32 - 32) as f32;
                }
            }
            return;
        }
        let dmin = half(&self.dmin.to_le_bytes(), 0);
        for s in 0..8 {
            let (scale, min) = (d * self.sc[s] as f32, dmin * self.mn[s] as f32);
            for l in 0..32 {
                out[32 * s + l] = scale * self.codes[32 * s + l] as f32 - min;
            }
        }
    }
}

/// The byte of a panel block holding element e's low nibble, and its shift.
#[inline(always)]
fn nibble_at(lay: Layout, base: usize, row: usize, e: usize) -> (usize, u32) {
    let (s, j) = (e / 32, e % 32);
    (lay.q_byte(base, row, 16 * s + j % 16), 4 * (j / 16) as u32)
}

/// The u32 of `row` in high-bit group g of the panel block at `base`.
#[inline(always)]
fn high_word(p: &[u8], lay: Layout, base: usize, row: usize, g: usize) -> u32 {
    le32(p, base + lay.qh + g * GROUP + 4 * row)
}

/// Row `row` of the panel block at `base` set to the super-block `s`.
pub(crate) fn put(lay: Layout, s: &Super, p: &mut [u8], base: usize, row: usize) {
    let q = lay.q;
    p[base + 2 * row..base + 2 * row + 2].copy_from_slice(&s.d.to_le_bytes());
    if q == QType::Q6_K {
        for t in 0..16 {
            p[base + SC6 + 16 * t + row] = s.sc[t];
        }
    } else {
        p[base + DMIN + 2 * row..base + DMIN + 2 * row + 2].copy_from_slice(&s.dmin.to_le_bytes());
        for i in 0..8 {
            p[base + SC + 16 * i + row] = s.sc[i];
            p[base + MN + 16 * i + row] = s.mn[i];
        }
    }
    for e in 0..QK_K {
        let (at, shift) = nibble_at(lay, base, row, e);
        p[at] = (p[at] & !(15 << shift)) | (s.codes[e] & 15) << shift;
    }
    let (groups, per) = match q {
        QType::Q5_K => (8, 32),
        QType::Q6_K => (16, 16),
        _ => return,
    };
    for g in 0..groups {
        let mut word = 0u32;
        for u in 0..per {
            word |= ((s.codes[g * per + u] >> 4) as u32) << high_shift(q, u);
        }
        let at = base + lay.qh + g * GROUP + 4 * row;
        p[at..at + 4].copy_from_slice(&word.to_le_bytes());
    }
}

/// Where element u of a high-bit group sits in its row's word (see the module docs).
#[inline(always)]
fn high_shift(q: QType, u: usize) -> usize {
    if q == QType::Q5_K {
        8 * (u % 4) + u / 4
    } else {
        8 * (u % 4) + 2 * (u / 4)
    }
}

/// Row `row` of the panel block at `base` as a super-block (`put`'s inverse).
pub(crate) fn get(lay: Layout, p: &[u8], base: usize, row: usize) -> Super {
    let q = lay.q;
    let mut s = Super {
        d: le16(p, base + 2 * row),
        dmin: 0,
        sc: [0; 16],
        mn: [0; 8],
        codes: [0; QK_K],
    };
    if q == QType::Q6_K {
        for t in 0..16 {
            s.sc[t] = p[base + SC6 + 16 * t + row];
        }
    } else {
        s.dmin = le16(p, base + DMIN + 2 * row);
        for i in 0..8 {
            s.sc[i] = p[base + SC + 16 * i + row];
            s.mn[i] = p[base + MN + 16 * i + row];
        }
    }
    for e in 0..QK_K {
        s.codes[e] = code(p, lay, base, row, e);
    }
    s
}

/// The unsigned code of element e of `row` in the panel block at `base`.
#[inline(always)]
fn code(p: &[u8], lay: Layout, base: usize, row: usize, e: usize) -> u8 {
    let (at, shift) = nibble_at(lay, base, row, e);
    let low = (p[at] >> shift) & 15;
    let q = lay.q;
    match q {
        QType::Q5_K => low | (((high_word(p, lay, base, row, e / 32) >> high_shift(q, e % 32)) & 1) as u8) << 4,
        QType::Q6_K => low | (((high_word(p, lay, base, row, e / 16) >> high_shift(q, e % 16)) & 3) as u8) << 4,
        _ => low,
    }
}

/// Element e (0..256) of `row` in the panel block at `base`, gguf-py's value.
#[inline(always)]
pub(crate) fn value(p: &[u8], lay: Layout, base: usize, row: usize, e: usize) -> f32 {
    let d = half(p, base + 2 * row);
    let c = code(p, lay, base, row, e);
    if lay.q == QType::Q6_K {
        let scale = d * (p[base + SC6 + 16 * (e / 16) + row] as i8) as f32;
        return scale * (c as i32 - 32) as f32;
    }
    let s = e / 32;
    let scale = d * p[base + SC + 16 * s + row] as f32;
    let min = half(p, base + DMIN + 2 * row) * p[base + MN + 16 * s + row] as f32;
    scale * c as f32 - min
}

/// The q8 tile, lane by lane in plain Rust (the portable path): the
/// documented order, the integer sums exact.
pub(crate) fn q8_portable(xk: &Q8KRows, p: &[u8], lay: Layout, t: Tile, sums: &mut Sums) {
    let (k, nb, q) = (lay.k, lay.nb, lay.q);
    for w in 0..t.w {
        for r in 0..t.xr {
            let xr = t.r0 + r;
            for row in 0..PANEL {
                let mut acc = 0.0f32;
                for b in 0..nb {
                    let base = lay.base(t.panel + w, b);
                    let xs = &xk.q[xr * k + b * QK_K..xr * k + (b + 1) * QK_K];
                    let dot = |e0: usize, len: usize| -> i32 {
                        (e0..e0 + len)
                            .map(|e| code(p, lay, base, row, e) as i32 * xs[e] as i32)
                            .sum()
                    };
                    let dx = xk.d[xr * nb + b];
                    let d = half(p, base + 2 * row);
                    if q == QType::Q6_K {
                        let mut s = 0i32;
                        for t16 in 0..16 {
                            let sc = p[base + SC6 + 16 * t16 + row] as i8 as i32;
                            s += sc * (dot(16 * t16, 16) - 32 * xk.bsum16[xr * (k / 16) + b * 16 + t16] as i32);
                        }
                        acc = (d * dx).mul_add(s as f32, acc);
                        continue;
                    }
                    let (mut s, mut m) = (0i32, 0i32);
                    for s32 in 0..8 {
                        s += p[base + SC + 16 * s32 + row] as i32 * dot(32 * s32, 32);
                        m += p[base + MN + 16 * s32 + row] as i32 * xk.bsum32[xr * (k / 32) + b * 8 + s32] as i32;
                    }
                    let dmin = half(p, base + DMIN + 2 * row);
                    acc = (d * dx).mul_add(s as f32, acc);
                    acc = (dmin * -dx).mul_add(m as f32, acc);
                }
                sums[w][r][row] = acc;
            }
        }
    }
}

/// A K-quant as a const generic parameter of the tiles (each compiled for
/// one format), and back: `by_kformat!(q, F => body)` runs `body` with the const F of `q`.
#[cfg(target_arch = "x86_64")]
macro_rules! by_kformat {
    ($q:expr, $f:ident => $body:expr) => {
        match $q {
            QType::Q4_K => {
                const $f: u8 = 0;
                $body
            }
            QType::Q5_K => {
                const $f: u8 = 1;
                $body
            }
            _ => {
                const $f: u8 = 2;
                $body
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
const fn kformat(f: u8) -> QType {
    match f {
        0 => QType::Q4_K,
        1 => QType::Q5_K,
        _ => QType::Q6_K,
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    //! The AVX2 tile: a panel as two halves of 8 rows (AVX-512: all 16 rows
    //! a vector, the same operations), per super-block each sub-block's
    //! scale (and min) vectors once, then per element its value lane-wise
    //! and the fused multiply-adds into the XR accumulators in index order.

    use super::*;
    use crate::kernels::x86::{lane_byte_256, lane_byte_512, lead, start_256, start_512};
    use std::arch::x86_64 as v;

    /// `n` (0..32) as a shift count.
    #[inline(always)]
    unsafe fn count(n: usize) -> v::__m128i {
        v::_mm_cvtsi32_si128(n as i32)
    }

    /// Eight bytes (one per row of a half) as float32 lanes, signed or not.
    #[inline(always)]
    unsafe fn bytes_ps(at: *const u8, signed: bool) -> v::__m256 {
        let raw = v::_mm_loadl_epi64(at as *const v::__m128i);
        let wide = if signed {
            v::_mm256_cvtepi8_epi32(raw)
        } else {
            v::_mm256_cvtepu8_epi32(raw)
        };
        v::_mm256_cvtepi32_ps(wide)
    }

    /// Element e of a K-quant panel's 8 rows of `half` as float32 (gguf-py's value).
    #[inline(always)]
    unsafe fn element(
        q: QType,
        base: *const u8,
        lay: Layout,
        half: usize,
        e: usize,
        scale: v::__m256,
        min: v::__m256,
    ) -> v::__m256 {
        let (s, j) = (e / 32, e % 32);
        let idx = 16 * s + j % 16;
        let g = v::_mm256_loadu_si256(base.add(lay.qs + (idx / 4) * GROUP + 32 * half) as *const v::__m256i);
        let shift = 8 * (idx % 4) + 4 * (j / 16);
        let mut c = v::_mm256_and_si256(v::_mm256_srl_epi32(g, count(shift)), v::_mm256_set1_epi32(15));
        if q != QType::Q4_K {
            let (group, bits, at) = if q == QType::Q5_K {
                (s, 1, high_shift(q, j))
            } else {
                (e / 16, 3, high_shift(q, e % 16))
            };
            let h = v::_mm256_loadu_si256(base.add(lay.qh + group * GROUP + 32 * half) as *const v::__m256i);
            let hi = v::_mm256_and_si256(v::_mm256_srl_epi32(h, count(at)), v::_mm256_set1_epi32(bits));
            c = v::_mm256_or_si256(c, v::_mm256_slli_epi32::<4>(hi));
        }
        if q == QType::Q6_K {
            let c = v::_mm256_sub_epi32(c, v::_mm256_set1_epi32(32));
            v::_mm256_mul_ps(scale, v::_mm256_cvtepi32_ps(c))
        } else {
            v::_mm256_fmsub_ps(scale, v::_mm256_cvtepi32_ps(c), min) // exact product: the module docs
        }
    }

    /// Element j of a K-quant panel's 16 rows (the transposed dequantization).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn panel_values(p: &[u8], lay: Layout, panel: usize, j: usize, out: &mut [f32; PANEL]) {
        let (q, e) = (lay.q, j % QK_K);
        let base = p.as_ptr().add(lay.base(panel, j / QK_K));
        for half in 0..2 {
            let (scale, min) = scales(q, base, half, e);
            let vals = element(q, base, lay, half, e, scale, min);
            v::_mm256_storeu_ps(out.as_mut_ptr().add(8 * half), vals);
        }
    }

    /// The scale (and min) vectors of element e's sub-block, 8 rows of `half`.
    #[inline(always)]
    unsafe fn scales(q: QType, base: *const u8, half: usize, e: usize) -> (v::__m256, v::__m256) {
        let d = v::_mm256_cvtph_ps(v::_mm_loadu_si128(base.add(16 * half) as *const v::__m128i));
        if q == QType::Q6_K {
            let sc = bytes_ps(base.add(SC6 + 16 * (e / 16) + 8 * half), true);
            return (v::_mm256_mul_ps(d, sc), v::_mm256_setzero_ps());
        }
        let dmin = v::_mm256_cvtph_ps(v::_mm_loadu_si128(base.add(DMIN + 16 * half) as *const v::__m128i));
        let s = e / 32;
        let sc = bytes_ps(base.add(SC + 16 * s + 8 * half), false);
        let mn = bytes_ps(base.add(MN + 16 * s + 8 * half), false);
        (v::_mm256_mul_ps(d, sc), v::_mm256_mul_ps(dmin, mn))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn f32_avx2(x: &[f32], p: &[u8], lay: Layout, t: Tile, sums: &mut Sums) {
        by_kformat!(lay.q, F => for w in 0..t.w {
            for half in 0..2 {
                match t.xr {
                    1 => half_256::<F, 1>(x, p, lay, t, w, half, sums),
                    2 => half_256::<F, 2>(x, p, lay, t, w, half, sums),
                    3 => half_256::<F, 3>(x, p, lay, t, w, half, sums),
                    4 => half_256::<F, 4>(x, p, lay, t, w, half, sums),
                    5 => half_256::<F, 5>(x, p, lay, t, w, half, sums),
                    6 => half_256::<F, 6>(x, p, lay, t, w, half, sums),
                    7 => half_256::<F, 7>(x, p, lay, t, w, half, sums),
                    8 => half_256::<F, 8>(x, p, lay, t, w, half, sums),
                    xr => unreachable!("{xr} x rows in an AVX2 tile"),
                }
            }
        })
    }

    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn half_256<const F: u8, const XR: usize>(
        x: &[f32],
        p: &[u8],
        lay: Layout,
        t: Tile,
        w: usize,
        half: usize,
        sums: &mut Sums,
    ) {
        let (k, q) = (lay.k, kformat(F));
        let xp = x.as_ptr().add(t.r0 * k);
        let mut acc = start_256::<XR>(t, w, half, sums);
        // a scale covers 32 elements (Q6_K: 16), so sub-blocks of 16 serve all three
        for b in t.b0..t.b1 {
            let base = p.as_ptr().add(lay.base(t.panel + w, b));
            if half == 0 {
                lead(p, base, lay, t, w, b);
            }
            for sub in 0..QK_K / 16 {
                let (scale, min) = scales(q, base, half, 16 * sub);
                for quad in 0..4 {
                    // elements 16·sub + 4·quad + 0..4 (`quad_codes_512` on this half's 8 rows)
                    let (low, high) = quad_codes_256(q, base.add(32 * half), lay, sub, quad);
                    for byte in 0..4 {
                        let e = 16 * sub + 4 * quad + byte;
                        let wv = quad_value_256(q, low, high, byte, scale, min);
                        for r in 0..XR {
                            let xv = v::_mm256_set1_ps(*xp.add(crate::quant::x_index(XR, k, r, b * QK_K + e)));
                            acc[r] = v::_mm256_fmadd_ps(wv, xv, acc[r]);
                        }
                    }
                }
            }
        }
        for r in 0..XR {
            v::_mm256_storeu_ps(sums[w][r].as_mut_ptr().add(8 * half), acc[r]);
        }
    }

    /// `quad_codes_512` on the 8 rows of a half (`at`: the block's bytes
    /// moved to the half's 32 bytes of each group).
    #[inline(always)]
    unsafe fn quad_codes_256(
        q: QType,
        at: *const u8,
        lay: Layout,
        sub: usize,
        quad: usize,
    ) -> (v::__m256i, v::__m256i) {
        let g = v::_mm256_loadu_si256(at.add(lay.qs + (4 * (sub / 2) + quad) * GROUP) as *const v::__m256i);
        let g = if sub % 2 == 1 { v::_mm256_srli_epi32::<4>(g) } else { g };
        let low = v::_mm256_and_si256(g, v::_mm256_set1_epi32(0x0f0f_0f0f));
        if q == QType::Q4_K {
            return (low, v::_mm256_setzero_si256());
        }
        let (group, common, bits) = if q == QType::Q5_K {
            (sub / 2, 4 * (sub % 2) + quad, 0x0101_0101)
        } else {
            (sub, 2 * quad, 0x0303_0303)
        };
        let h = v::_mm256_loadu_si256(at.add(lay.qh + group * GROUP) as *const v::__m256i);
        let high = v::_mm256_and_si256(v::_mm256_srl_epi32(h, count(common)), v::_mm256_set1_epi32(bits));
        (low, high)
    }

    /// `quad_value_512` on 8 rows.
    #[inline(always)]
    unsafe fn quad_value_256(
        q: QType,
        low: v::__m256i,
        high: v::__m256i,
        byte: usize,
        scale: v::__m256,
        min: v::__m256,
    ) -> v::__m256 {
        let mut c = lane_byte_256(low, byte);
        if q != QType::Q4_K {
            c = v::_mm256_or_si256(c, v::_mm256_slli_epi32::<4>(lane_byte_256(high, byte)));
        }
        if q == QType::Q6_K {
            let c = v::_mm256_sub_epi32(c, v::_mm256_set1_epi32(32));
            v::_mm256_mul_ps(scale, v::_mm256_cvtepi32_ps(c))
        } else {
            v::_mm256_fmsub_ps(scale, v::_mm256_cvtepi32_ps(c), min) // as `element`
        }
    }

    // ---- AVX-512: a panel's 16 rows in one vector, the same operations lane-wise

    /// 16 bytes (one per row) as int32 lanes, sign- or zero-extended.
    #[inline(always)]
    pub(super) unsafe fn widen_512(at: *const u8, signed: bool) -> v::__m512i {
        let raw = v::_mm_loadu_si128(at as *const v::__m128i);
        if signed {
            v::_mm512_cvtepi8_epi32(raw)
        } else {
            v::_mm512_cvtepu8_epi32(raw)
        }
    }

    /// 16 bytes (one per row) as float32 lanes, signed or not.
    #[inline(always)]
    unsafe fn bytes_ps_512(at: *const u8, signed: bool) -> v::__m512 {
        v::_mm512_cvtepi32_ps(widen_512(at, signed))
    }

    /// The codes of elements 16·sub + 4·quad + 0..4 of the panel's 16 rows,
    /// each lane's four bytes one element's: (its low 4 bits, its high bits
    /// (Q5_K: 1, Q6_K: 2; Q4_K: none)), each in its byte's low bits. The
    /// elements' shifts in `element` (the AVX2 half's) are 8·byte + a part common to the
    /// four (4·(sub mod 2) for the low bits; Q5_K: 4·(sub mod 2) + quad,
    /// Q6_K: 2·quad for the high ones), taken here once.
    #[inline(always)]
    unsafe fn quad_codes_512(
        q: QType,
        base: *const u8,
        lay: Layout,
        sub: usize,
        quad: usize,
    ) -> (v::__m512i, v::__m512i) {
        // e = 16·sub + 4·quad + byte: s = sub / 2, j = 16·(sub mod 2) + 4·quad + byte,
        // idx = 16·s + 4·quad + byte (group 4·s + quad), low shift 8·byte + 4·(sub mod 2)
        let g = v::_mm512_loadu_si512(base.add(lay.qs + (4 * (sub / 2) + quad) * GROUP) as *const v::__m512i);
        let g = if sub % 2 == 1 { v::_mm512_srli_epi32::<4>(g) } else { g };
        let low = v::_mm512_and_si512(g, v::_mm512_set1_epi32(0x0f0f_0f0f));
        if q == QType::Q4_K {
            return (low, v::_mm512_setzero_si512());
        }
        let (group, common, bits) = if q == QType::Q5_K {
            (sub / 2, 4 * (sub % 2) + quad, 0x0101_0101) // high_shift(Q5_K, j) = 8·byte + j / 4
        } else {
            (sub, 2 * quad, 0x0303_0303) // high_shift(Q6_K, 4·quad + byte) = 8·byte + 2·quad
        };
        let h = v::_mm512_loadu_si512(base.add(lay.qh + group * GROUP) as *const v::__m512i);
        let high = v::_mm512_and_si512(v::_mm512_srl_epi32(h, count(common)), v::_mm512_set1_epi32(bits));
        (low, high)
    }

    /// `quad_codes_512`'s group of a Q4_K quad, shifted to the sub-block's
    /// nibbles but not masked (`vpermps` reads each byte's low 4 bits).
    #[inline(always)]
    unsafe fn q4_k_group_512(base: *const u8, lay: Layout, sub: usize, quad: usize) -> v::__m512i {
        let g = v::_mm512_loadu_si512(base.add(lay.qs + (4 * (sub / 2) + quad) * GROUP) as *const v::__m512i);
        if sub % 2 == 1 {
            v::_mm512_srli_epi32::<4>(g)
        } else {
            g
        }
    }

    /// A Q5_K quad's groups, neither masked: the codes' group as
    /// `q4_k_group_512`, and the fifth bits' group shifted so that element
    /// 4·quad + byte's bit is bit 8·byte (`quad_codes_512` masks them).
    #[inline(always)]
    unsafe fn q5_k_quad_512(base: *const u8, lay: Layout, sub: usize, quad: usize) -> (v::__m512i, v::__m512i) {
        let h = v::_mm512_loadu_si512(base.add(lay.qh + (sub / 2) * GROUP) as *const v::__m512i);
        let common = 4 * (sub % 2) + quad; // high_shift(Q5_K, j) = 8·byte + j / 4
        (
            q4_k_group_512(base, lay, sub, quad),
            v::_mm512_srl_epi32(h, count(common)),
        )
    }

    /// Bit 8·byte of each lane of `h` (`q5_k_quad_512`) moved to bit 4, the
    /// other bits not cleared.
    #[inline(always)]
    unsafe fn fifth_bit_at_4_512(h: v::__m512i, byte: usize) -> v::__m512i {
        match byte {
            0 => v::_mm512_slli_epi32::<4>(h),
            1 => v::_mm512_srli_epi32::<4>(h),
            2 => v::_mm512_srli_epi32::<12>(h),
            _ => v::_mm512_srli_epi32::<20>(h),
        }
    }

    /// Element `byte` of a quad (`quad_codes_512`) as `element` gives it, on 16 rows.
    #[inline(always)]
    unsafe fn quad_value_512(
        q: QType,
        low: v::__m512i,
        high: v::__m512i,
        byte: usize,
        scale: v::__m512,
        min: v::__m512,
    ) -> v::__m512 {
        let mut c = lane_byte_512(low, byte);
        if q != QType::Q4_K {
            c = v::_mm512_or_si512(c, v::_mm512_slli_epi32::<4>(lane_byte_512(high, byte)));
        }
        if q == QType::Q6_K {
            let c = v::_mm512_sub_epi32(c, v::_mm512_set1_epi32(32));
            v::_mm512_mul_ps(scale, v::_mm512_cvtepi32_ps(c))
        } else {
            v::_mm512_fmsub_ps(scale, v::_mm512_cvtepi32_ps(c), min) // as `element`
        }
    }

    /// `scales` on the panel's 16 rows.
    #[inline(always)]
    unsafe fn scales_512(q: QType, base: *const u8, e: usize) -> (v::__m512, v::__m512) {
        let d = v::_mm512_cvtph_ps(v::_mm256_loadu_si256(base as *const v::__m256i));
        if q == QType::Q6_K {
            let sc = bytes_ps_512(base.add(SC6 + 16 * (e / 16)), true);
            return (v::_mm512_mul_ps(d, sc), v::_mm512_setzero_ps());
        }
        let dmin = v::_mm512_cvtph_ps(v::_mm256_loadu_si256(base.add(DMIN) as *const v::__m256i));
        let s = e / 32;
        let sc = bytes_ps_512(base.add(SC + 16 * s), false);
        let mn = bytes_ps_512(base.add(MN + 16 * s), false);
        (v::_mm512_mul_ps(d, sc), v::_mm512_mul_ps(dmin, mn))
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
    pub(crate) unsafe fn f32_avx512(x: &[f32], p: &[u8], lay: Layout, t: Tile, sums: &mut Sums) {
        by_kformat!(lay.q, F => f32_format_512::<F>(x, p, lay, t, sums))
    }

    // one function per format (an unoptimized build's frame stays small)
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
    unsafe fn f32_format_512<const F: u8>(x: &[f32], p: &[u8], lay: Layout, t: Tile, sums: &mut Sums) {
        macro_rules! rows {
            ($($xr:literal)*) => {
                for w in 0..t.w {
                    match t.xr {
                        $($xr => panel_512::<F, $xr>(x, p, lay, t, w, sums),)*
                        xr => unreachable!("{xr} x rows in an AVX-512 K-quant tile"),
                    }
                }
            };
        }
        rows!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16)
    }

    /// `half_256` on the panel's 16 rows at once (the same values, the same fma order).
    #[inline(always)]
    unsafe fn panel_512<const F: u8, const XR: usize>(
        x: &[f32],
        p: &[u8],
        lay: Layout,
        t: Tile,
        w: usize,
        sums: &mut Sums,
    ) {
        let (k, q) = (lay.k, kformat(F));
        let xp = x.as_ptr().add(t.r0 * k);
        let mut acc = start_512::<XR>(t, w, sums);
        // Q4_K: a code's float32 value from a 16-entry table by `vpermps`, which
        // reads the index's low 4 bits (no mask, no conversion; the same value)
        let plain = crate::kernels::x86::nibble_table_512(QType::Q4_1).unwrap_or(v::_mm512_setzero_ps());
        // Q5_K: a 32-entry table (`vpermt2ps`), the index's nibble and fifth bit
        // merged by one `vpternlogd` (bits above 4 are not read)
        let (low5, high5) = crate::kernels::x86::five_bit_tables_512(QType::Q5_1)
            .unwrap_or((v::_mm512_setzero_ps(), v::_mm512_setzero_ps()));
        for b in t.b0..t.b1 {
            let base = p.as_ptr().add(lay.base(t.panel + w, b));
            lead(p, base, lay, t, w, b);
            for sub in 0..QK_K / 16 {
                let (scale, min) = scales_512(q, base, 16 * sub);
                for quad in 0..4 {
                    // elements 16·sub + 4·quad + 0..4: one group's codes, shifted
                    // into each byte's low bits once (`element`'s values, 16 lanes)
                    let (low, high) = match q {
                        QType::Q4_K => (q4_k_group_512(base, lay, sub, quad), v::_mm512_setzero_si512()),
                        QType::Q5_K => q5_k_quad_512(base, lay, sub, quad),
                        _ => quad_codes_512(q, base, lay, sub, quad),
                    };
                    for byte in 0..4 {
                        let e = 16 * sub + 4 * quad + byte;
                        let nibble = crate::kernels::x86::nibble_512(low, 8 * byte);
                        let wv = if q == QType::Q4_K {
                            let code = v::_mm512_permutexvar_ps(nibble, plain);
                            v::_mm512_fmsub_ps(scale, code, min) // as `element`
                        } else if q == QType::Q5_K {
                            let index = v::_mm512_ternarylogic_epi32::<0xE4>(
                                nibble,
                                fifth_bit_at_4_512(high, byte),
                                v::_mm512_set1_epi32(0x0f),
                            );
                            let code = v::_mm512_permutex2var_ps(low5, index, high5);
                            v::_mm512_fmsub_ps(scale, code, min) // as `element`
                        } else {
                            quad_value_512(q, low, high, byte, scale, min)
                        };
                        for r in 0..XR {
                            let xv = v::_mm512_set1_ps(*xp.add(crate::quant::x_index(XR, k, r, b * QK_K + e)));
                            acc[r] = v::_mm512_fmadd_ps(wv, xv, acc[r]);
                        }
                    }
                }
            }
        }
        for r in 0..XR {
            v::_mm512_storeu_ps(sums[w][r].as_mut_ptr(), acc[r]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86_q8 {
    //! The AVX2 q8 tile: a panel as two halves of 8 rows; per 32-element
    //! sub-block the 8 operands (the codes' 4 bytes per row, high bits
    //! or'ed in), then per x row `vpmaddubsw` (code · x pairs, no overflow:
    //! code ≤ 63, |x| ≤ 127) and `vpmaddwd` by the sub-block's scale (the
    //! scale's product folded into the pair sum), summed exactly in int32.

    use super::x86::widen_512;
    use super::*;
    use crate::kernels::x86::{lead, start_256, start_512};
    use std::arch::x86_64 as v;

    /// Eight bytes (one per row of a half) as int32 lanes holding the value
    /// in both int16 halves (a `vpmaddwd` operand), signed or not.
    #[inline(always)]
    unsafe fn pair_scales(at: *const u8, signed: bool) -> v::__m256i {
        let raw = v::_mm_loadl_epi64(at as *const v::__m128i);
        let wide = if signed {
            v::_mm256_cvtepi8_epi32(raw)
        } else {
            v::_mm256_cvtepu8_epi32(raw)
        };
        let low = v::_mm256_and_si256(wide, v::_mm256_set1_epi32(0xffff));
        v::_mm256_or_si256(low, v::_mm256_slli_epi32::<16>(wide))
    }

    /// Two 8-byte runs (scales or mins of two sub-blocks, 8 rows) as int32
    /// lanes holding (a, b) as int16s: the operand that pairs with (x_a, x_b).
    #[inline(always)]
    unsafe fn interleaved(a: *const u8, b: *const u8, signed: bool) -> v::__m256i {
        let (ra, rb) = (
            v::_mm_loadl_epi64(a as *const v::__m128i),
            v::_mm_loadl_epi64(b as *const v::__m128i),
        );
        let (wa, wb) = if signed {
            (v::_mm_cvtepi8_epi16(ra), v::_mm_cvtepi8_epi16(rb))
        } else {
            (v::_mm_cvtepu8_epi16(ra), v::_mm_cvtepu8_epi16(rb))
        };
        v::_mm256_set_m128i(v::_mm_unpackhi_epi16(wa, wb), v::_mm_unpacklo_epi16(wa, wb))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn q8_avx2(xk: &Q8KRows, p: &[u8], lay: Layout, t: Tile, sums: &mut Sums) {
        by_kformat!(lay.q, F => for w in 0..t.w {
            for half in 0..2 {
                match t.xr {
                    1 => half_256::<F, 1>(xk, p, lay, t, w, half, sums),
                    2 => half_256::<F, 2>(xk, p, lay, t, w, half, sums),
                    3 => half_256::<F, 3>(xk, p, lay, t, w, half, sums),
                    4 => half_256::<F, 4>(xk, p, lay, t, w, half, sums),
                    xr => unreachable!("{xr} x rows in an AVX2 q8 tile"),
                }
            }
        })
    }

    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn half_256<const F: u8, const XR: usize>(
        xk: &Q8KRows,
        p: &[u8],
        lay: Layout,
        t: Tile,
        w: usize,
        half: usize,
        sums: &mut Sums,
    ) {
        let (k, nb, q) = (lay.k, lay.nb, kformat(F));
        let six = q == QType::Q6_K;
        let mut acc = start_256::<XR>(t, w, half, sums);
        let low = v::_mm256_set1_epi8(0x0f);
        for b in t.b0..t.b1 {
            let base = p.as_ptr().add(lay.base(t.panel + w, b));
            if half == 0 {
                lead(p, base, lay, t, w, b);
            }
            let mut s = [v::_mm256_setzero_si256(); XR];
            for sub in 0..8 {
                let (sc_lo, sc_hi) = if six {
                    let at = base.add(SC6 + 32 * sub + 8 * half);
                    (pair_scales(at, true), pair_scales(at.add(16), true))
                } else {
                    let sc = pair_scales(base.add(SC + 16 * sub + 8 * half), false);
                    (sc, sc)
                };
                let mut ops = [v::_mm256_setzero_si256(); 8];
                for (i, op) in ops.iter_mut().enumerate() {
                    let g = base.add(lay.qs + (4 * sub + i % 4) * GROUP + 32 * half);
                    let raw = v::_mm256_loadu_si256(g as *const v::__m256i);
                    *op = if i < 4 {
                        v::_mm256_and_si256(raw, low)
                    } else {
                        v::_mm256_and_si256(v::_mm256_srli_epi16::<4>(raw), low)
                    };
                    let high = match q {
                        QType::Q5_K => {
                            let h = base.add(lay.qh + sub * GROUP + 32 * half);
                            let h = v::_mm256_loadu_si256(h as *const v::__m256i);
                            let bits = v::_mm256_srl_epi32(h, v::_mm_cvtsi32_si128(i as i32));
                            v::_mm256_and_si256(bits, v::_mm256_set1_epi32(0x0101_0101))
                        }
                        QType::Q6_K => {
                            let h = base.add(lay.qh + (2 * sub + i / 4) * GROUP + 32 * half);
                            let h = v::_mm256_loadu_si256(h as *const v::__m256i);
                            let bits = v::_mm256_srl_epi32(h, v::_mm_cvtsi32_si128(2 * (i % 4) as i32));
                            v::_mm256_and_si256(bits, v::_mm256_set1_epi32(0x0303_0303))
                        }
                        _ => v::_mm256_setzero_si256(),
                    };
                    *op = v::_mm256_or_si256(*op, v::_mm256_slli_epi32::<4>(high));
                }
                for r in 0..XR {
                    // operand i pairs with x bytes 4i..4i + 4 of the sub-block
                    let xs = xk.q.as_ptr().add((t.r0 + r) * k + b * QK_K + 32 * sub) as *const i32;
                    for i in 0..8 {
                        let pairs = v::_mm256_maddubs_epi16(ops[i], v::_mm256_set1_epi32(*xs.add(i)));
                        let sc = if i < 4 { sc_lo } else { sc_hi };
                        s[r] = v::_mm256_add_epi32(s[r], v::_mm256_madd_epi16(pairs, sc));
                    }
                }
            }
            let d = v::_mm256_cvtph_ps(v::_mm_loadu_si128(base.add(16 * half) as *const v::__m128i));
            let dmin = if six {
                v::_mm256_setzero_ps()
            } else {
                v::_mm256_cvtph_ps(v::_mm_loadu_si128(base.add(DMIN + 16 * half) as *const v::__m128i))
            };
            for r in 0..XR {
                let row = t.r0 + r;
                let dx = *xk.d.get_unchecked(row * nb + b);
                // the corrections: Q6_K 32 · Σ_t sc_t · Σ_{e∈t} x_e; Q4_K, Q5_K Σ_s mn_s · Σ_{e∈s} x_e
                let mut c = v::_mm256_setzero_si256();
                if six {
                    let bs = xk.bsum16.as_ptr().add(row * (k / 16) + b * 16) as *const i32;
                    for u in 0..8 {
                        let at = base.add(SC6 + 32 * u + 8 * half);
                        let sc = interleaved(at, at.add(16), true);
                        c = v::_mm256_add_epi32(c, v::_mm256_madd_epi16(sc, v::_mm256_set1_epi32(*bs.add(u))));
                    }
                    s[r] = v::_mm256_sub_epi32(s[r], v::_mm256_slli_epi32::<5>(c));
                } else {
                    let bs = xk.bsum32.as_ptr().add(row * (k / 32) + b * 8) as *const i32;
                    for u in 0..4 {
                        let at = base.add(MN + 32 * u + 8 * half);
                        let mn = interleaved(at, at.add(16), false);
                        c = v::_mm256_add_epi32(c, v::_mm256_madd_epi16(mn, v::_mm256_set1_epi32(*bs.add(u))));
                    }
                }
                let scale = v::_mm256_mul_ps(d, v::_mm256_set1_ps(dx));
                acc[r] = v::_mm256_fmadd_ps(scale, v::_mm256_cvtepi32_ps(s[r]), acc[r]);
                if !six {
                    let scale = v::_mm256_mul_ps(dmin, v::_mm256_set1_ps(-dx));
                    acc[r] = v::_mm256_fmadd_ps(scale, v::_mm256_cvtepi32_ps(c), acc[r]);
                }
            }
        }
        for r in 0..XR {
            v::_mm256_storeu_ps(sums[w][r].as_mut_ptr().add(8 * half), acc[r]);
        }
    }

    // ---- AVX-512: a panel's 16 rows in one vector, the same operations lane-wise

    /// 16 bytes (one per row) as int32 lanes holding the value in both int16 halves.
    #[inline(always)]
    unsafe fn pair_scales_512(at: *const u8, signed: bool) -> v::__m512i {
        let wide = widen_512(at, signed);
        let low = v::_mm512_and_si512(wide, v::_mm512_set1_epi32(0xffff));
        v::_mm512_or_si512(low, v::_mm512_slli_epi32::<16>(wide))
    }

    /// Two 16-byte runs (16 rows) as int32 lanes holding (a, b) as int16s.
    #[inline(always)]
    unsafe fn interleaved_512(a: *const u8, b: *const u8, signed: bool) -> v::__m512i {
        let low = v::_mm512_and_si512(widen_512(a, signed), v::_mm512_set1_epi32(0xffff));
        v::_mm512_or_si512(low, v::_mm512_slli_epi32::<16>(widen_512(b, signed)))
    }

    /// The AVX-512 q8 tile (`vnni`: the CPU has AVX-512 VNNI).
    pub(crate) unsafe fn q8_avx512(xk: &Q8KRows, p: &[u8], lay: Layout, t: Tile, sums: &mut Sums, vnni: bool) {
        if vnni {
            by_kformat!(lay.q, F => q8_format_512_vnni::<F>(xk, p, lay, t, sums))
        } else {
            by_kformat!(lay.q, F => q8_format_512::<F>(xk, p, lay, t, sums))
        }
    }

    // one function per format and path (an unoptimized build's frame stays small)
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
    unsafe fn q8_format_512<const F: u8>(xk: &Q8KRows, p: &[u8], lay: Layout, t: Tile, sums: &mut Sums) {
        q8_shapes_512::<false, F>(xk, p, lay, t, sums)
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn q8_format_512_vnni<const F: u8>(xk: &Q8KRows, p: &[u8], lay: Layout, t: Tile, sums: &mut Sums) {
        q8_shapes_512::<true, F>(xk, p, lay, t, sums)
    }

    #[inline(always)]
    unsafe fn q8_shapes_512<const VNNI: bool, const F: u8>(
        xk: &Q8KRows,
        p: &[u8],
        lay: Layout,
        t: Tile,
        sums: &mut Sums,
    ) {
        for w in 0..t.w {
            match t.xr {
                1 => panel_512::<VNNI, F, 1>(xk, p, lay, t, w, sums),
                2 => panel_512::<VNNI, F, 2>(xk, p, lay, t, w, sums),
                3 => panel_512::<VNNI, F, 3>(xk, p, lay, t, w, sums),
                4 => panel_512::<VNNI, F, 4>(xk, p, lay, t, w, sums),
                5 => panel_512::<VNNI, F, 5>(xk, p, lay, t, w, sums),
                6 => panel_512::<VNNI, F, 6>(xk, p, lay, t, w, sums),
                7 => panel_512::<VNNI, F, 7>(xk, p, lay, t, w, sums),
                8 => panel_512::<VNNI, F, 8>(xk, p, lay, t, w, sums),
                xr => unreachable!("{xr} x rows in an AVX-512 K-quant q8 tile"),
            }
        }
    }

    /// `half_256` on the panel's 16 rows at once (the same integer sums and
    /// the same scaling order per lane). With VNNI a sub-block's code · x
    /// sums are `vpdpbusd` chains, then times their scale (`vpmulld`):
    /// integers, so the same sums.
    #[inline(always)]
    unsafe fn panel_512<const VNNI: bool, const F: u8, const XR: usize>(
        xk: &Q8KRows,
        p: &[u8],
        lay: Layout,
        t: Tile,
        w: usize,
        sums: &mut Sums,
    ) {
        let (k, nb, q) = (lay.k, lay.nb, kformat(F));
        let six = q == QType::Q6_K;
        let mut acc = start_512::<XR>(t, w, sums);
        let low = v::_mm512_set1_epi8(0x0f);
        for b in t.b0..t.b1 {
            let base = p.as_ptr().add(lay.base(t.panel + w, b));
            lead(p, base, lay, t, w, b);
            let mut s = [v::_mm512_setzero_si512(); XR];
            for sub in 0..8 {
                let (sc_lo, sc_hi) = match (six, VNNI) {
                    (true, false) => {
                        let at = base.add(SC6 + 32 * sub);
                        (pair_scales_512(at, true), pair_scales_512(at.add(16), true))
                    }
                    (true, true) => {
                        let at = base.add(SC6 + 32 * sub);
                        (widen_512(at, true), widen_512(at.add(16), true))
                    }
                    (false, false) => {
                        let sc = pair_scales_512(base.add(SC + 16 * sub), false);
                        (sc, sc)
                    }
                    (false, true) => {
                        let sc = widen_512(base.add(SC + 16 * sub), false);
                        (sc, sc)
                    }
                };
                let mut ops = [v::_mm512_setzero_si512(); 8];
                for (i, op) in ops.iter_mut().enumerate() {
                    let g = base.add(lay.qs + (4 * sub + i % 4) * GROUP);
                    let raw = v::_mm512_loadu_si512(g as *const v::__m512i);
                    *op = if i < 4 {
                        v::_mm512_and_si512(raw, low)
                    } else {
                        v::_mm512_and_si512(v::_mm512_srli_epi16::<4>(raw), low)
                    };
                    let high = match q {
                        QType::Q5_K => {
                            let h = v::_mm512_loadu_si512(base.add(lay.qh + sub * GROUP) as *const v::__m512i);
                            let bits = v::_mm512_srl_epi32(h, v::_mm_cvtsi32_si128(i as i32));
                            v::_mm512_and_si512(bits, v::_mm512_set1_epi32(0x0101_0101))
                        }
                        QType::Q6_K => {
                            let at = base.add(lay.qh + (2 * sub + i / 4) * GROUP);
                            let h = v::_mm512_loadu_si512(at as *const v::__m512i);
                            let bits = v::_mm512_srl_epi32(h, v::_mm_cvtsi32_si128(2 * (i % 4) as i32));
                            v::_mm512_and_si512(bits, v::_mm512_set1_epi32(0x0303_0303))
                        }
                        _ => v::_mm512_setzero_si512(),
                    };
                    *op = v::_mm512_or_si512(*op, v::_mm512_slli_epi32::<4>(high));
                }
                for r in 0..XR {
                    // operand i pairs with x bytes 4i..4i + 4 of the sub-block
                    let xs = xk.q.as_ptr().add((t.r0 + r) * k + b * QK_K + 32 * sub) as *const i32;
                    if VNNI {
                        let (mut lo, mut hi) = (v::_mm512_setzero_si512(), v::_mm512_setzero_si512());
                        for i in 0..4 {
                            lo = v::_mm512_dpbusd_epi32(lo, ops[i], v::_mm512_set1_epi32(*xs.add(i)));
                            hi = v::_mm512_dpbusd_epi32(hi, ops[i + 4], v::_mm512_set1_epi32(*xs.add(i + 4)));
                        }
                        let scaled = if six {
                            v::_mm512_add_epi32(v::_mm512_mullo_epi32(lo, sc_lo), v::_mm512_mullo_epi32(hi, sc_hi))
                        } else {
                            v::_mm512_mullo_epi32(v::_mm512_add_epi32(lo, hi), sc_lo)
                        };
                        s[r] = v::_mm512_add_epi32(s[r], scaled);
                    } else {
                        for i in 0..8 {
                            let pairs = v::_mm512_maddubs_epi16(ops[i], v::_mm512_set1_epi32(*xs.add(i)));
                            let sc = if i < 4 { sc_lo } else { sc_hi };
                            s[r] = v::_mm512_add_epi32(s[r], v::_mm512_madd_epi16(pairs, sc));
                        }
                    }
                }
            }
            let d = v::_mm512_cvtph_ps(v::_mm256_loadu_si256(base as *const v::__m256i));
            let dmin = if six {
                v::_mm512_setzero_ps()
            } else {
                v::_mm512_cvtph_ps(v::_mm256_loadu_si256(base.add(DMIN) as *const v::__m256i))
            };
            for r in 0..XR {
                let row = t.r0 + r;
                let dx = *xk.d.get_unchecked(row * nb + b);
                let mut c = v::_mm512_setzero_si512();
                if six {
                    let bs = xk.bsum16.as_ptr().add(row * (k / 16) + b * 16) as *const i32;
                    for u in 0..8 {
                        let at = base.add(SC6 + 32 * u);
                        let sc = interleaved_512(at, at.add(16), true);
                        c = v::_mm512_add_epi32(c, v::_mm512_madd_epi16(sc, v::_mm512_set1_epi32(*bs.add(u))));
                    }
                    s[r] = v::_mm512_sub_epi32(s[r], v::_mm512_slli_epi32::<5>(c));
                } else {
                    let bs = xk.bsum32.as_ptr().add(row * (k / 32) + b * 8) as *const i32;
                    for u in 0..4 {
                        let at = base.add(MN + 32 * u);
                        let mn = interleaved_512(at, at.add(16), false);
                        c = v::_mm512_add_epi32(c, v::_mm512_madd_epi16(mn, v::_mm512_set1_epi32(*bs.add(u))));
                    }
                }
                let scale = v::_mm512_mul_ps(d, v::_mm512_set1_ps(dx));
                acc[r] = v::_mm512_fmadd_ps(scale, v::_mm512_cvtepi32_ps(s[r]), acc[r]);
                if !six {
                    let scale = v::_mm512_mul_ps(dmin, v::_mm512_set1_ps(-dx));
                    acc[r] = v::_mm512_fmadd_ps(scale, v::_mm512_cvtepi32_ps(c), acc[r]);
                }
            }
        }
        for r in 0..XR {
            v::_mm512_storeu_ps(sums[w][r].as_mut_ptr(), acc[r]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linear::tests::data;
    use crate::quant::tests::{assert_every_path, weight};
    use crate::quant::{pack, Act};

    /// The module docs' claim: (d · sc) · q is exact for every float16 d, scale
    /// sc < 64 and code q < 32, so the fused subtraction of a min rounds as the
    /// separate one.
    #[test]
    fn a_k_quant_codes_product_is_exact_so_its_fused_subtraction_rounds_the_same() {
        for bits in 0..=u16::MAX {
            let d = crate::quant::half(&bits.to_le_bytes(), 0);
            if !d.is_finite() {
                continue; // inf · 0 is NaN either way, inf · q (q > 0) inf
            }
            for sc in [0u32, 1, 2, 3, 5, 17, 31, 32, 33, 47, 62, 63] {
                let scale = d * sc as f32;
                for q in 0..32u32 {
                    let product = scale * q as f32;
                    assert_eq!(product as f64, d as f64 * sc as f64 * q as f64, "d {d} sc {sc} q {q}");
                    for min in [0.0f32, 1.5, -2.0e-3, 7.0e4] {
                        assert_eq!(scale.mul_add(q as f32, -min).to_bits(), (product - min).to_bits());
                    }
                }
            }
        }
    }

    /// The documented q8 order, from the row-major super-blocks and the q8_K rows.
    fn reference_q8(x: &[f32], q: QType, w: &[u8], n: usize, k: usize, m: usize) -> Vec<f32> {
        let xk = Q8KRows::of(x, n, k, false);
        let (rb, bytes, nb) = (q.row_bytes(k).unwrap(), q.block().1, k / QK_K);
        let mut out = vec![0.0f32; n * m];
        for r in 0..n {
            for o in 0..m {
                let mut acc = 0.0f32;
                for b in 0..nb {
                    let s = Super::read(q, &w[o * rb + b * bytes..o * rb + (b + 1) * bytes]);
                    let xs = &xk.q[r * k + b * QK_K..r * k + (b + 1) * QK_K];
                    let dot = |e0: usize, len: usize, offset: i32| -> i32 {
                        (e0..e0 + len)
                            .map(|e| (s.codes[e] as i32 - offset) * xs[e] as i32)
                            .sum()
                    };
                    let (d, dx) = (half(&s.d.to_le_bytes(), 0), xk.d[r * nb + b]);
                    if q == QType::Q6_K {
                        let sum: i32 = (0..16).map(|t| s.sc[t] as i8 as i32 * dot(16 * t, 16, 32)).sum();
                        acc = (d * dx).mul_add(sum as f32, acc);
                    } else {
                        let sum: i32 = (0..8).map(|u| s.sc[u] as i32 * dot(32 * u, 32, 0)).sum();
                        let mins: i32 = (0..8)
                            .map(|u| s.mn[u] as i32 * xs[32 * u..32 * u + 32].iter().map(|&c| c as i32).sum::<i32>())
                            .sum();
                        acc = (d * dx).mul_add(sum as f32, acc);
                        acc = (half(&s.dmin.to_le_bytes(), 0) * -dx).mul_add(mins as f32, acc);
                    }
                }
                out[r * m + o] = acc;
            }
        }
        out
    }

    #[test]
    fn q8_activations_follow_the_documented_order_on_every_path() {
        for q in [QType::Q4_K, QType::Q5_K, QType::Q6_K] {
            for &k in &[256, 768] {
                for &(n, m) in &[(1, 1), (2, 19), (5, 33), (8, 16), (13, 40)] {
                    let (mut x, w) = (data(n * k, 3), weight(q, m, k, 4));
                    x[..256].fill(0.0); // a super-block of zeros: d = 0
                    let packed = pack(&w, q, m, k).unwrap();
                    let want = reference_q8(&x, q, &w, n, k, m);
                    assert_every_path(&x, &packed, q, (n, k, m), Act::Q8, &want);
                }
            }
        }
    }

    #[test]
    fn q8_k_rows_are_ggmls() {
        // the largest magnitude's value sets the scale's sign; ties to even; zeros stay zeros
        let mut x = vec![0.0f32; 512];
        x[3] = -2.0;
        x[4] = 1.0; // 1 · (−127 / −2) = 63.5: to 64 (even)
        x[5] = 0.6;
        x[300] = 4.0;
        x[301] = -4.0; // the first of equal magnitudes is max
        let r = Q8KRows::of(&x, 2, 256, false);
        assert_eq!(r.q, Q8KRows::of(&x, 2, 256, true).q);
        assert_eq!((r.q[3], r.q[4], r.q[5]), (-127, 64, 38));
        assert_eq!(r.d[0], 1.0 / (-127.0f32 / -2.0));
        assert_eq!((r.q[300], r.q[301], r.d[1]), (-127, 127, 1.0 / (-127.0f32 / 4.0)));
        assert_eq!(r.bsum16[0] as i32, -127 + 64 + 38);
        assert_eq!(r.bsum32[0], r.bsum16[0] + r.bsum16[1]);
        let zeros = Q8KRows::of(&[0.0; 256], 1, 256, true);
        assert!(zeros.d[0] == 0.0 && zeros.q.iter().all(|&c| c == 0));
    }
}
