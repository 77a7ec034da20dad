//! What a key-value cache stores: float32, IEEE binary16 (half the bytes a
//! step reads; llama.cpp's default cache type) or q8_0 (ggml's
//! `block_q8_0`: per 32 values a float16 scale d₁₆ and 32 int8 codes, 34
//! bytes: 0.53 of binary16's).
//!
//! A key or value row is rounded to the stored type once, when its position
//! is written, and read back exactly: binary16 to nearest, ties to even
//! (as `vcvtps2ph` and `half::f16::from_f32` both do); q8_0 as ggml's x86
//! `quantize_row_q8_0` quantizes (`q8::Q8Rows`), read as q · d₁₆, a product
//! float32 holds exactly (11 by 8 significant bits). Attention reads every
//! key and value, the block's own included, from the cache, so a position's
//! stored bits are the same whichever step wrote it and however many rows
//! it wrote with it: the forward stays one function of the tokens, batch-
//! and split-invariant, with any type. A binary16 value (or q8_0 scale)
//! past ±65,504 is stored as ±∞.

use half::f16;

/// The stored names, as the Python API spells them.
pub const NAMES: [&str; 3] = ["f32", "f16", "q8_0"];

/// Values per q8_0 block, and its bytes (scale, then codes).
pub const Q8_BLOCK: usize = 32;
pub const Q8_BYTES: usize = 34;

/// One byte of a q8_0 row (a marker type: the rows' layout is `Q8_BYTES`
/// per `Q8_BLOCK` values).
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct Q8(pub u8);

/// One sequence's keys and values in one layer, both of one stored type.
pub enum Kv<'a> {
    F32 { keys: &'a mut [f32], values: &'a mut [f32] },
    F16 { keys: &'a mut [f16], values: &'a mut [f16] },
    Q8 { keys: &'a mut [u8], values: &'a mut [u8] },
}

impl Kv<'_> {
    /// (keys, values) elements held.
    pub fn lens(&self) -> (usize, usize) {
        match self {
            Kv::F32 { keys, values } => (keys.len(), values.len()),
            Kv::F16 { keys, values } => (keys.len(), values.len()),
            Kv::Q8 { keys, values } => (keys.len(), values.len()),
        }
    }

    /// The stored type's name ("f32", "f16", "q8_0").
    pub fn name(&self) -> &'static str {
        match self {
            Kv::F32 { .. } => NAMES[0],
            Kv::F16 { .. } => NAMES[1],
            Kv::Q8 { .. } => NAMES[2],
        }
    }

    /// Elements a row of d values takes (q8_0: d a multiple of 32).
    pub fn row_len(&self, d: usize) -> usize {
        match self {
            Kv::F32 { .. } => f32::row_len(d),
            Kv::F16 { .. } => f16::row_len(d),
            Kv::Q8 { .. } => Q8::row_len(d),
        }
    }

    /// `key` and `value` (d each) stored as row `row` (rounded to the stored type).
    pub fn write(&mut self, row: usize, key: &[f32], value: &[f32]) {
        use half::slice::HalfFloatSliceExt;
        let d = key.len();
        match self {
            Kv::F32 { keys, values } => {
                keys[row * d..(row + 1) * d].copy_from_slice(key);
                values[row * d..(row + 1) * d].copy_from_slice(value);
            }
            Kv::F16 { keys, values } => {
                keys[row * d..(row + 1) * d].convert_from_f32_slice(key);
                values[row * d..(row + 1) * d].convert_from_f32_slice(value);
            }
            Kv::Q8 { keys, values } => {
                let w = Q8::row_len(d);
                q8_row(key, &mut keys[row * w..(row + 1) * w]);
                q8_row(value, &mut values[row * w..(row + 1) * w]);
            }
        }
    }

    /// One position's keys and values of every key-value head (`keys`,
    /// `values`: heads · d each, head by head) stored as the rows
    /// h · `capacity` + `pos`: the bits `write` stores row by row (a q8_0
    /// cache quantizes each 32-block alone), the keys and values each
    /// quantized in one call.
    pub fn write_position(&mut self, capacity: usize, pos: usize, d: usize, keys: &[f32], values: &[f32]) {
        let heads = keys.len() / d;
        match self {
            Kv::Q8 { keys: ks, values: vs } => {
                let w = Q8::row_len(d);
                let per = d / Q8_BLOCK;
                for (x, out) in [(keys, ks), (values, vs)] {
                    let q = crate::q8::Q8Rows::of(x, 1, x.len(), false, true);
                    for h in 0..heads {
                        let row = h * capacity + pos;
                        q8_blocks(&q, h * per, &mut out[row * w..(row + 1) * w]);
                    }
                }
            }
            _ => {
                for h in 0..heads {
                    let (k, v) = (&keys[h * d..(h + 1) * d], &values[h * d..(h + 1) * d]);
                    self.write(h * capacity + pos, k, v);
                }
            }
        }
    }
}

/// `x` (d, a multiple of 32) as q8_0 blocks into `out` (d / 32 · 34 bytes).
fn q8_row(x: &[f32], out: &mut [u8]) {
    q8_blocks(&crate::q8::Q8Rows::of(x, 1, x.len(), false, true), 0, out);
}

/// The quantized blocks `first`.. of `q` as q8_0 bytes into `out` (34 bytes a block).
fn q8_blocks(q: &crate::q8::Q8Rows, first: usize, out: &mut [u8]) {
    for (b, block) in out.chunks_exact_mut(Q8_BYTES).enumerate() {
        let at = first + b;
        let scale = crate::q8::f32_to_f16(q.d[at]);
        block[..2].copy_from_slice(&scale.to_le_bytes());
        for (byte, code) in block[2..].iter_mut().zip(&q.q[at * Q8_BLOCK..(at + 1) * Q8_BLOCK]) {
            *byte = *code as u8;
        }
    }
}

/// A stored element type as the attention kernels read it: rows of d values.
pub trait Stored: Copy + Send + Sync + 'static {
    /// Elements a row of d values takes.
    fn row_len(d: usize) -> usize;
    /// Value c of the row at `row`, its exact float32 value.
    ///
    /// # Safety
    /// `row` points at a whole row holding value c.
    unsafe fn get(row: *const Self, c: usize) -> f32;
}

impl Stored for f32 {
    #[inline(always)]
    fn row_len(d: usize) -> usize {
        d
    }
    #[inline(always)]
    unsafe fn get(row: *const f32, c: usize) -> f32 {
        *row.add(c)
    }
}

impl Stored for f16 {
    #[inline(always)]
    fn row_len(d: usize) -> usize {
        d
    }
    #[inline(always)]
    unsafe fn get(row: *const f16, c: usize) -> f32 {
        (*row.add(c)).to_f32()
    }
}

impl Q8 {
    /// The float16 scale bits of the block holding value c, and where its codes start.
    #[inline(always)]
    unsafe fn block(row: *const Q8, c: usize) -> (u16, *const i8) {
        let p = (row as *const u8).add(c / Q8_BLOCK * Q8_BYTES);
        (u16::from_le_bytes([*p, *p.add(1)]), p.add(2) as *const i8)
    }
}

impl Stored for Q8 {
    #[inline(always)]
    fn row_len(d: usize) -> usize {
        d / Q8_BLOCK * Q8_BYTES
    }
    #[inline(always)]
    unsafe fn get(row: *const Q8, c: usize) -> f32 {
        let (bits, codes) = Q8::block(row, c);
        *codes.add(c % Q8_BLOCK) as f32 * crate::q8::f16_to_f32(bits)
    }
}

/// Vector loads of stored values as float32 lanes.
#[cfg(target_arch = "x86_64")]
pub trait Lanes: Stored {
    /// Values c..c + 16 of the row at `row` (c a multiple of 16).
    ///
    /// # Safety
    /// `row` points at a whole row; the caller's function enables AVX-512F.
    unsafe fn load16(row: *const Self, c: usize) -> std::arch::x86_64::__m512;
    /// Values c..c + 8 of the row at `row` (c a multiple of 8).
    ///
    /// # Safety
    /// `row` points at a whole row; the caller's function enables AVX2 and F16C.
    unsafe fn load8(row: *const Self, c: usize) -> std::arch::x86_64::__m256;
}

/// Elsewhere the kernels read values one by one (`Stored::get`).
#[cfg(not(target_arch = "x86_64"))]
pub trait Lanes: Stored {}
#[cfg(not(target_arch = "x86_64"))]
impl<T: Stored> Lanes for T {}

#[cfg(target_arch = "x86_64")]
impl Lanes for f32 {
    #[inline(always)]
    unsafe fn load16(row: *const f32, c: usize) -> std::arch::x86_64::__m512 {
        std::arch::x86_64::_mm512_loadu_ps(row.add(c))
    }
    #[inline(always)]
    unsafe fn load8(row: *const f32, c: usize) -> std::arch::x86_64::__m256 {
        std::arch::x86_64::_mm256_loadu_ps(row.add(c))
    }
}

#[cfg(target_arch = "x86_64")]
impl Lanes for f16 {
    #[inline(always)]
    unsafe fn load16(row: *const f16, c: usize) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64 as v;
        v::_mm512_cvtph_ps(v::_mm256_loadu_si256(row.add(c) as *const v::__m256i))
    }
    #[inline(always)]
    unsafe fn load8(row: *const f16, c: usize) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64 as v;
        v::_mm256_cvtph_ps(v::_mm_loadu_si128(row.add(c) as *const v::__m128i))
    }
}

#[cfg(target_arch = "x86_64")]
impl Lanes for Q8 {
    #[inline(always)]
    unsafe fn load16(row: *const Q8, c: usize) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64 as v;
        let (bits, codes) = Q8::block(row, c);
        let scale = v::_mm512_cvtph_ps(v::_mm256_set1_epi16(bits as i16)); // exact, as `Stored::get`
        let q = v::_mm_loadu_si128(codes.add(c % Q8_BLOCK) as *const v::__m128i);
        v::_mm512_mul_ps(v::_mm512_cvtepi32_ps(v::_mm512_cvtepi8_epi32(q)), scale)
    }
    #[inline(always)]
    unsafe fn load8(row: *const Q8, c: usize) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64 as v;
        let (bits, codes) = Q8::block(row, c);
        let scale = v::_mm256_cvtph_ps(v::_mm_set1_epi16(bits as i16));
        let q = v::_mm_loadl_epi64(codes.add(c % Q8_BLOCK) as *const v::__m128i);
        v::_mm256_mul_ps(v::_mm256_cvtepi32_ps(v::_mm256_cvtepi8_epi32(q)), scale)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xs() -> Vec<f32> {
        (0..64)
            .map(|i| (i as f32 - 31.5) * 0.1234567 + 1e-4 * i as f32)
            .collect()
    }

    /// Writing rounds once; reading gives those values back on every load
    /// (scalar, 8 and 16 lanes).
    #[test]
    fn a_stored_half_reads_back_as_written() {
        let xs = xs();
        let (mut k, mut v) = (vec![f16::ZERO; 64], vec![f16::ZERO; 64]);
        let mut kv = Kv::F16 {
            keys: &mut k,
            values: &mut v,
        };
        kv.write(1, &xs[..32], &xs[32..]);
        assert_eq!((kv.lens(), kv.name(), kv.row_len(32)), ((64, 64), "f16", 32));
        for (x, h) in xs[..32].iter().zip(&k[32..]) {
            assert_eq!(h.to_bits(), f16::from_f32(*x).to_bits());
            assert!((h.to_f32() - x).abs() <= x.abs() * 2f32.powi(-11) + 1e-7);
        }
        // 65,520 rounds up to +∞, 65,504 is the largest finite value
        assert!(f16::from_f32(65_520.0).to_f32().is_infinite());
        assert_eq!(f16::from_f32(65_504.0).to_f32(), 65_504.0);
        same_on_every_load(k.as_ptr(), 64);
    }

    /// A position written for every head at once stores what `write` stores
    /// head by head, in every stored type (3 heads of 64, capacity 4, position 2).
    #[test]
    fn a_position_of_every_head_is_its_rows() {
        let (d, heads, capacity, pos) = (64, 3, 4, 2);
        let keys: Vec<f32> = (0..heads * d).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        let values: Vec<f32> = keys.iter().map(|x| 3.0 - x * 1.5).collect();
        let len = |w: usize| heads * capacity * w;
        macro_rules! both {
            ($variant:ident, $zero:expr, $w:expr) => {{
                let (mut a, mut b) = (
                    (vec![$zero; len($w)], vec![$zero; len($w)]),
                    (vec![$zero; len($w)], vec![$zero; len($w)]),
                );
                Kv::$variant {
                    keys: &mut a.0,
                    values: &mut a.1,
                }
                .write_position(capacity, pos, d, &keys, &values);
                let mut one = Kv::$variant {
                    keys: &mut b.0,
                    values: &mut b.1,
                };
                for h in 0..heads {
                    one.write(
                        h * capacity + pos,
                        &keys[h * d..(h + 1) * d],
                        &values[h * d..(h + 1) * d],
                    );
                }
                assert!(a == b && a.0.iter().any(|x| *x != $zero) && a.1.iter().any(|x| *x != $zero));
            }};
        }
        both!(F32, 0.0f32, d);
        both!(F16, f16::ZERO, d);
        both!(Q8, 0u8, Q8::row_len(d));
    }

    /// A q8_0 row: ggml's blocks (a float16 scale amax / 127, codes
    /// round(x · 127 / amax)), read back as code · scale on every load.
    #[test]
    fn a_stored_q8_row_reads_back_as_its_blocks() {
        let xs = xs();
        let (mut k, mut v) = (vec![0u8; 2 * 68], vec![0u8; 2 * 68]);
        let mut kv = Kv::Q8 {
            keys: &mut k,
            values: &mut v,
        };
        kv.write(1, &xs, &xs);
        assert_eq!((kv.name(), kv.row_len(64)), ("q8_0", 68));
        let row = k[68..].as_ptr() as *const Q8;
        for b in 0..2 {
            let block = &xs[b * 32..(b + 1) * 32];
            let amax = block.iter().fold(0.0f32, |a, x| a.max(x.abs()));
            let scale = crate::q8::f16_to_f32(crate::q8::f32_to_f16(amax / 127.0));
            for (j, x) in block.iter().enumerate() {
                let code = (x * (127.0 / amax)).round_ties_even();
                let got = unsafe { Q8::get(row, b * 32 + j) };
                assert_eq!(got.to_bits(), (code * scale).to_bits(), "value {}", b * 32 + j);
                assert!((got - x).abs() <= scale * 0.5 + amax * 1e-3);
            }
        }
        assert!(k[..68].iter().all(|&b| b == 0), "row 0 untouched");
        same_on_every_load(row, 64);
    }

    /// Every vector load gives `Stored::get`'s values.
    fn same_on_every_load<T: Lanes>(row: *const T, d: usize) {
        let want: Vec<u32> = (0..d).map(|c| unsafe { T::get(row, c) }.to_bits()).collect();
        #[cfg(target_arch = "x86_64")]
        {
            if crate::quant::path_available(crate::quant::Path::Avx2) {
                let got = unsafe { eights(row, d) };
                assert_eq!(got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want);
            }
            if crate::quant::path_available(crate::quant::Path::Avx512) {
                let got = unsafe { sixteens(row, d) };
                assert_eq!(got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want);
            }
        }
        let _ = want;
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn eights<T: Lanes>(row: *const T, d: usize) -> Vec<f32> {
        let mut out = vec![0.0f32; d];
        for c in (0..d).step_by(8) {
            std::arch::x86_64::_mm256_storeu_ps(out.as_mut_ptr().add(c), T::load8(row, c));
        }
        out
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn sixteens<T: Lanes>(row: *const T, d: usize) -> Vec<f32> {
        let mut out = vec![0.0f32; d];
        for c in (0..d).step_by(16) {
            std::arch::x86_64::_mm512_storeu_ps(out.as_mut_ptr().add(c), T::load16(row, c));
        }
        out
    }
}
