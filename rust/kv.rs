//! What a key-value cache stores: float32, or IEEE binary16 (half the
//! bytes a step reads; llama.cpp's default cache type).
//!
//! A key or value is rounded to the stored type once, when its position is
//! written (binary16: to nearest, ties to even, as `vcvtps2ph` and
//! `half::f16::from_f32` both do), and read back exactly (every binary16
//! is a float32). Attention reads every key and value, the block's own
//! included, from the cache, so a position's stored bits are the same
//! whichever step wrote it and however many rows it wrote with it: the
//! forward stays one function of the tokens, batch- and split-invariant,
//! with either type. A binary16 value past ±65,504 is stored as ±∞.

use half::f16;

/// The stored names, as the Python API spells them.
pub const NAMES: [&str; 2] = ["f32", "f16"];

/// One sequence's keys and values in one layer, both of one stored type.
pub enum Kv<'a> {
    F32 { keys: &'a mut [f32], values: &'a mut [f32] },
    F16 { keys: &'a mut [f16], values: &'a mut [f16] },
}

impl Kv<'_> {
    /// (keys, values) elements held.
    pub fn lens(&self) -> (usize, usize) {
        match self {
            Kv::F32 { keys, values } => (keys.len(), values.len()),
            Kv::F16 { keys, values } => (keys.len(), values.len()),
        }
    }

    /// The stored type's name ("f32", "f16").
    pub fn name(&self) -> &'static str {
        match self {
            Kv::F32 { .. } => NAMES[0],
            Kv::F16 { .. } => NAMES[1],
        }
    }

    /// `key` and `value` (d each) stored at element `to` (rounded to the stored type).
    pub fn write(&mut self, to: usize, key: &[f32], value: &[f32]) {
        use half::slice::HalfFloatSliceExt;
        let d = key.len();
        match self {
            Kv::F32 { keys, values } => {
                keys[to..to + d].copy_from_slice(key);
                values[to..to + d].copy_from_slice(value);
            }
            Kv::F16 { keys, values } => {
                keys[to..to + d].convert_from_f32_slice(key);
                values[to..to + d].convert_from_f32_slice(value);
            }
        }
    }
}

/// A stored element as the attention kernels read it.
pub trait Stored: Copy + Send + Sync + 'static {
    /// The element's exact float32 value.
    fn get(self) -> f32;
}

impl Stored for f32 {
    #[inline(always)]
    fn get(self) -> f32 {
        self
    }
}

impl Stored for f16 {
    #[inline(always)]
    fn get(self) -> f32 {
        self.to_f32()
    }
}

/// Vector loads of stored elements as float32 lanes.
#[cfg(target_arch = "x86_64")]
pub trait Lanes: Stored {
    /// 16 elements from `p`.
    ///
    /// # Safety
    /// `p` points at 16 readable elements; the caller's function enables AVX-512F.
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512;
    /// 8 elements from `p`.
    ///
    /// # Safety
    /// `p` points at 8 readable elements; the caller's function enables AVX2 and F16C.
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
}

/// Elsewhere the kernels read elements one by one (`Stored::get`).
#[cfg(not(target_arch = "x86_64"))]
pub trait Lanes: Stored {}
#[cfg(not(target_arch = "x86_64"))]
impl<T: Stored> Lanes for T {}

#[cfg(target_arch = "x86_64")]
impl Lanes for f32 {
    #[inline(always)]
    unsafe fn load16(p: *const f32) -> std::arch::x86_64::__m512 {
        std::arch::x86_64::_mm512_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> std::arch::x86_64::__m256 {
        std::arch::x86_64::_mm256_loadu_ps(p)
    }
}

#[cfg(target_arch = "x86_64")]
impl Lanes for f16 {
    #[inline(always)]
    unsafe fn load16(p: *const f16) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64 as v;
        v::_mm512_cvtph_ps(v::_mm256_loadu_si256(p as *const v::__m256i))
    }
    #[inline(always)]
    unsafe fn load8(p: *const f16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64 as v;
        v::_mm256_cvtph_ps(v::_mm_loadu_si128(p as *const v::__m128i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writing rounds to nearest even once; reading gives those bits back
    /// on every load (scalar, 8 and 16 lanes).
    #[test]
    fn a_stored_half_reads_back_as_written() {
        let xs: Vec<f32> = (0..64)
            .map(|i| (i as f32 - 31.5) * 0.1234567 + 1e-4 * i as f32)
            .collect();
        let (mut k, mut v) = (vec![f16::ZERO; 64], vec![f16::ZERO; 64]);
        let mut kv = Kv::F16 {
            keys: &mut k,
            values: &mut v,
        };
        kv.write(0, &xs, &xs);
        assert_eq!(kv.lens(), (64, 64));
        assert_eq!(kv.name(), "f16");
        for (x, h) in xs.iter().zip(&k) {
            assert_eq!(h.to_bits(), f16::from_f32(*x).to_bits());
            assert!((h.get() - x).abs() <= x.abs() * 2f32.powi(-11) + 1e-7);
        }
        // 65,520 rounds up to +∞, 65,504 is the largest finite value
        assert!(f16::from_f32(65_520.0).to_f32().is_infinite());
        assert_eq!(f16::from_f32(65_504.0).to_f32(), 65_504.0);
        #[cfg(target_arch = "x86_64")]
        if crate::quant::path_available(crate::quant::Path::Avx2) {
            let got = unsafe { eight(&k) };
            for (a, h) in got.iter().zip(&k) {
                assert_eq!(a.to_bits(), h.get().to_bits());
            }
        }
        #[cfg(target_arch = "x86_64")]
        if crate::quant::path_available(crate::quant::Path::Avx512) {
            let got = unsafe { sixteen(&k) };
            for (a, h) in got.iter().zip(&k) {
                assert_eq!(a.to_bits(), h.get().to_bits());
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn eight(k: &[f16]) -> [f32; 16] {
        let mut out = [0.0f32; 16];
        for h in 0..2 {
            std::arch::x86_64::_mm256_storeu_ps(out.as_mut_ptr().add(8 * h), f16::load8(k.as_ptr().add(8 * h)));
        }
        out
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn sixteen(k: &[f16]) -> [f32; 16] {
        let mut out = [0.0f32; 16];
        std::arch::x86_64::_mm512_storeu_ps(out.as_mut_ptr(), f16::load16(k.as_ptr()));
        out
    }
}
