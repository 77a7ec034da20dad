//! The tiles of `quant::qlinear`: W panels of 16 weight rows against XR
//! rows of x, in the order `quant.rs` documents, on each instruction path.
//!
//! A lane holds one weight row, so a vector op works on 16 rows (8 on
//! AVX2) at once and each output's chain of operations runs in its own
//! lane, in index order: the result cannot depend on the tile's shape,
//! the thread split or the path. With float32 activations, element j of
//! the panel's rows is dequantized into one vector (gguf-py's operations
//! lane-wise) and multiplied into the XR accumulators (x[r, j]
//! broadcast); with q8 activations, a group's 4 bytes per row are what one
//! `vpdpbusd` (or `vpmaddubsw` + `vpmaddwd`) multiplies with 4 bytes of a
//! quantized x row, the block's integer sum is exact (so its partial sums
//! may be added in any order), then scaled into the float accumulator.
//!
//! Over 400 lines: two activation kinds on three vector widths with one
//! order, which must agree bit for bit; kept in one file to be read together.

// Index loops over lanes, rows and panels read like the order they document.
#![allow(clippy::needless_range_loop)]

use crate::q8::{f16_to_f32, Q8Rows};
use crate::quant::{code, value, x_index, Layout, Path, QType, Quantized, Sums, GROUP, PANEL, QK, STRIPE, WMAX, XMAX};

/// A tile: x rows r0..r0 + xr against panels panel..panel + w (float32
/// x: as `quant::interleave` lays them, `quant::x_index`).
#[derive(Clone, Copy)]
pub(crate) struct Tile {
    pub r0: usize,
    pub xr: usize,
    pub panel: usize,
    pub w: usize,
    /// The tile asks the memory for blocks ahead: a stripe's first tile its
    /// stripe's (`prefetch`), a chunked tile of a first pass its own panels'.
    pub lead: bool,
    /// A leading tile asks for its own panels' blocks (a chunked walk), not
    /// the stripe's.
    pub own: bool,
    /// Blocks b0..b1 of the panels (all of them unless `chunk_blocks` is Some);
    /// past the first chunk the accumulators start from `sums`.
    pub b0: usize,
    pub b1: usize,
}

/// Blocks per chunk when a stripe is walked by several tiles, or None
/// (the tiles of `q` on `path` walk all their blocks at once).
///
/// A stripe walked by one tile per panel pulls its 4 panels' bytes from
/// memory during the first tile and none during the other three, so the
/// memory waits for the arithmetic and the arithmetic for the memory. In
/// chunks, the tiles take turns over the chunk's blocks, each asking the
/// memory for its own panels' next blocks: one even stream. An
/// accumulator's chain stays in block order (stored and reloaded between
/// chunks, exactly), so the sums keep their bits.
pub(crate) fn chunk_blocks(path: Path, q: QType) -> Option<usize> {
    match (path.vector(), q.blocked(), q.kquant()) {
        (true, true, _) => Some(CHUNK),
        (true, _, true) => Some(1),
        _ => None,
    }
}

/// Blocks of a chunk (`chunk_blocks`; a K-quant's: one super-block): the
/// tiles ask for the blocks `AHEAD` = 8 on, so for the next chunk (measured
/// on a Zen 4 host: 4 and 8 alike, 16 no better).
pub(crate) const CHUNK: usize = 8;

/// A format as a const generic parameter (so each tile is compiled for one
/// format, its branches resolved), and back.
const fn format(f: u8) -> QType {
    match f {
        0 => QType::Q8_0,
        1 => QType::Q4_0,
        2 => QType::Q4_1,
        3 => QType::F32,
        4 => QType::F16,
        5 => QType::BF16,
        6 => QType::Q5_0,
        7 => QType::Q5_1,
        _ => QType::IQ4_NL,
    }
}

/// `$body` with the const F of `q` (the K-quants have their own tiles, `kquant.rs`).
macro_rules! by_format {
    ($q:expr, $f:ident => $body:expr) => {
        match $q {
            QType::Q8_0 => {
                const $f: u8 = 0;
                $body
            }
            QType::Q4_0 => {
                const $f: u8 = 1;
                $body
            }
            QType::Q4_1 => {
                const $f: u8 = 2;
                $body
            }
            QType::F32 => {
                const $f: u8 = 3;
                $body
            }
            QType::F16 => {
                const $f: u8 = 4;
                $body
            }
            QType::BF16 => {
                const $f: u8 = 5;
                $body
            }
            QType::Q5_0 => {
                const $f: u8 = 6;
                $body
            }
            QType::Q5_1 => {
                const $f: u8 = 7;
                $body
            }
            QType::IQ4_NL => {
                const $f: u8 = 8;
                $body
            }
            q => unreachable!("{q:?} has its own tiles (kquant.rs)"),
        }
    };
}

/// The most x rows one pass of a tile of format `q` takes on `path` (registers).
pub(crate) fn x_rows(path: Path, q8: bool, q: QType) -> usize {
    if path.avx512() && q8 && q.kquant() {
        return 8; // its integer sums and accumulators: 2 · 8 of the 32 registers
    }
    if q8 && q8_by_operand(path, q) {
        return Q8_OPERAND_ROWS;
    }
    match (path.avx512(), path.vector(), q8) {
        (true, _, false) => XMAX,
        (true, _, true) => XMAX,
        (false, true, false) => 8,
        (false, true, true) => 4,
        _ => XMAX,
    }
}

/// Panels per tile for passes of `xr` x rows: enough independent
/// accumulators to hide the multiply-add latency, few enough for the registers.
pub(crate) fn panels_per_tile(path: Path, xr: usize, q8: bool, q: QType) -> usize {
    if !path.avx512() {
        return 1;
    }
    match (xr, q8) {
        (1, _) => 4,
        (2, _) => 2,
        (3..=8, false) => 2,
        (3.., true) if q8_by_operand(path, q) => 2,
        // x's broadcasts shared by the two panels (`q8_tile_512`); not Q8_0,
        // whose two panels' bytes streamed read 1.08-1.10x slower at 3-4 rows
        (3..=5, true) if !q.kquant() && q != QType::Q8_0 => 2,
        _ => 1,
    }
}

/// Whether q8 tiles of `q` on `path` walk two panels operand by operand
/// (`x86::q8_tile_512_by_operand`) at 3 to `Q8_OPERAND_ROWS` x rows: the
/// 32-block formats with VNNI. One weight (1536 × 576) in L2, one thread,
/// Intel family 6 model 207, cycles per 16-row block and x row against the
/// tiles before (`q8_tile_512`: two panels at 3–5 rows, one at 6–16): Q4_1
/// 10.0–10.9 → 8.8–9.5 at 5 rows, 8.7–9.6 → 7.6–8.2 at 8, 8.4–9.0 → 7.4–7.5
/// at 17 (9 + 8); Q8_0 14–15 → 11.6–11.8 at 3. 16 rows go as 8 + 8: one pass of
/// 16 would hold 32 chains and accumulators, more than the registers.
/// Without VNNI (`vpmaddubsw` + `vpmaddwd`, more registers a step) the
/// tiles before stay: this walk read 5–40% slower there.
pub(crate) fn q8_by_operand(path: Path, q: QType) -> bool {
    path == Path::Avx512Vnni && q.blocked()
}

/// The most x rows of a pass of `q8_by_operand`'s tiles.
const Q8_OPERAND_ROWS: usize = 9;

/// The tile's sums into `sums[panel][x row][lane]`.
pub(crate) fn tile(x: &[f32], xq: Quantized<'_>, p: &[u8], lay: Layout, t: Tile, path: Path, sums: &mut Sums) {
    debug_assert!(t.w <= WMAX && t.xr <= XMAX);
    if lay.q.kquant() {
        return kquant_tile(x, xq, p, lay, t, path, sums);
    }
    match (path, xq.q8) {
        #[cfg(target_arch = "x86_64")]
        (Path::Avx512 | Path::Avx512Vnni, None) => unsafe { x86::f32_avx512(x, p, lay, t, sums) },
        #[cfg(target_arch = "x86_64")]
        (Path::Avx512Vnni, Some(xq)) => unsafe { x86::q8_avx512_vnni(xq, p, lay, t, sums) },
        #[cfg(target_arch = "x86_64")]
        (Path::Avx512, Some(xq)) => unsafe { x86::q8_avx512(xq, p, lay, t, sums) },
        #[cfg(target_arch = "x86_64")]
        (Path::Avx2 | Path::Avx2Vnni, None) => unsafe { x86::f32_avx2(x, p, lay, t, sums) },
        #[cfg(target_arch = "x86_64")]
        (Path::Avx2Vnni, Some(xq)) => unsafe { x86::q8_avx2_vnni(xq, p, lay, t, sums) },
        #[cfg(target_arch = "x86_64")]
        (Path::Avx2, Some(xq)) => unsafe { x86::q8_avx2(xq, p, lay, t, sums) },
        (_, None) => f32_portable(x, p, lay, t, sums),
        (_, Some(xq)) => q8_portable(xq, p, lay, t, sums),
    }
}

/// A K-quant's tile (`kquant.rs`): float32 or q8_K activations.
fn kquant_tile(x: &[f32], xq: Quantized<'_>, p: &[u8], lay: Layout, t: Tile, path: Path, sums: &mut Sums) {
    #[cfg(target_arch = "x86_64")]
    if path.avx512() {
        // SAFETY: the AVX-512 path is available (checked by qlinear).
        return unsafe {
            match xq.q8k {
                Some(xk) => crate::kquant::x86_q8::q8_avx512(xk, p, lay, t, sums, path == Path::Avx512Vnni),
                None => crate::kquant::x86::f32_avx512(x, p, lay, t, sums),
            }
        };
    }
    match (path.vector(), xq.q8k) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the path (AVX2 or wider) is available (checked by qlinear).
        (true, None) => unsafe { crate::kquant::x86::f32_avx2(x, p, lay, t, sums) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        (true, Some(xk)) => unsafe { crate::kquant::x86_q8::q8_avx2(xk, p, lay, t, sums) },
        (_, None) => f32_portable(x, p, lay, t, sums),
        (_, Some(xk)) => crate::kquant::q8_portable(xk, p, lay, t, sums),
    }
}

/// One pass's xr rows of k (`rows`, row-major) side by side into `to`:
/// element j of row r at j·xr + r (`quant::interleave`).
pub(crate) fn interleave_rows(rows: &[f32], k: usize, xr: usize, to: &mut [f32], path: Path) {
    assert!(rows.len() == xr * k && to.len() == xr * k && (1..=XMAX).contains(&xr));
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if path.avx512() {
        // SAFETY: the path is available (callers take it from best_path); the
        // lengths are checked above.
        done = unsafe { x86::interleave_rows_512(rows, k, xr, to) };
    }
    let _ = path;
    // the columns left (all of them without AVX-512), in chunks whose stores stay in L1
    for j0 in (done..k).step_by(INTERLEAVE_CHUNK) {
        let j1 = (j0 + INTERLEAVE_CHUNK).min(k);
        for (r, row) in rows.chunks_exact(k).enumerate() {
            for (j, &v) in row[j0..j1].iter().enumerate() {
                to[(j0 + j) * xr + r] = v;
            }
        }
    }
}

/// Columns the scalar `interleave_rows` moves at a time (its stores: at most 16 KB).
const INTERLEAVE_CHUNK: usize = 256;

/// Element j of a panel's 16 rows as float32 (gguf-py's values), on `path`.
pub(crate) fn panel_values(p: &[u8], lay: Layout, panel: usize, j: usize, path: Path, out: &mut [f32; PANEL]) {
    #[cfg(target_arch = "x86_64")]
    if lay.q.kquant() && path.vector() {
        // SAFETY: the path is available (callers take it from best_path); j < k.
        unsafe { crate::kquant::x86::panel_values(p, lay, panel, j, out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if path.avx512() {
        // SAFETY: the path is available (callers take it from best_path); j < k.
        unsafe { x86::panel_values_avx512(p, lay, panel, j, out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if path.vector() {
        // SAFETY: as above.
        unsafe { x86::panel_values_avx2(p, lay, panel, j, out) };
        return;
    }
    let _ = path;
    for (row, o) in out.iter_mut().enumerate() {
        *o = value(p, lay, panel * PANEL + row, j);
    }
}

fn f32_portable(x: &[f32], p: &[u8], lay: Layout, t: Tile, sums: &mut Sums) {
    let k = lay.k;
    let mut col = [0.0f32; PANEL];
    for w in 0..t.w {
        let acc = &mut sums[w];
        for a in acc.iter_mut().take(t.xr) {
            *a = [0.0; PANEL];
        }
        for j in 0..k {
            panel_values(p, lay, t.panel + w, j, Path::Portable, &mut col);
            for (r, a) in acc.iter_mut().enumerate().take(t.xr) {
                let xv = x[t.r0 * k + x_index(t.xr, k, r, j)];
                for (l, v) in a.iter_mut().enumerate() {
                    *v = col[l].mul_add(xv, *v);
                }
            }
        }
    }
}

fn q8_portable(xq: &Q8Rows, p: &[u8], lay: Layout, t: Tile, sums: &mut Sums) {
    let (k, nb) = (lay.k, lay.nb);
    for w in 0..t.w {
        let panel = t.panel + w;
        for r in 0..t.xr {
            let xr = t.r0 + r;
            for row in 0..PANEL {
                let mut acc = 0.0f32;
                for b in 0..nb {
                    let base = lay.base(panel, b);
                    let xs = &xq.q[xr * k + b * QK..xr * k + (b + 1) * QK];
                    let s: i32 = (0..QK).map(|e| code(p, lay, base, row, e) * xs[e] as i32).sum();
                    let d = f16_to_f32(u16::from_le_bytes([p[base + 2 * row], p[base + 2 * row + 1]]));
                    acc = (d * xq.d[xr * nb + b]).mul_add(s as f32, acc);
                    if lay.q.with_min() {
                        let at = base + 32 + 2 * row;
                        let m = f16_to_f32(u16::from_le_bytes([p[at], p[at + 1]]));
                        acc = m.mul_add(xq.s[xr * nb + b], acc);
                    }
                }
                sums[w][r][row] = acc;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use super::*;
    use std::arch::x86_64 as v;

    /// Stripe blocks ahead that a stripe's first tile asks the memory for
    /// (measured on SmolLM2's weights, 2 threads, Zen 5: 8 against 4 and 16).
    const AHEAD: usize = 8;
    /// A K-quant's stripe blocks ahead: one super-block, about the bytes 8
    /// of Q4_1's blocks are (9.5 KB; measured on Zen 2 against 2, 4 and 8).
    const AHEAD_K: usize = 1;

    /// The stripe block `AHEAD` blocks after the one at `base` (a
    /// stripe's first panel), asked for by the stripe's first tile.
    #[inline(always)]
    pub(crate) unsafe fn prefetch(base: *const u8, lay: Layout) {
        let unit = STRIPE * lay.unit;
        let blocks = if lay.q.kquant() { AHEAD_K } else { AHEAD };
        // wrapping: past the weight's end the address is only a hint, never read
        let ahead = base.wrapping_add(blocks * unit);
        let mut line = 0;
        while line < unit {
            v::_mm_prefetch::<{ v::_MM_HINT_T0 }>(ahead.wrapping_add(line) as *const i8);
            line += 64;
        }
    }

    /// The tile's panels' blocks `AHEAD` (a K-quant's: `AHEAD_K`) after
    /// block b: its own W (`Tile::own`), else the stripe's 4; past the
    /// stripe's last block, the next stripe's first ones. Into L2 with
    /// `prefetcht1`: on a Zen 4 host, against the unchunked walk with
    /// `prefetcht0`, the products over 2 and 5 rows took 0.63-0.84 of the
    /// time chunked with `prefetcht1` and 0.93-1.0 chunked with `prefetcht0`
    /// (L1 filled with blocks the tiles meet only a chunk later).
    #[inline(always)]
    pub(crate) unsafe fn prefetch_panels(p: &[u8], lay: Layout, t: Tile, b: usize) {
        let blocks = if lay.q.kquant() { AHEAD_K } else { AHEAD };
        // wrapping: past the weight's end the address is only a hint, never read
        let ahead = p.as_ptr().wrapping_add(lay.base(t.panel, b + blocks));
        let span = if t.own { t.w } else { STRIPE };
        let mut line = 0;
        while line < span * lay.unit {
            v::_mm_prefetch::<{ v::_MM_HINT_T1 }>(ahead.wrapping_add(line) as *const i8);
            line += 64;
        }
    }

    /// Panel w's 512-bit accumulators: zeros at block 0, else the chunk
    /// before's sums (`chunk_blocks`; the K-quant tiles' too).
    #[inline(always)]
    pub(crate) unsafe fn start_512<const XR: usize>(t: Tile, w: usize, sums: &Sums) -> [v::__m512; XR] {
        let mut acc = [v::_mm512_setzero_ps(); XR];
        if t.b0 > 0 {
            for r in 0..XR {
                acc[r] = v::_mm512_loadu_ps(sums[w][r].as_ptr());
            }
        }
        acc
    }

    /// A tile's W panels' accumulators (`start_512` of each).
    #[inline(always)]
    unsafe fn start_tile_512<const W: usize, const XR: usize>(t: Tile, sums: &Sums) -> [[v::__m512; XR]; W] {
        let mut acc = [[v::_mm512_setzero_ps(); XR]; W];
        for w in 0..W {
            acc[w] = start_512::<XR>(t, w, sums);
        }
        acc
    }

    /// A leading tile's request at panel w's block b (at `base`), for the
    /// tiles that walk panel by panel (the AVX2 halves call it in their
    /// first half): in a chunked walk each panel its own next blocks
    /// (`prefetch_panels`), else the first panel the stripe's (`prefetch`).
    #[inline(always)]
    pub(crate) unsafe fn lead(p: &[u8], base: *const u8, lay: Layout, t: Tile, w: usize, b: usize) {
        if t.lead && t.own {
            let panel = Tile {
                panel: t.panel + w,
                w: 1,
                ..t
            };
            prefetch_panels(p, lay, panel, b);
        } else if t.lead && w == 0 {
            prefetch(base, lay);
        }
    }

    /// Element e of a block format's 16 rows (the group just loaded) as
    /// float32, gguf-py's operations lane-wise; `g` holds bytes 4⌊e'/4⌋.. of
    /// each row where e' is e's byte (Q8_0: e; Q4, Q5: e mod 16); `qh` the
    /// rows' qh words (Q5; else unused).
    #[inline(always)]
    unsafe fn block_value_512(
        q: QType,
        g: v::__m512i,
        qh: v::__m512i,
        e: usize,
        d: v::__m512,
        m: v::__m512,
    ) -> v::__m512 {
        match q {
            QType::Q8_0 => {
                let left = v::_mm512_sll_epi32(g, v::_mm_cvtsi32_si128((24 - 8 * (e % 4)) as i32));
                let c = v::_mm512_srai_epi32::<24>(left);
                v::_mm512_mul_ps(v::_mm512_cvtepi32_ps(c), d)
            }
            _ => {
                let shift = 8 * (e % 4) + 4 * (e / 16);
                let mut nib = v::_mm512_and_si512(
                    v::_mm512_srl_epi32(g, v::_mm_cvtsi32_si128(shift as i32)),
                    v::_mm512_set1_epi32(0x0f),
                );
                if q.high_bits() {
                    let bit = v::_mm512_and_si512(
                        v::_mm512_srl_epi32(qh, v::_mm_cvtsi32_si128(e as i32)),
                        v::_mm512_set1_epi32(1),
                    );
                    nib = v::_mm512_or_si512(nib, v::_mm512_slli_epi32::<4>(bit));
                }
                code_value_512(q, nib, d, m)
            }
        }
    }

    /// A nibble format's code (Q4: 4 bits, Q5: 5) as float32, gguf-py's operations lane-wise.
    #[inline(always)]
    unsafe fn code_value_512(q: QType, nib: v::__m512i, d: v::__m512, m: v::__m512) -> v::__m512 {
        match q {
            QType::Q4_0 | QType::Q5_0 => {
                let offset = if q == QType::Q4_0 { 8 } else { 16 };
                let c = v::_mm512_sub_epi32(nib, v::_mm512_set1_epi32(offset));
                v::_mm512_mul_ps(d, v::_mm512_cvtepi32_ps(c))
            }
            QType::IQ4_NL => v::_mm512_mul_ps(d, v::_mm512_permutexvar_ps(nib, iq4_nl_levels_512())),
            // d·q + m in one fused operation: gguf-py's product then sum, the same
            // bits (d·q is exact: quant.rs's module docs)
            _ => v::_mm512_fmadd_ps(d, v::_mm512_cvtepi32_ps(nib), m),
        }
    }

    /// IQ4_NL's 16 levels as float32 lanes (`quant::IQ4_NL_VALUES`).
    #[inline(always)]
    unsafe fn iq4_nl_levels_512() -> v::__m512 {
        v::_mm512_loadu_ps(crate::quant::IQ4_NL_FLOATS.as_ptr())
    }

    /// IQ4_NL's 16 levels as int8, in each 128-bit lane (a `vpshufb` table).
    #[inline(always)]
    unsafe fn iq4_nl_bytes_512() -> v::__m512i {
        v::_mm512_broadcast_i32x4(v::_mm_loadu_si128(
            crate::quant::IQ4_NL_VALUES.as_ptr() as *const v::__m128i
        ))
    }

    /// The qh words of a panel block's 16 rows (Q5; else zeros).
    #[inline(always)]
    unsafe fn qh_512(base: *const u8, lay: Layout) -> v::__m512i {
        if lay.q.high_bits() {
            v::_mm512_loadu_si512(base.add(lay.qh) as *const v::__m512i)
        } else {
            v::_mm512_setzero_si512()
        }
    }

    /// Element j of a float format's 16 rows.
    #[inline(always)]
    unsafe fn float_value_512(q: QType, at: *const u8) -> v::__m512 {
        match q {
            QType::F32 => v::_mm512_loadu_ps(at as *const f32),
            QType::F16 => v::_mm512_cvtph_ps(v::_mm256_loadu_si256(at as *const v::__m256i)),
            _ => {
                let h = v::_mm512_cvtepu16_epi32(v::_mm256_loadu_si256(at as *const v::__m256i));
                v::_mm512_castsi512_ps(v::_mm512_slli_epi32::<16>(h))
            }
        }
    }

    #[inline(always)]
    unsafe fn scales_512(base: *const u8, q: QType) -> (v::__m512, v::__m512) {
        let d = v::_mm512_cvtph_ps(v::_mm256_loadu_si256(base as *const v::__m256i));
        let m = if q.with_min() {
            v::_mm512_cvtph_ps(v::_mm256_loadu_si256(base.add(32) as *const v::__m256i))
        } else {
            v::_mm512_setzero_ps()
        };
        (d, m)
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
    pub(super) unsafe fn panel_values_avx512(p: &[u8], lay: Layout, panel: usize, j: usize, out: &mut [f32; PANEL]) {
        let q = lay.q;
        let vals = if q.blocked() {
            let base = p.as_ptr().add(lay.base(panel, j / QK));
            let (d, m) = scales_512(base, q);
            let e = j % QK;
            let byte = if q == QType::Q8_0 { e } else { e % 16 };
            let g = v::_mm512_loadu_si512(base.add(lay.qs + (byte / 4) * GROUP) as *const v::__m512i);
            block_value_512(q, g, qh_512(base, lay), e, d, m)
        } else {
            float_value_512(q, p.as_ptr().add(lay.base(panel, j)))
        };
        v::_mm512_storeu_ps(out.as_mut_ptr(), vals);
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
    /// `interleave_rows`'s first ⌊k/16⌋·16 columns: 16 columns of a row
    /// at a time, scattered xr apart; the number of columns done.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn interleave_rows_512(rows: &[f32], k: usize, xr: usize, to: &mut [f32]) -> usize {
        let steps = v::_mm512_mullo_epi32(
            v::_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            v::_mm512_set1_epi32(xr as i32),
        );
        let whole = k / PANEL * PANEL;
        for j0 in (0..whole).step_by(PANEL) {
            let out = to.as_mut_ptr().add(j0 * xr);
            for r in 0..xr {
                let values = v::_mm512_loadu_ps(rows.as_ptr().add(r * k + j0));
                let at = v::_mm512_add_epi32(steps, v::_mm512_set1_epi32(r as i32));
                v::_mm512_i32scatter_ps::<4>(out, at, values);
            }
        }
        whole
    }

    pub(super) unsafe fn f32_avx512(x: &[f32], p: &[u8], lay: Layout, t: Tile, sums: &mut Sums) {
        by_format!(lay.q, F => f32_format_512::<F>(x, p, lay, t, sums))
    }

    // one function per format (see `q8_format_512`)
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
    unsafe fn f32_format_512<const F: u8>(x: &[f32], p: &[u8], lay: Layout, t: Tile, sums: &mut Sums) {
        macro_rules! shapes {
            ($($w:literal => [$($xr:literal)*]),*) => {
                match (t.w, t.xr) {
                    $($(($w, $xr) => f32_tile_512::<F, $w, $xr>(x, p, lay, t, sums),)*)*
                    _ => unreachable!("tile shape {}x{}", t.w, t.xr),
                }
            };
        }
        shapes!(
            1 => [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16],
            2 => [1 2 3 4 5 6 7 8],
            3 => [1],
            4 => [1]
        )
    }

    #[inline(always)]
    unsafe fn f32_tile_512<const F: u8, const W: usize, const XR: usize>(
        x: &[f32],
        p: &[u8],
        lay: Layout,
        t: Tile,
        sums: &mut Sums,
    ) {
        let (k, q) = (lay.k, format(F));
        let xp = x.as_ptr().add(t.r0 * k);
        let mut acc = start_tile_512::<W, XR>(t, sums);
        if q.blocked() {
            grouped_512::<F, W, XR>(xp, p, lay, t, &mut acc);
        } else {
            for j in 0..k {
                if t.lead {
                    prefetch(p.as_ptr().add(lay.base(t.panel, j)), lay);
                }
                for w in 0..W {
                    let at = p.as_ptr().add(lay.base(t.panel + w, j));
                    let wv = float_value_512(q, at);
                    for r in 0..XR {
                        acc[w][r] = v::_mm512_fmadd_ps(wv, v::_mm512_set1_ps(*xp.add(x_index(XR, k, r, j))), acc[w][r]);
                    }
                }
            }
        }
        for w in 0..W {
            for r in 0..XR {
                v::_mm512_storeu_ps(sums[w][r].as_mut_ptr(), acc[w][r]);
            }
        }
    }

    /// Byte `byte` (0..4) of each 32-bit lane, zero-extended, by immediate shifts.
    #[inline(always)]
    pub(crate) unsafe fn lane_byte_512(x: v::__m512i, byte: usize) -> v::__m512i {
        let mask = v::_mm512_set1_epi32(0xff);
        match byte {
            0 => v::_mm512_and_si512(x, mask),
            1 => v::_mm512_and_si512(v::_mm512_srli_epi32::<8>(x), mask),
            2 => v::_mm512_and_si512(v::_mm512_srli_epi32::<16>(x), mask),
            _ => v::_mm512_srli_epi32::<24>(x),
        }
    }

    /// The blocked loop of `f32_tile_512`: element e of every row, e = 0..32,
    /// each `block_value_512`'s value (the same operations, the same order),
    /// with each group loaded (a nibble format's nibbles masked, Q5's fifth
    /// bits shifted by the part its four elements share) once for its four
    /// elements, which then take their byte (and bit) by immediate shifts,
    /// instead of shifts by a register count (two micro-ops) per element.
    #[inline(always)]
    unsafe fn grouped_512<const F: u8, const W: usize, const XR: usize>(
        xp: *const f32,
        p: &[u8],
        lay: Layout,
        t: Tile,
        acc: &mut [[v::__m512; XR]; W],
    ) {
        let (k, q) = (lay.k, format(F));
        let wide = q == QType::Q8_0; // a byte per element: 8 groups, one pass
        let (groups, passes) = if wide { (8, 1) } else { (4, 2) };
        let nibble = v::_mm512_set1_epi32(0x0f0f_0f0f);
        // Q4_0, Q4_1, IQ4_NL: a code's value is a 16-entry table's, looked up by
        // `vpermps` from the group shifted to the code's nibble (the lookup reads
        // an index's low 4 bits: no mask, no conversion)
        let table = nibble_table_512(q);
        // (not in tiles of 3-4 panels: their operands and the two tables spill registers)
        let tables5 = if W <= 2 { five_bit_tables_512(q) } else { None };
        // Q8_0: per byte j, the control moving each lane's byte j to its top (`TOP_BYTE_16`)
        // (a loop, not `array::from_fn`: its closure has no AVX-512 and called the
        // load out of line, 4-5% of a float32 tile's time, for every format)
        let mut top_byte = [v::_mm512_setzero_si512(); 4];
        if wide {
            for (control, bytes) in top_byte.iter_mut().zip(&TOP_BYTE_16) {
                *control = v::_mm512_loadu_si512(bytes.as_ptr() as *const v::__m512i);
            }
        }
        for b in t.b0..t.b1 {
            let mut bases = [p.as_ptr(); W];
            let mut d = [v::_mm512_setzero_ps(); W];
            let mut m = [v::_mm512_setzero_ps(); W];
            let mut qh = [v::_mm512_setzero_si512(); W];
            if t.lead {
                prefetch_panels(p, lay, t, b);
            }
            for w in 0..W {
                bases[w] = p.as_ptr().add(lay.base(t.panel + w, b));
                (d[w], m[w]) = scales_512(bases[w], q);
                if wide {
                    d[w] = v::_mm512_mul_ps(d[w], v::_mm512_set1_ps(TWO_TO_MINUS_24));
                }
                qh[w] = qh_512(bases[w], lay);
            }
            for pass in 0..passes {
                for group in 0..groups {
                    // Q8_0: elements 4·group + 0..4; else 16·pass + 4·group + 0..4 (low, then high nibbles)
                    let first = 16 * pass + 4 * group;
                    let mut held = [v::_mm512_setzero_si512(); W];
                    let mut fifth = [v::_mm512_setzero_si512(); W];
                    for w in 0..W {
                        let g = v::_mm512_loadu_si512(bases[w].add(lay.qs + group * GROUP) as *const v::__m512i);
                        // unmasked where a byte shuffle or a table lookup reads it
                        held[w] = match (wide || table.is_some() || tables5.is_some(), pass) {
                            (true, _) => g,
                            (false, 0) => v::_mm512_and_si512(g, nibble),
                            _ => v::_mm512_and_si512(v::_mm512_srli_epi32::<4>(g), nibble),
                        };
                        if q.high_bits() {
                            fifth[w] = v::_mm512_srl_epi32(qh[w], v::_mm_cvtsi32_si128(first as i32));
                        }
                    }
                    for byte in 0..4 {
                        let e = first + byte;
                        for w in 0..W {
                            let h = held[w];
                            let wv = if wide {
                                // the code's byte at the top of its lane, zeros below: c·2^24,
                                // converted exactly; times d·2^-24 (exact) it is d·c, exact
                                let top = v::_mm512_shuffle_epi8(h, top_byte[byte]);
                                v::_mm512_mul_ps(v::_mm512_cvtepi32_ps(top), d[w])
                            } else if let Some((low, high)) = tables5 {
                                // Q5: bits 0-3 the nibble, bit 4 the fifth bit (bit `byte` of
                                // `fifth`), the rest ignored by the 32-entry lookup
                                let index = v::_mm512_ternarylogic_epi32::<0xE4>(
                                    nibble_512(h, 8 * byte + 4 * pass),
                                    fifth_at_bit4_512(fifth[w], byte),
                                    v::_mm512_set1_epi32(0x0f),
                                );
                                let code = v::_mm512_permutex2var_ps(low, index, high);
                                match q {
                                    QType::Q5_1 => v::_mm512_fmadd_ps(d[w], code, m[w]), // as code_value_512
                                    _ => v::_mm512_mul_ps(d[w], code),
                                }
                            } else if let Some(table) = table {
                                let index = nibble_512(h, 8 * byte + 4 * pass);
                                let code = v::_mm512_permutexvar_ps(index, table);
                                match q {
                                    QType::Q4_1 => v::_mm512_fmadd_ps(d[w], code, m[w]), // as code_value_512
                                    _ => v::_mm512_mul_ps(d[w], code),
                                }
                            } else {
                                let mut c = lane_byte_512(h, byte);
                                if q.high_bits() {
                                    let bit = match byte {
                                        0 => fifth[w],
                                        1 => v::_mm512_srli_epi32::<1>(fifth[w]),
                                        2 => v::_mm512_srli_epi32::<2>(fifth[w]),
                                        _ => v::_mm512_srli_epi32::<3>(fifth[w]),
                                    };
                                    let bit = v::_mm512_and_si512(bit, v::_mm512_set1_epi32(1));
                                    c = v::_mm512_or_si512(c, v::_mm512_slli_epi32::<4>(bit));
                                }
                                code_value_512(q, c, d[w], m[w])
                            };
                            for r in 0..XR {
                                let xv = v::_mm512_set1_ps(*xp.add(x_index(XR, k, r, b * QK + e)));
                                acc[w][r] = v::_mm512_fmadd_ps(wv, xv, acc[w][r]);
                            }
                        }
                    }
                }
            }
        }
    }

    /// The `vpshufb` control of L lanes moving each lane's byte j to its top
    /// byte and zeroing the three below (an index with its high bit set); the
    /// shuffle indexes within 128 bits, where lane i's byte j is byte 4·(i mod 4) + j.
    const fn top_byte_control<const L: usize>(j: usize) -> [i32; L] {
        let mut control = [0i32; L];
        let mut i = 0;
        while i < L {
            control[i] = i32::from_le_bytes([0x80, 0x80, 0x80, (4 * (i % 4) + j) as u8]);
            i += 1;
        }
        control
    }

    /// `top_byte_control` of 16 and of 8 lanes for bytes 0..4, built at
    /// compile time: the tiles load them from memory (built at run time,
    /// the AVX2 tile called the builder for every block).
    static TOP_BYTE_16: [[i32; 16]; 4] = [
        top_byte_control(0),
        top_byte_control(1),
        top_byte_control(2),
        top_byte_control(3),
    ];
    static TOP_BYTE_8: [[i32; 8]; 4] = [
        top_byte_control(0),
        top_byte_control(1),
        top_byte_control(2),
        top_byte_control(3),
    ];

    /// 2^-24: a Q8_0 block's scale times this, times the code converted from
    /// the top byte of its lane (c·2^24), is d·c exactly (`grouped_512`,
    /// `grouped_256`).
    const TWO_TO_MINUS_24: f32 = 1.0 / 16_777_216.0;

    /// The values of a 4-bit code of `q` (Q4_0: c − 8; Q4_1: c; IQ4_NL: its
    /// levels) as 16 float32 lanes, or None (the other formats).
    #[inline(always)]
    pub(crate) unsafe fn nibble_table_512(q: QType) -> Option<v::__m512> {
        const PLAIN: [f32; 16] = [
            0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
        ];
        const CENTRED: [f32; 16] = [
            -8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0,
        ];
        match q {
            QType::Q4_0 => Some(v::_mm512_loadu_ps(CENTRED.as_ptr())),
            QType::Q4_1 => Some(v::_mm512_loadu_ps(PLAIN.as_ptr())),
            QType::IQ4_NL => Some(iq4_nl_levels_512()),
            _ => None,
        }
    }

    /// The values of a 5-bit code of `q` (Q5_0: c − 16; Q5_1: c) as two
    /// 16-lane tables (codes 0..16, 16..32), or None (the other formats).
    #[inline(always)]
    pub(crate) unsafe fn five_bit_tables_512(q: QType) -> Option<(v::__m512, v::__m512)> {
        let first = match q {
            QType::Q5_0 => -16.0f32,
            QType::Q5_1 => 0.0,
            _ => return None,
        };
        let low: [f32; 16] = std::array::from_fn(|i| first + i as f32);
        let high: [f32; 16] = std::array::from_fn(|i| first + 16.0 + i as f32);
        Some((v::_mm512_loadu_ps(low.as_ptr()), v::_mm512_loadu_ps(high.as_ptr())))
    }

    /// Bit `byte` (0..4) of each lane of `fifth` moved to bit 4 (the other
    /// bits are not cleared: the 32-entry lookup reads bits 0-4 only).
    #[inline(always)]
    unsafe fn fifth_at_bit4_512(fifth: v::__m512i, byte: usize) -> v::__m512i {
        match byte {
            0 => v::_mm512_slli_epi32::<4>(fifth),
            1 => v::_mm512_slli_epi32::<3>(fifth),
            2 => v::_mm512_slli_epi32::<2>(fifth),
            _ => v::_mm512_slli_epi32::<1>(fifth),
        }
    }

    /// Each lane of `g` shifted right by `shift` (a multiple of 4 below 32, by
    /// an immediate): the nibble there in the lane's low 4 bits.
    #[inline(always)]
    pub(crate) unsafe fn nibble_512(g: v::__m512i, shift: usize) -> v::__m512i {
        match shift {
            0 => g,
            4 => v::_mm512_srli_epi32::<4>(g),
            8 => v::_mm512_srli_epi32::<8>(g),
            12 => v::_mm512_srli_epi32::<12>(g),
            16 => v::_mm512_srli_epi32::<16>(g),
            20 => v::_mm512_srli_epi32::<20>(g),
            24 => v::_mm512_srli_epi32::<24>(g),
            _ => v::_mm512_srli_epi32::<28>(g),
        }
    }

    /// Whether `q`'s codes are int8 (Q8_0, IQ4_NL's levels), and whether the
    /// q8 tiles then take |code| with the x byte given the code's sign (no
    /// VNNI: `vpmaddubsw`'s pairs stay within 16 bits) instead of code + 128.
    #[inline(always)]
    const fn int8_codes(q: QType, vnni: bool) -> (bool, bool) {
        let signed = matches!(q, QType::Q8_0 | QType::IQ4_NL);
        (signed, signed && !vnni)
    }

    /// Σ over the 4 bytes of each lane of a (u8) · b (s8), added into `s`:
    /// `vpdpbusd`, or (without VNNI) `vpmaddubsw` then `vpmaddwd` by ones
    /// (no pair overflows 16 bits: a ≤ 255 only with |b| ≤ 127, see `q8_avx512`).
    #[inline(always)]
    unsafe fn dot4_512<const VNNI: bool>(s: v::__m512i, a: v::__m512i, b: v::__m512i) -> v::__m512i {
        if VNNI {
            v::_mm512_dpbusd_epi32(s, a, b)
        } else {
            let pairs = v::_mm512_maddubs_epi16(a, b);
            v::_mm512_add_epi32(s, v::_mm512_madd_epi16(pairs, v::_mm512_set1_epi16(1)))
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
    pub(super) unsafe fn q8_avx512(xq: &Q8Rows, p: &[u8], lay: Layout, t: Tile, sums: &mut Sums) {
        by_format!(lay.q, F => q8_format_512::<F>(xq, p, lay, t, sums))
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn q8_avx512_vnni(xq: &Q8Rows, p: &[u8], lay: Layout, t: Tile, sums: &mut Sums) {
        by_format!(lay.q, F => q8_format_512_vnni::<F>(xq, p, lay, t, sums))
    }

    // one function per format and path (not one inlined body of every
    // format's shapes: an unoptimized build's frame would outgrow a thread's stack)
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
    unsafe fn q8_format_512<const F: u8>(xq: &Q8Rows, p: &[u8], lay: Layout, t: Tile, sums: &mut Sums) {
        q8_shapes_512::<false, F>(xq, p, lay, t, sums)
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn q8_format_512_vnni<const F: u8>(xq: &Q8Rows, p: &[u8], lay: Layout, t: Tile, sums: &mut Sums) {
        q8_shapes_512::<true, F>(xq, p, lay, t, sums)
    }

    #[inline(always)]
    unsafe fn q8_shapes_512<const VNNI: bool, const F: u8>(
        xq: &Q8Rows,
        p: &[u8],
        lay: Layout,
        t: Tile,
        sums: &mut Sums,
    ) {
        macro_rules! shapes {
            ($($w:literal => [$($xr:literal)*]),*) => {
                match (t.w, t.xr) {
                    $($(($w, $xr) => q8_tile_512::<VNNI, F, $w, $xr>(xq, p, lay, t, sums),)*)*
                    _ => unreachable!("tile shape {}x{}", t.w, t.xr),
                }
            };
        }
        shapes!(1 => [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16], 2 => [1 2 3 4 5 6 7 8 9], 3 => [1], 4 => [1])
    }

    /// The q8 tile: per panel block, the 8 operands (Q4, Q5: each group's low
    /// and high nibbles, Q5's fifth bits or-ed in; Q8_0: each group), then per x row the block's
    /// integer dot product (two chains, added: exact), its correction, and
    /// the scaled sum. Q8_0 and Q4_0 codes are signed; the unsigned operand
    /// is then the code + 128 (Q8_0, `vpdpbusd`), or |code| with the x byte
    /// taking the code's sign (Q8_0 without VNNI), or the Q4_0 nibble
    /// (code + 8); the correction takes 128·Σx or 8·Σx back out. A tile of
    /// two panels holds both panels' operands and broadcasts each x group once
    /// for both (a broadcast memory operand per `vpdpbusd` costs the core
    /// about a quarter of the tile's time: `benchmarks/vnni_probe`). With
    /// VNNI a tile of two panels walks them operand by operand instead
    /// (`q8_tile_512_by_operand`, `q8_by_operand`).
    #[inline(always)]
    unsafe fn q8_tile_512<const VNNI: bool, const F: u8, const W: usize, const XR: usize>(
        xq: &Q8Rows,
        p: &[u8],
        lay: Layout,
        t: Tile,
        sums: &mut Sums,
    ) {
        let (k, nb, q) = (lay.k, lay.nb, format(F));
        let (_, sign_trick) = int8_codes(q, VNNI);
        if VNNI && W == 2 && XR >= 3 {
            if W * XR >= 8 {
                return q8_tile_512_by_operand::<VNNI, F, W, XR, 1>(xq, p, lay, t, sums);
            }
            return q8_tile_512_by_operand::<VNNI, F, W, XR, 2>(xq, p, lay, t, sums);
        }
        let mut acc = start_tile_512::<W, XR>(t, sums);
        for b in t.b0..t.b1 {
            if t.lead {
                prefetch_panels(p, lay, t, b);
            }
            let x = Q8Block { xq, r0: t.r0, k, nb, b };
            if W == 2 && !sign_trick {
                let panels = [0, 1].map(|w| Q8Operands::of::<VNNI>(p, lay, t.panel + w, b, q));
                for r in 0..XR {
                    let mut chains = [[v::_mm512_setzero_si512(); 2]; 2];
                    for i in 0..8 {
                        let xv = x.group(r, i);
                        for (w, c) in chains.iter_mut().enumerate() {
                            c[i % 2] = dot4_512::<VNNI>(c[i % 2], panels[w].magnitude[i], xv);
                        }
                    }
                    for (w, c) in chains.into_iter().enumerate() {
                        let sum = v::_mm512_add_epi32(c[0], c[1]);
                        acc[w][r] = x.scaled(r, sum, q, sign_trick, (panels[w].d, panels[w].m), acc[w][r]);
                    }
                }
                continue;
            }
            for w in 0..W {
                let panel = Q8Operands::of::<VNNI>(p, lay, t.panel + w, b, q);
                for r in 0..XR {
                    let mut c = [v::_mm512_setzero_si512(); 2];
                    for i in 0..8 {
                        let mut xv = x.group(r, i);
                        if sign_trick {
                            let negative = v::_mm512_movepi8_mask(panel.ops[i]);
                            xv = v::_mm512_mask_sub_epi8(xv, negative, v::_mm512_setzero_si512(), xv);
                        }
                        c[i % 2] = dot4_512::<VNNI>(c[i % 2], panel.magnitude[i], xv);
                    }
                    let sum = v::_mm512_add_epi32(c[0], c[1]);
                    acc[w][r] = x.scaled(r, sum, q, sign_trick, (panel.d, panel.m), acc[w][r]);
                }
            }
        }
        for w in 0..W {
            for r in 0..XR {
                v::_mm512_storeu_ps(sums[w][r].as_mut_ptr(), acc[w][r]);
            }
        }
    }

    /// The q8 tile operand by operand (`q8_tile_512`'s sums, the same bits:
    /// a block's integer sums are exact in any order): per panel block,
    /// each operand is formed once and multiplied into every x row's chain
    /// at once, so only the W operands of the step are live beside the
    /// W·XR·CH chains and W·XR accumulators (CH = 2 chains per row when
    /// fewer than 8 rows and panels would leave `vpdpbusd`'s latency bare).
    #[inline(always)]
    unsafe fn q8_tile_512_by_operand<
        const VNNI: bool,
        const F: u8,
        const W: usize,
        const XR: usize,
        const CH: usize,
    >(
        xq: &Q8Rows,
        p: &[u8],
        lay: Layout,
        t: Tile,
        sums: &mut Sums,
    ) {
        let (k, nb, q) = (lay.k, lay.nb, format(F));
        let mut acc = start_tile_512::<W, XR>(t, sums);
        for b in t.b0..t.b1 {
            if t.lead {
                prefetch_panels(p, lay, t, b);
            }
            let x = Q8Block { xq, r0: t.r0, k, nb, b };
            let mut bases = [p.as_ptr(); W];
            let mut qh = [v::_mm512_setzero_si512(); W];
            for w in 0..W {
                bases[w] = p.as_ptr().add(lay.base(t.panel + w, b));
                qh[w] = qh_512(bases[w], lay);
            }
            let mut chains = [[[v::_mm512_setzero_si512(); CH]; XR]; W];
            for step in 0..8 {
                // Q4, Q5: a group's low nibbles, then its high ones (one load)
                let i = if q == QType::Q8_0 {
                    step
                } else {
                    step / 2 + 4 * (step % 2)
                };
                let mut ops = [v::_mm512_setzero_si512(); W];
                for w in 0..W {
                    ops[w] = q8_operand_512::<VNNI>(bases[w], lay, qh[w], i, q);
                }
                for r in 0..XR {
                    let xv = x.group(r, i);
                    for w in 0..W {
                        chains[w][r][step % CH] = dot4_512::<VNNI>(chains[w][r][step % CH], ops[w], xv);
                    }
                }
            }
            for w in 0..W {
                let scales = scales_512(bases[w], q);
                for r in 0..XR {
                    let mut s = chains[w][r][0];
                    for c in 1..CH {
                        s = v::_mm512_add_epi32(s, chains[w][r][c]);
                    }
                    acc[w][r] = x.scaled(r, s, q, false, scales, acc[w][r]);
                }
            }
        }
        for w in 0..W {
            for r in 0..XR {
                v::_mm512_storeu_ps(sums[w][r].as_mut_ptr(), acc[w][r]);
            }
        }
    }

    /// One panel block's q8 operands: `ops` (the 8 groups as `vpdpbusd`'s
    /// unsigned operands, or the signed codes for the sign trick), the
    /// unsigned operands the products take (`magnitude`: |code| for the sign
    /// trick, else `ops`), and the rows' scales d and mins m.
    struct Q8Operands {
        ops: [v::__m512i; 8],
        magnitude: [v::__m512i; 8],
        d: v::__m512,
        m: v::__m512,
    }

    impl Q8Operands {
        #[inline(always)]
        unsafe fn of<const VNNI: bool>(p: &[u8], lay: Layout, panel: usize, b: usize, q: QType) -> Q8Operands {
            let (_, sign_trick) = int8_codes(q, VNNI);
            let base = p.as_ptr().add(lay.base(panel, b));
            let (d, m) = scales_512(base, q);
            let qh = qh_512(base, lay);
            let mut ops = [v::_mm512_setzero_si512(); 8];
            for (i, op) in ops.iter_mut().enumerate() {
                *op = q8_operand_512::<VNNI>(base, lay, qh, i, q);
            }
            let magnitude = if sign_trick {
                ops.map(|o| v::_mm512_abs_epi8(o))
            } else {
                ops
            };
            Q8Operands { ops, magnitude, d, m }
        }
    }

    /// Operand i of a panel block at `base` (`Q8Operands::ops`): group i
    /// (Q8_0), or group i mod 4's low (i < 4) or high nibbles, the fifth
    /// bits or-ed in (Q5), IQ4_NL's levels, + 128 for signed codes under `vpdpbusd`.
    #[inline(always)]
    unsafe fn q8_operand_512<const VNNI: bool>(
        base: *const u8,
        lay: Layout,
        qh: v::__m512i,
        i: usize,
        q: QType,
    ) -> v::__m512i {
        let (signed, sign_trick) = int8_codes(q, VNNI);
        let low = v::_mm512_set1_epi8(0x0f);
        let g = if q == QType::Q8_0 { i } else { i % 4 };
        let raw = v::_mm512_loadu_si512(base.add(lay.qs + g * GROUP) as *const v::__m512i);
        let mut op = match q {
            QType::Q8_0 => raw,
            _ if i < 4 => v::_mm512_and_si512(raw, low),
            _ => v::_mm512_and_si512(v::_mm512_srli_epi16::<4>(raw), low),
        };
        if q.high_bits() {
            op = v::_mm512_or_si512(op, fifth_bits_512(qh, i));
        }
        if q == QType::IQ4_NL {
            op = v::_mm512_shuffle_epi8(iq4_nl_bytes_512(), op); // nibble -> its level
        }
        if signed && !sign_trick {
            op = v::_mm512_xor_si512(op, v::_mm512_set1_epi8(-128)); // code + 128: unsigned
        }
        op
    }

    /// The q8 x rows r0.. at one 32-block b.
    struct Q8Block<'a> {
        xq: &'a Q8Rows,
        r0: usize,
        k: usize,
        nb: usize,
        b: usize,
    }

    impl Q8Block<'_> {
        /// Row r's x bytes 4i..4i + 4 broadcast: operand i's partner (Q4: low
        /// nibbles are elements 0..16, high ones 16..32, so operand i is elements 4i..).
        #[inline(always)]
        unsafe fn group(&self, r: usize, i: usize) -> v::__m512i {
            let xs = self.xq.q.as_ptr().add((self.r0 + r) * self.k + self.b * QK) as *const i32;
            v::_mm512_set1_epi32(*xs.add(i))
        }

        /// `acc` plus row r's block sum `s` (the chains added: exact)
        /// scaled: the code offset's correction, then acc + (d·d_x)·sum and
        /// (formats with a min) + m·s_x, with the panel's scales d and m.
        #[inline(always)]
        unsafe fn scaled(
            &self,
            r: usize,
            mut s: v::__m512i,
            q: QType,
            sign_trick: bool,
            (d, m): (v::__m512, v::__m512),
            acc: v::__m512,
        ) -> v::__m512 {
            let at = (self.r0 + r) * self.nb + self.b;
            let sum = *self.xq.sum.get_unchecked(at);
            match q {
                QType::Q8_0 | QType::IQ4_NL if !sign_trick => {
                    s = v::_mm512_sub_epi32(s, v::_mm512_set1_epi32(128 * sum))
                }
                QType::Q4_0 => s = v::_mm512_sub_epi32(s, v::_mm512_set1_epi32(8 * sum)),
                QType::Q5_0 => s = v::_mm512_sub_epi32(s, v::_mm512_set1_epi32(16 * sum)),
                _ => {}
            }
            let scale = v::_mm512_mul_ps(d, v::_mm512_set1_ps(*self.xq.d.get_unchecked(at)));
            let acc = v::_mm512_fmadd_ps(scale, v::_mm512_cvtepi32_ps(s), acc);
            if q.with_min() {
                v::_mm512_fmadd_ps(m, v::_mm512_set1_ps(*self.xq.s.get_unchecked(at)), acc)
            } else {
                acc
            }
        }
    }

    /// `fifth_bits_256` on 16 rows: bit 4i + j of each row's qh word as bit 4
    /// of the lane's byte j.
    #[inline(always)]
    unsafe fn fifth_bits_512(qh: v::__m512i, i: usize) -> v::__m512i {
        let four = v::_mm512_and_si512(
            v::_mm512_srl_epi32(qh, v::_mm_cvtsi32_si128(4 * i as i32)),
            v::_mm512_set1_epi32(15),
        );
        let spread = v::_mm512_mullo_epi32(four, v::_mm512_set1_epi32(0x0020_4081));
        v::_mm512_slli_epi32::<4>(v::_mm512_and_si512(spread, v::_mm512_set1_epi32(0x0101_0101)))
    }

    // ---- AVX2: a panel as two halves of 8 rows, each its own pass over k

    /// As `block_value_512` on 8 rows; `qh` holds the rows' qh words (Q5).
    #[inline(always)]
    unsafe fn block_value_256(
        q: QType,
        g: v::__m256i,
        qh: v::__m256i,
        e: usize,
        d: v::__m256,
        m: v::__m256,
    ) -> v::__m256 {
        match q {
            QType::Q8_0 => {
                let left = v::_mm256_sll_epi32(g, v::_mm_cvtsi32_si128((24 - 8 * (e % 4)) as i32));
                let c = v::_mm256_srai_epi32::<24>(left);
                v::_mm256_mul_ps(v::_mm256_cvtepi32_ps(c), d)
            }
            _ => {
                let shift = 8 * (e % 4) + 4 * (e / 16);
                let mut nib = v::_mm256_and_si256(
                    v::_mm256_srl_epi32(g, v::_mm_cvtsi32_si128(shift as i32)),
                    v::_mm256_set1_epi32(0x0f),
                );
                if q.high_bits() {
                    let bit = v::_mm256_and_si256(
                        v::_mm256_srl_epi32(qh, v::_mm_cvtsi32_si128(e as i32)),
                        v::_mm256_set1_epi32(1),
                    );
                    nib = v::_mm256_or_si256(nib, v::_mm256_slli_epi32::<4>(bit));
                }
                code_value_256(q, nib, d, m)
            }
        }
    }

    /// `code_value_512` on 8 rows.
    #[inline(always)]
    unsafe fn code_value_256(q: QType, nib: v::__m256i, d: v::__m256, m: v::__m256) -> v::__m256 {
        match q {
            QType::Q4_0 | QType::Q5_0 => {
                let offset = if q == QType::Q4_0 { 8 } else { 16 };
                let c = v::_mm256_sub_epi32(nib, v::_mm256_set1_epi32(offset));
                v::_mm256_mul_ps(d, v::_mm256_cvtepi32_ps(c))
            }
            QType::IQ4_NL => {
                // levels 0..8 and 8..16 by the low 3 bits, the fourth picking
                let table = crate::quant::IQ4_NL_FLOATS.as_ptr();
                let low = v::_mm256_permutevar8x32_ps(v::_mm256_loadu_ps(table), nib);
                let high = v::_mm256_permutevar8x32_ps(v::_mm256_loadu_ps(table.add(8)), nib);
                let upper = v::_mm256_castsi256_ps(v::_mm256_cmpgt_epi32(nib, v::_mm256_set1_epi32(7)));
                v::_mm256_mul_ps(d, v::_mm256_blendv_ps(low, high, upper))
            }
            _ => v::_mm256_fmadd_ps(d, v::_mm256_cvtepi32_ps(nib), m), // as code_value_512
        }
    }

    /// The qh words of the 8 rows of `half` in the panel block at `base` (Q5; else zeros).
    #[inline(always)]
    unsafe fn qh_256(base: *const u8, lay: Layout, half: usize) -> v::__m256i {
        if lay.q.high_bits() {
            v::_mm256_loadu_si256(base.add(lay.qh + 32 * half) as *const v::__m256i)
        } else {
            v::_mm256_setzero_si256()
        }
    }

    #[inline(always)]
    unsafe fn float_value_256(q: QType, at: *const u8) -> v::__m256 {
        match q {
            QType::F32 => v::_mm256_loadu_ps(at as *const f32),
            QType::F16 => v::_mm256_cvtph_ps(v::_mm_loadu_si128(at as *const v::__m128i)),
            _ => {
                let h = v::_mm256_cvtepu16_epi32(v::_mm_loadu_si128(at as *const v::__m128i));
                v::_mm256_castsi256_ps(v::_mm256_slli_epi32::<16>(h))
            }
        }
    }

    #[inline(always)]
    unsafe fn scales_256(base: *const u8, q: QType, half: usize) -> (v::__m256, v::__m256) {
        let d = v::_mm256_cvtph_ps(v::_mm_loadu_si128(base.add(16 * half) as *const v::__m128i));
        let m = if q.with_min() {
            v::_mm256_cvtph_ps(v::_mm_loadu_si128(base.add(32 + 16 * half) as *const v::__m128i))
        } else {
            v::_mm256_setzero_ps()
        };
        (d, m)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn panel_values_avx2(p: &[u8], lay: Layout, panel: usize, j: usize, out: &mut [f32; PANEL]) {
        let q = lay.q;
        for half in 0..2 {
            let vals = if q.blocked() {
                let base = p.as_ptr().add(lay.base(panel, j / QK));
                let (d, m) = scales_256(base, q, half);
                let e = j % QK;
                let byte = if q == QType::Q8_0 { e } else { e % 16 };
                let at = base.add(lay.qs + (byte / 4) * GROUP + 32 * half);
                let qh = qh_256(base, lay, half);
                block_value_256(q, v::_mm256_loadu_si256(at as *const v::__m256i), qh, e, d, m)
            } else {
                float_value_256(q, p.as_ptr().add(lay.base(panel, j) + 8 * q.block().1 * half))
            };
            v::_mm256_storeu_ps(out.as_mut_ptr().add(8 * half), vals);
        }
    }

    /// Half `half` of panel w's accumulators: zeros at block 0, else the
    /// chunk before's sums.
    #[inline(always)]
    pub(crate) unsafe fn start_256<const XR: usize>(t: Tile, w: usize, half: usize, sums: &Sums) -> [v::__m256; XR] {
        let mut acc = [v::_mm256_setzero_ps(); XR];
        if t.b0 > 0 {
            for r in 0..XR {
                acc[r] = v::_mm256_loadu_ps(sums[w][r].as_ptr().add(8 * half));
            }
        }
        acc
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn f32_avx2(x: &[f32], p: &[u8], lay: Layout, t: Tile, sums: &mut Sums) {
        by_format!(lay.q, F => for w in 0..t.w {
            for half in 0..2 {
                match t.xr {
                    1 => f32_half_256::<F, 1>(x, p, lay, t, w, half, sums),
                    2 => f32_half_256::<F, 2>(x, p, lay, t, w, half, sums),
                    3 => f32_half_256::<F, 3>(x, p, lay, t, w, half, sums),
                    4 => f32_half_256::<F, 4>(x, p, lay, t, w, half, sums),
                    5 => f32_half_256::<F, 5>(x, p, lay, t, w, half, sums),
                    6 => f32_half_256::<F, 6>(x, p, lay, t, w, half, sums),
                    7 => f32_half_256::<F, 7>(x, p, lay, t, w, half, sums),
                    8 => f32_half_256::<F, 8>(x, p, lay, t, w, half, sums),
                    xr => unreachable!("{xr} x rows in an AVX2 tile"),
                }
            }
        })
    }

    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn f32_half_256<const F: u8, const XR: usize>(
        x: &[f32],
        p: &[u8],
        lay: Layout,
        t: Tile,
        w: usize,
        half: usize,
        sums: &mut Sums,
    ) {
        let (k, q) = (lay.k, format(F));
        let xp = x.as_ptr().add(t.r0 * k);
        let mut acc = start_256::<XR>(t, w, half, sums);
        if q.blocked() {
            for b in t.b0..t.b1 {
                let base = p.as_ptr().add(lay.base(t.panel + w, b));
                if half == 0 {
                    lead(p, base, lay, t, w, b);
                }
                let (d, m) = scales_256(base, q, half);
                let qh = qh_256(base, lay, half);
                grouped_256::<F, XR>(xp, k, b, base.add(32 * half), lay, (d, m, qh), &mut acc);
            }
        } else {
            let size = q.block().1;
            for j in 0..k {
                let at = p.as_ptr().add(lay.base(t.panel + w, j) + 8 * size * half);
                let wv = float_value_256(q, at);
                for r in 0..XR {
                    acc[r] = v::_mm256_fmadd_ps(wv, v::_mm256_set1_ps(*xp.add(x_index(XR, k, r, j))), acc[r]);
                }
            }
        }
        for r in 0..XR {
            v::_mm256_storeu_ps(sums[w][r].as_mut_ptr().add(8 * half), acc[r]);
        }
    }

    /// `lane_byte_512` on 8 lanes.
    #[inline(always)]
    pub(crate) unsafe fn lane_byte_256(x: v::__m256i, byte: usize) -> v::__m256i {
        let mask = v::_mm256_set1_epi32(0xff);
        match byte {
            0 => v::_mm256_and_si256(x, mask),
            1 => v::_mm256_and_si256(v::_mm256_srli_epi32::<8>(x), mask),
            2 => v::_mm256_and_si256(v::_mm256_srli_epi32::<16>(x), mask),
            _ => v::_mm256_srli_epi32::<24>(x),
        }
    }

    /// `grouped_512` on one half (8 rows) of a panel's block b: `x` the
    /// pass's XR x rows (`quant::x_index`), `at` the block's
    /// bytes moved to the half's 32 bytes of each group; the half's scales,
    /// mins and qh words (`scales_256`, `qh_256`).
    #[inline(always)]
    unsafe fn grouped_256<const F: u8, const XR: usize>(
        x: *const f32,
        k: usize,
        b: usize,
        at: *const u8,
        lay: Layout,
        (d, m, qh): (v::__m256, v::__m256, v::__m256i),
        acc: &mut [v::__m256; XR],
    ) {
        let q = format(F);
        let wide = q == QType::Q8_0;
        let (groups, passes) = if wide { (8, 1) } else { (4, 2) };
        let nibble = v::_mm256_set1_epi32(0x0f0f_0f0f);
        // Q8_0 as in `grouped_512`: the code's byte at the top of its lane (c·2^24,
        // converted exactly) times d·2^-24 (exact) is d·c
        let d24 = v::_mm256_mul_ps(d, v::_mm256_set1_ps(TWO_TO_MINUS_24));
        let mut top_byte = [v::_mm256_setzero_si256(); 4];
        if wide {
            for (control, bytes) in top_byte.iter_mut().zip(&TOP_BYTE_8) {
                *control = v::_mm256_loadu_si256(bytes.as_ptr() as *const v::__m256i);
            }
        }
        for pass in 0..passes {
            for group in 0..groups {
                let first = 16 * pass + 4 * group;
                let g = v::_mm256_loadu_si256(at.add(lay.qs + group * GROUP) as *const v::__m256i);
                let h = match (wide, pass) {
                    (true, _) => g,
                    (false, 0) => v::_mm256_and_si256(g, nibble),
                    _ => v::_mm256_and_si256(v::_mm256_srli_epi32::<4>(g), nibble),
                };
                let fifth = if q.high_bits() {
                    v::_mm256_srl_epi32(qh, v::_mm_cvtsi32_si128(first as i32))
                } else {
                    v::_mm256_setzero_si256()
                };
                for byte in 0..4 {
                    let e = first + byte;
                    let wv = if wide {
                        let top = v::_mm256_shuffle_epi8(h, top_byte[byte]);
                        v::_mm256_mul_ps(v::_mm256_cvtepi32_ps(top), d24)
                    } else {
                        let mut c = lane_byte_256(h, byte);
                        if q.high_bits() {
                            let bit = match byte {
                                0 => fifth,
                                1 => v::_mm256_srli_epi32::<1>(fifth),
                                2 => v::_mm256_srli_epi32::<2>(fifth),
                                _ => v::_mm256_srli_epi32::<3>(fifth),
                            };
                            let bit = v::_mm256_and_si256(bit, v::_mm256_set1_epi32(1));
                            c = v::_mm256_or_si256(c, v::_mm256_slli_epi32::<4>(bit));
                        }
                        code_value_256(q, c, d, m)
                    };
                    for r in 0..XR {
                        acc[r] =
                            v::_mm256_fmadd_ps(wv, v::_mm256_set1_ps(*x.add(x_index(XR, k, r, b * QK + e))), acc[r]);
                    }
                }
            }
        }
    }

    /// The fifth bits of operand i's elements 4i..4i + 4 (Q5): bit 4i + j of
    /// each row's qh word as bit 4 of the lane's byte j. The product by
    /// 1 + 2^7 + 2^14 + 2^21 puts bit j at 8j among terms at distinct
    /// positions (no carries), the mask keeps those four.
    #[inline(always)]
    unsafe fn fifth_bits_256(qh: v::__m256i, i: usize) -> v::__m256i {
        let four = v::_mm256_and_si256(
            v::_mm256_srl_epi32(qh, v::_mm_cvtsi32_si128(4 * i as i32)),
            v::_mm256_set1_epi32(15),
        );
        let spread = v::_mm256_mullo_epi32(four, v::_mm256_set1_epi32(0x0020_4081));
        v::_mm256_slli_epi32::<4>(v::_mm256_and_si256(spread, v::_mm256_set1_epi32(0x0101_0101)))
    }

    #[inline(always)]
    unsafe fn dot4_256<const VNNI: bool>(s: v::__m256i, a: v::__m256i, b: v::__m256i) -> v::__m256i {
        if VNNI {
            dpbusd_256(s, a, b)
        } else {
            let pairs = v::_mm256_maddubs_epi16(a, b);
            v::_mm256_add_epi32(s, v::_mm256_madd_epi16(pairs, v::_mm256_set1_epi16(1)))
        }
    }

    #[inline(always)]
    unsafe fn dpbusd_256(s: v::__m256i, a: v::__m256i, b: v::__m256i) -> v::__m256i {
        v::_mm256_dpbusd_avx_epi32(s, a, b)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q8_avx2(xq: &Q8Rows, p: &[u8], lay: Layout, t: Tile, sums: &mut Sums) {
        q8_halves_256::<false>(xq, p, lay, t, sums)
    }

    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    pub(super) unsafe fn q8_avx2_vnni(xq: &Q8Rows, p: &[u8], lay: Layout, t: Tile, sums: &mut Sums) {
        q8_halves_256::<true>(xq, p, lay, t, sums)
    }

    #[inline(always)]
    unsafe fn q8_halves_256<const VNNI: bool>(xq: &Q8Rows, p: &[u8], lay: Layout, t: Tile, sums: &mut Sums) {
        by_format!(lay.q, F => for w in 0..t.w {
            for half in 0..2 {
                match t.xr {
                    1 => q8_half_256::<VNNI, F, 1>(xq, p, lay, t, w, half, sums),
                    2 => q8_half_256::<VNNI, F, 2>(xq, p, lay, t, w, half, sums),
                    3 => q8_half_256::<VNNI, F, 3>(xq, p, lay, t, w, half, sums),
                    4 => q8_half_256::<VNNI, F, 4>(xq, p, lay, t, w, half, sums),
                    xr => unreachable!("{xr} x rows in an AVX2 q8 tile"),
                }
            }
        })
    }

    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn q8_half_256<const VNNI: bool, const F: u8, const XR: usize>(
        xq: &Q8Rows,
        p: &[u8],
        lay: Layout,
        t: Tile,
        w: usize,
        half: usize,
        sums: &mut Sums,
    ) {
        let (k, nb, q) = (lay.k, lay.nb, format(F));
        let mut acc = start_256::<XR>(t, w, half, sums);
        let low = v::_mm256_set1_epi8(0x0f);
        let flip = v::_mm256_set1_epi8(-128);
        let (signed, sign_trick) = int8_codes(q, VNNI);
        let table = v::_mm_loadu_si128(crate::quant::IQ4_NL_VALUES.as_ptr() as *const v::__m128i);
        let levels = v::_mm256_set_m128i(table, table);
        for b in t.b0..t.b1 {
            let base = p.as_ptr().add(lay.base(t.panel + w, b));
            if half == 0 {
                lead(p, base, lay, t, w, b);
            }
            let (d, m) = scales_256(base, q, half);
            let qh = qh_256(base, lay, half);
            let mut s = [v::_mm256_setzero_si256(); XR];
            for i in 0..8 {
                let g = if q == QType::Q8_0 { i } else { i % 4 };
                let raw = v::_mm256_loadu_si256(base.add(lay.qs + g * GROUP + 32 * half) as *const v::__m256i);
                let mut code = match q {
                    QType::Q8_0 => raw,
                    _ if i < 4 => v::_mm256_and_si256(raw, low),
                    _ => v::_mm256_and_si256(v::_mm256_srli_epi16::<4>(raw), low),
                };
                if q.high_bits() {
                    code = v::_mm256_or_si256(code, fifth_bits_256(qh, i));
                }
                if q == QType::IQ4_NL {
                    code = v::_mm256_shuffle_epi8(levels, code); // nibble -> its level
                }
                let op = match (signed, sign_trick) {
                    (true, true) => v::_mm256_abs_epi8(code),
                    (true, false) => v::_mm256_xor_si256(code, flip), // code + 128: unsigned
                    _ => code,
                };
                for r in 0..XR {
                    let xs = xq.q.as_ptr().add((t.r0 + r) * k + b * QK) as *const i32;
                    let mut xv = v::_mm256_set1_epi32(*xs.add(i));
                    if sign_trick {
                        xv = v::_mm256_sign_epi8(xv, code);
                    }
                    s[r] = dot4_256::<VNNI>(s[r], op, xv);
                }
            }
            for r in 0..XR {
                let row = t.r0 + r;
                let sum = *xq.sum.get_unchecked(row * nb + b);
                let si = match q {
                    QType::Q8_0 | QType::IQ4_NL if !sign_trick => {
                        v::_mm256_sub_epi32(s[r], v::_mm256_set1_epi32(128 * sum))
                    }
                    QType::Q4_0 => v::_mm256_sub_epi32(s[r], v::_mm256_set1_epi32(8 * sum)),
                    QType::Q5_0 => v::_mm256_sub_epi32(s[r], v::_mm256_set1_epi32(16 * sum)),
                    _ => s[r],
                };
                let scale = v::_mm256_mul_ps(d, v::_mm256_set1_ps(*xq.d.get_unchecked(row * nb + b)));
                acc[r] = v::_mm256_fmadd_ps(scale, v::_mm256_cvtepi32_ps(si), acc[r]);
                if q.with_min() {
                    acc[r] = v::_mm256_fmadd_ps(m, v::_mm256_set1_ps(*xq.s.get_unchecked(row * nb + b)), acc[r]);
                }
            }
        }
        for r in 0..XR {
            v::_mm256_storeu_ps(sums[w][r].as_mut_ptr().add(8 * half), acc[r]);
        }
    }
}
