//! Products with weights kept at a GGUF file's own precision:
//! `out = x · dequant(W)ᵀ` for float32 rows `x` (n, k) and a weight `W`
//! (m rows of k values) in the file's format.
//!
//! Formats (ggml's block layouts, little-endian; d and m are float16):
//! - F32, F16, BF16: one value per element.
//! - Q8_0: blocks of 32: d, then 32 int8 q; w = q · d.
//! - Q4_0: blocks of 32: d, then 16 bytes; byte j holds element j in its
//!   low nibble and element j + 16 in its high one; w = d · (q − 8).
//! - Q4_1: blocks of 32: d, m, then 16 bytes as in Q4_0; w = d · q + m.
//! - Q5_0: blocks of 32: d, then qh (4 bytes: bit j is element j's fifth
//!   bit), then 16 bytes as in Q4_0; w = d · (q − 16).
//! - Q5_1: blocks of 32: d, m, qh, 16 bytes; w = d · q + m.
//! - IQ4_NL: blocks of 32 as Q4_0; w = d · `IQ4_NL_VALUES`[q] (16 int8
//!   levels, non-linear).
//! - Q4_K, Q5_K, Q6_K: super-blocks of 256 with 6- or 8-bit sub-block
//!   scales (`kquant.rs`, which also gives their q8 arithmetic: ggml's q8_K).
//!
//! Each weight dequantizes to exactly the float32 value gguf-py's
//! `dequantize` gives: the same float32 operations (a product, then for
//! Q4_1 and Q5_1 a separate sum). The vector paths take Q4_1's and Q5_1's
//! product and sum as one fused multiply-add, which rounds to the same
//! bits: d is a float16's value (11 significant bits) and q an integer
//! below 32, so d·q has at most 16 significant bits and is exact in
//! float32, and rounding d·q + m once is rounding the separate sum (checked
//! for every float16 d and every q).
//!
//! **Panels** (`pack`). The file's bytes are rearranged, none converted,
//! into panels of 16 rows (the last padded with zero rows) read as one
//! sequential stream (4 panels make a stripe, their blocks interleaved),
//! laid out so that one vector lane holds one row: a
//! float format stores element j of the panel's 16 rows side by side; a
//! block format stores, per block, the 16 rows' d (then m), then (Q5) the
//! 16 rows' qh words, then the quant bytes in groups of 64: group g holds
//! bytes 4g..4g + 4 of each of the 16 rows. A 512-bit load is then 16 rows' next values, and 4 bytes of a
//! lane are what an integer dot-product instruction multiplies.
//!
//! **Two functions of the weights** (`Act`), each with one fixed order per
//! output, whatever n, the thread count and the instruction path:
//! - `Act::F32` (the reference): float32 activations;
//!   `out[r, o] = fma(w[o, k−1], x[r, k−1], … fma(w[o, 0], x[r, 0], 0))`,
//!   the fused multiply-adds in index order.
//! - `Act::Q8` (block formats; float formats stay `F32`): each 32-block of
//!   a row of x is quantized as ggml's `quantize_row_q8_0`/`q8_1` do (`q8.rs`),
//!   the block's dot product is an exact integer `s_b`, and
//!   `acc ← fma(d_w·d_x, s_b, acc)` per block in order (Q4_1 then also
//!   `acc ← fma(m_w, s_x, acc)`): llama.cpp's `vec_dot_q4_0_q8_0`,
//!   `q4_1_q8_1`, `q8_0_q8_0` and `iq4_nl_q8_0` arithmetic, in one fixed order.
//!
//! So a row's result is the same bits alone or among any number of rows,
//! on any thread count and every path: greedy speculative output equals
//! target-only greedy output by construction in either mode.

use crate::error::SpecError;
use crate::pool::SharedOut;
use crate::q8::{f16_to_f32, Q8KRows, Q8Rows};

/// Rows of a panel: one 512-bit vector of float32 lanes.
pub const PANEL: usize = 16;
/// Panels of a stripe: their blocks interleaved (block b of the 4 panels
/// side by side), so a tile of up to 4 panels reads one sequential stream.
pub const STRIPE: usize = 4;
/// Elements of a quantized block.
pub const QK: usize = 32;
/// Elements of a K-quant super-block.
pub const QK_K: usize = 256;
/// Bytes of one quant group of a panel block (4 bytes of each of 16 rows).
pub(crate) const GROUP: usize = 64;
/// The most x rows a tile multiplies at once (more rows: several passes
/// over the tile's panels while they sit in cache).
pub(crate) const XMAX: usize = 16;
/// The most panels a tile takes.
pub(crate) const WMAX: usize = 4;

/// A tile's sums: `[panel][x row][lane]`.
pub(crate) type Sums = [[[f32; PANEL]; XMAX]; WMAX];

/// A weight format of a GGUF file that the kernels read natively (ggml's names).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QType {
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    IQ4_NL,
    Q4_K,
    Q5_K,
    Q6_K,
}

/// IQ4_NL's 16 levels (ggml's `kvalues_iq4nl`): the code of nibble q.
pub(crate) const IQ4_NL_VALUES: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];
/// The same levels as float32 (exact), for the vector paths' table lookups.
pub(crate) const IQ4_NL_FLOATS: [f32; 16] = [
    -127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0, 1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0,
];

impl QType {
    /// The format of ggml type id `id` (as gguf-py's `GGMLQuantizationType`).
    pub fn from_ggml(id: u32) -> Option<QType> {
        Some(match id {
            0 => QType::F32,
            1 => QType::F16,
            2 => QType::Q4_0,
            3 => QType::Q4_1,
            6 => QType::Q5_0,
            7 => QType::Q5_1,
            8 => QType::Q8_0,
            12 => QType::Q4_K,
            13 => QType::Q5_K,
            14 => QType::Q6_K,
            20 => QType::IQ4_NL,
            30 => QType::BF16,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            QType::F32 => "F32",
            QType::F16 => "F16",
            QType::BF16 => "BF16",
            QType::Q8_0 => "Q8_0",
            QType::Q4_0 => "Q4_0",
            QType::Q4_1 => "Q4_1",
            QType::Q5_0 => "Q5_0",
            QType::Q5_1 => "Q5_1",
            QType::IQ4_NL => "IQ4_NL",
            QType::Q4_K => "Q4_K",
            QType::Q5_K => "Q5_K",
            QType::Q6_K => "Q6_K",
        }
    }

    /// (elements, bytes) of one block.
    pub fn block(self) -> (usize, usize) {
        match self {
            QType::F32 => (1, 4),
            QType::F16 | QType::BF16 => (1, 2),
            QType::Q8_0 => (QK, 34),
            QType::Q4_0 | QType::IQ4_NL => (QK, 18),
            QType::Q4_1 => (QK, 20),
            QType::Q5_0 => (QK, 22),
            QType::Q5_1 => (QK, 24),
            QType::Q4_K => (QK_K, 144),
            QType::Q5_K => (QK_K, 176),
            QType::Q6_K => (QK_K, 210),
        }
    }

    /// Whether the format is a block format of 32 (integer codes; q8 activations).
    pub fn blocked(self) -> bool {
        self.block().0 == QK
    }

    /// Whether the format is a K-quant (super-blocks of 256, `kquant.rs`).
    pub fn kquant(self) -> bool {
        self.block().0 == QK_K
    }

    /// Float16 scales before a block's quant bytes (d, and m for Q4_1 and Q5_1).
    pub(crate) fn scales(self) -> usize {
        match self {
            QType::Q4_1 | QType::Q5_1 => 2,
            QType::Q8_0 | QType::Q4_0 | QType::Q5_0 | QType::IQ4_NL => 1,
            _ => 0,
        }
    }

    /// Whether a block's value adds a minimum (w = d · q + m): its q8
    /// product needs the sum of each x block.
    pub(crate) fn with_min(self) -> bool {
        matches!(self, QType::Q4_1 | QType::Q5_1)
    }

    /// Whether a 32-block holds a fifth bit per element (qh).
    pub(crate) fn high_bits(self) -> bool {
        matches!(self, QType::Q5_0 | QType::Q5_1)
    }

    /// Bytes of one row's block in the packed layout: the file's, but a
    /// K-quant's 6-bit scales are kept unpacked (one byte each).
    pub(crate) fn packed_block(self) -> usize {
        if self.kquant() {
            crate::kquant::packed_block(self)
        } else {
            self.block().1
        }
    }

    /// Bytes of a row of `k` values (row-major, as in the file); an error
    /// when k is not whole blocks.
    pub fn row_bytes(self, k: usize) -> crate::Result<usize> {
        let (elems, bytes) = self.block();
        if k == 0 || !k.is_multiple_of(elems) {
            return Err(SpecError::Invalid(format!(
                "a {} row holds whole blocks of {elems} values; k = {k} is not a positive \
                 multiple of {elems}",
                self.name()
            )));
        }
        Ok(k / elems * bytes)
    }

    /// Bytes of a packed weight of m rows of k values (whole stripes of 64 rows).
    pub fn packed_len(self, m: usize, k: usize) -> crate::Result<usize> {
        self.row_bytes(k)?;
        Ok(m.div_ceil(PANEL * STRIPE) * PANEL * STRIPE * (k / self.block().0) * self.packed_block())
    }
}

/// Where a packed weight's pieces sit (see the module docs).
#[derive(Clone, Copy)]
pub(crate) struct Layout {
    pub(crate) q: QType,
    pub(crate) k: usize,
    /// Blocks per row (block formats), else k.
    pub(crate) nb: usize,
    /// Bytes of one panel block (block formats) or one panel element (float formats).
    pub(crate) unit: usize,
    /// Offset of the quant groups within a panel block (after d, m and qh).
    pub(crate) qs: usize,
    /// Offset of the 16 rows' qh words (Q5) or high bits (K-quants).
    pub(crate) qh: usize,
}

impl Layout {
    pub(crate) fn of(q: QType, k: usize) -> Layout {
        let elems = q.block().0;
        let (qs, qh) = if q.kquant() {
            crate::kquant::offsets(q)
        } else if q.high_bits() {
            (32 * q.scales() + GROUP, 32 * q.scales())
        } else {
            (32 * q.scales(), 0)
        };
        Layout {
            q,
            k,
            nb: k / elems,
            unit: PANEL * q.packed_block(),
            qs,
            qh,
        }
    }

    /// Start of block `b` (element `b` of a float format) of panel `panel`.
    #[inline(always)]
    pub(crate) fn base(self, panel: usize, b: usize) -> usize {
        ((panel / STRIPE * self.nb + b) * STRIPE + panel % STRIPE) * self.unit
    }

    /// Byte `j` of the quant bytes of panel row `row` in the panel block at `base`.
    #[inline(always)]
    pub(crate) fn q_byte(self, base: usize, row: usize, j: usize) -> usize {
        base + self.qs + (j / 4) * GROUP + row * 4 + j % 4
    }
}

/// A row-major weight (m rows of `row_bytes(k)`) in the packed layout.
pub fn pack(w: &[u8], q: QType, m: usize, k: usize) -> crate::Result<Vec<u8>> {
    let rb = q.row_bytes(k)?;
    check_len("pack", w.len(), m * rb, "w", "m · row bytes")?;
    let lay = Layout::of(q, k);
    let bytes = q.block().1;
    let mut out = vec![0u8; q.packed_len(m, k)?];
    for r in 0..m {
        let (panel, row) = (r / PANEL, r % PANEL);
        for b in 0..lay.nb {
            let src = &w[r * rb + b * bytes..r * rb + (b + 1) * bytes];
            let base = lay.base(panel, b);
            if q.kquant() {
                crate::kquant::put(lay, &crate::kquant::Super::read(q, src), &mut out, base, row);
                continue;
            }
            if !q.blocked() {
                out[base + row * bytes..base + (row + 1) * bytes].copy_from_slice(src);
                continue;
            }
            let s = q.scales();
            for i in 0..s {
                let at = base + 32 * i + 2 * row;
                out[at..at + 2].copy_from_slice(&src[2 * i..2 * i + 2]);
            }
            let mut quants = &src[2 * s..];
            if q.high_bits() {
                let at = base + lay.qh + 4 * row;
                out[at..at + 4].copy_from_slice(&quants[..4]);
                quants = &quants[4..];
            }
            for (j, &byte) in quants.iter().enumerate() {
                out[lay.q_byte(base, row, j)] = byte;
            }
        }
    }
    Ok(out)
}

/// Block `b` of row `r` of a packed weight, in the file's row-major block
/// layout (`out` has the block's bytes).
fn row_block(p: &[u8], lay: Layout, r: usize, b: usize, out: &mut [u8]) {
    let (panel, row) = (r / PANEL, r % PANEL);
    let base = lay.base(panel, b);
    let (q, bytes) = (lay.q, lay.q.block().1);
    if q.kquant() {
        crate::kquant::get(lay, p, base, row).write(q, &mut out[..bytes]);
        return;
    }
    if !q.blocked() {
        out[..bytes].copy_from_slice(&p[base + row * bytes..base + (row + 1) * bytes]);
        return;
    }
    let s = q.scales();
    for i in 0..s {
        out[2 * i..2 * i + 2].copy_from_slice(&p[base + 32 * i + 2 * row..base + 32 * i + 2 * row + 2]);
    }
    let mut at = 2 * s;
    if q.high_bits() {
        out[at..at + 4].copy_from_slice(&p[base + lay.qh + 4 * row..base + lay.qh + 4 * row + 4]);
        at += 4;
    }
    for j in 0..bytes - at {
        out[at + j] = p[lay.q_byte(base, row, j)];
    }
}

/// Rows `rows` of a packed weight (m rows of k values), in the file's
/// row-major layout: the bytes a row-major reader takes.
pub fn unpack_rows(p: &[u8], q: QType, k: usize, m: usize, rows: &[i64]) -> crate::Result<Vec<u8>> {
    let rb = q.row_bytes(k)?;
    check_len(
        "unpack_rows",
        p.len(),
        q.packed_len(m, k)?,
        "packed",
        "the packed length",
    )?;
    check_rows("unpack_rows", rows, m)?;
    let (lay, bytes) = (Layout::of(q, k), q.block().1);
    let mut out = vec![0u8; rows.len() * rb];
    for (i, &r) in rows.iter().enumerate() {
        for b in 0..lay.nb {
            let at = i * rb + b * bytes;
            row_block(p, lay, r as usize, b, &mut out[at..at + bytes]);
        }
    }
    Ok(out)
}

fn check_rows(what: &str, rows: &[i64], m: usize) -> crate::Result<()> {
    for (i, &r) in rows.iter().enumerate() {
        if r < 0 || r as usize >= m {
            return Err(SpecError::Invalid(format!(
                "{what}: rows[{i}] = {r} is out of range; the weight has rows 0..{m}"
            )));
        }
    }
    Ok(())
}

#[inline(always)]
pub(crate) fn half(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// One row-major block (`bytes` starting at the block) dequantized into
/// `out` (its elements), as gguf-py computes it: the reference.
pub(crate) fn dequant_block(q: QType, bytes: &[u8], out: &mut [f32]) {
    match q {
        QType::F32 => out[0] = f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
        QType::F16 => out[0] = half(bytes, 0),
        QType::BF16 => out[0] = f32::from_bits((u16::from_le_bytes([bytes[0], bytes[1]]) as u32) << 16),
        QType::Q8_0 => {
            let d = half(bytes, 0);
            for j in 0..QK {
                out[j] = (bytes[2 + j] as i8) as f32 * d;
            }
        }
        QType::Q4_0 => {
            let d = half(bytes, 0);
            for j in 0..QK / 2 {
                let b = bytes[2 + j];
                out[j] = d * ((b & 0x0f) as i32 - 8) as f32;
                out[j + QK / 2] = d * ((b >> 4) as i32 - 8) as f32;
            }
        }
        QType::IQ4_NL => {
            let d = half(bytes, 0);
            for j in 0..QK / 2 {
                let b = bytes[2 + j];
                out[j] = d * IQ4_NL_VALUES[(b & 0x0f) as usize] as f32;
                out[j + QK / 2] = d * IQ4_NL_VALUES[(b >> 4) as usize] as f32;
            }
        }
        QType::Q4_1 => {
            let (d, m) = (half(bytes, 0), half(bytes, 2));
            for j in 0..QK / 2 {
                let b = bytes[4 + j];
                out[j] = d * (b & 0x0f) as f32 + m;
                out[j + QK / 2] = d * (b >> 4) as f32 + m;
            }
        }
        QType::Q5_0 | QType::Q5_1 => {
            let s = 2 * q.scales();
            let d = half(bytes, 0);
            let qh = u32::from_le_bytes([bytes[s], bytes[s + 1], bytes[s + 2], bytes[s + 3]]);
            for j in 0..QK {
                let b = bytes[s + 4 + j % 16];
                let nib = if j < 16 { b & 0x0f } else { b >> 4 } as i32;
                let c = nib | (((qh >> j) & 1) as i32) << 4;
                out[j] = if q == QType::Q5_0 {
                    d * (c - 16) as f32
                } else {
                    d * c as f32 + half(bytes, 2)
                };
            }
        }
        QType::Q4_K | QType::Q5_K | QType::Q6_K => crate::kquant::Super::read(q, bytes).dequant(q, out),
    }
}

/// The integer code of element `e` (0..32) of a block format's row in the
/// panel block at `base`: Q8_0 q, Q4_0 q − 8, Q4_1 q, Q5_0 q − 16, Q5_1 q,
/// IQ4_NL its level of q (what `Act::Q8` multiplies).
#[inline(always)]
pub(crate) fn code(p: &[u8], lay: Layout, base: usize, row: usize, e: usize) -> i32 {
    if lay.q == QType::Q8_0 {
        return p[lay.q_byte(base, row, e)] as i8 as i32;
    }
    let byte = p[lay.q_byte(base, row, e % 16)];
    let mut nib = if e < 16 { byte & 0x0f } else { byte >> 4 } as i32;
    if lay.q.high_bits() {
        let at = base + lay.qh + 4 * row;
        let qh = u32::from_le_bytes([p[at], p[at + 1], p[at + 2], p[at + 3]]);
        nib |= (((qh >> e) & 1) as i32) << 4;
    }
    match lay.q {
        QType::Q4_0 => nib - 8,
        QType::Q5_0 => nib - 16,
        QType::Q4_1 | QType::Q5_1 => nib,
        QType::IQ4_NL => IQ4_NL_VALUES[nib as usize] as i32,
        _ => unreachable!("integer codes are of block formats"),
    }
}

/// Element `j` of row `r` of a packed weight as float32 (gguf-py's value).
#[inline(always)]
pub(crate) fn value(p: &[u8], lay: Layout, r: usize, j: usize) -> f32 {
    let (panel, row) = (r / PANEL, r % PANEL);
    let q = lay.q;
    if q.kquant() {
        return crate::kquant::value(p, lay, lay.base(panel, j / QK_K), row, j % QK_K);
    }
    if !q.blocked() {
        let at = lay.base(panel, j) + row * q.block().1;
        let mut out = [0.0f32];
        dequant_block(q, &p[at..], &mut out);
        return out[0];
    }
    let base = lay.base(panel, j / QK);
    let (d, e) = (half(p, base + 2 * row), j % QK);
    match q {
        QType::Q8_0 => code(p, lay, base, row, e) as f32 * d,
        QType::Q4_0 | QType::Q5_0 | QType::IQ4_NL => d * code(p, lay, base, row, e) as f32,
        _ => d * code(p, lay, base, row, e) as f32 + half(p, base + 32 + 2 * row),
    }
}

/// Rows `rows` of a packed weight (m rows of `k` values in format `q`) as
/// float32 into `out` (rows.len(), k), on `threads` threads (each a range
/// of the rows). Ids out of range are an error. Few rows: an embedding's lookup.
#[allow(clippy::too_many_arguments)]
pub fn dequantize_rows(
    p: &[u8],
    q: QType,
    k: usize,
    m: usize,
    rows: &[i64],
    out: &mut [f32],
    threads: usize,
) -> crate::Result<()> {
    check_len("dequantize", out.len(), rows.len() * k, "out", "len(rows) · k")?;
    check_len(
        "dequantize",
        p.len(),
        q.packed_len(m, k)?,
        "packed",
        "the packed length",
    )?;
    check_rows("dequantize", rows, m)?;
    check_threads("dequantize", threads)?;
    let lay = Layout::of(q, k);
    let ptr = SharedOut(out.as_mut_ptr());
    let parts = threads.min(rows.len() / 64).max(1); // a thread pays past some rows
    let job = |part: usize| {
        let (lo, hi) = (part * rows.len() / parts, (part + 1) * rows.len() / parts);
        for (i, &r) in rows.iter().enumerate().take(hi).skip(lo) {
            // SAFETY: each part writes only its rows lo..hi of `out` (len(rows) · k, checked).
            let o = unsafe { std::slice::from_raw_parts_mut(ptr.at(i * k), k) };
            for (j, v) in o.iter_mut().enumerate() {
                *v = value(p, lay, r as usize, j);
            }
        }
    };
    run_parts(threads, parts, &job);
    Ok(())
}

/// The whole weight (m rows of `k` values) as float32, transposed: `out`
/// (k, m), `out[j, o] = dequant(W)[o, j]` exactly: the matrix a prefill's
/// dense products multiply (`QuantLinear.dense`). Panel by panel, each
/// element's 16 rows as one vector (the kernels' own dequantization).
pub fn dequantize_transposed(
    p: &[u8],
    q: QType,
    k: usize,
    m: usize,
    out: &mut [f32],
    threads: usize,
) -> crate::Result<()> {
    check_len("dequantize_transposed", out.len(), k * m, "out", "k · m")?;
    check_len(
        "dequantize_transposed",
        p.len(),
        q.packed_len(m, k)?,
        "packed",
        "the packed length",
    )?;
    check_threads("dequantize_transposed", threads)?;
    let lay = Layout::of(q, k);
    let panels = m.div_ceil(PANEL);
    let ptr = SharedOut(out.as_mut_ptr());
    let parts = threads.min(panels).max(1);
    let path = best_path();
    let job = |part: usize| {
        let mut col = [0.0f32; PANEL];
        for panel in part * panels / parts..(part + 1) * panels / parts {
            let rows = PANEL.min(m - panel * PANEL);
            for j in 0..k {
                crate::kernels::panel_values(p, lay, panel, j, path, &mut col);
                // SAFETY: each part writes only its panels' columns of row j of `out` (k · m).
                let o = unsafe { std::slice::from_raw_parts_mut(ptr.at(j * m + panel * PANEL), rows) };
                o.copy_from_slice(&col[..rows]);
            }
        }
    };
    run_parts(threads, parts, &job);
    Ok(())
}

fn run_parts(threads: usize, parts: usize, job: &(dyn Fn(usize) + Sync)) {
    if parts == 1 {
        job(0);
    } else {
        crate::pool::global(threads - 1).run(parts, job);
    }
}

/// A thread count the pool can serve: 1 (the calling thread) up to its workers + 1.
fn check_threads(what: &str, threads: usize) -> crate::Result<()> {
    if threads == 0 || threads > crate::pool::MAX_WORKERS + 1 {
        return Err(SpecError::Invalid(format!(
            "{what}: threads = {threads}; expected 1..{}",
            crate::pool::MAX_WORKERS + 1
        )));
    }
    Ok(())
}

fn check_len(what: &str, got: usize, want: usize, name: &str, expected: &str) -> crate::Result<()> {
    if got != want {
        return Err(SpecError::Invalid(format!(
            "{what}: {name} has {got} entries (bytes for a weight); expected {expected} = {want}"
        )));
    }
    Ok(())
}

/// The activations a product takes (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    F32,
    Q8,
}

impl Act {
    pub fn name(self) -> &'static str {
        match self {
            Act::F32 => "f32",
            Act::Q8 => "q8",
        }
    }

    pub fn from_name(name: &str) -> Option<Act> {
        [Act::F32, Act::Q8].into_iter().find(|a| a.name() == name)
    }
}

/// The instruction paths, chosen at run time. All sum every output in the
/// same order (integers, where they are summed, exactly), so they give the
/// same bits; only the speed differs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    Portable,
    /// AVX2 + FMA + F16C: 8 rows per vector; q8 by `vpmaddubsw`.
    Avx2,
    /// AVX2 with AVX-VNNI: q8 by `vpdpbusd` on 256 bits.
    Avx2Vnni,
    /// AVX-512 (F, BW, VL, DQ): 16 rows per vector; q8 by `vpmaddubsw`.
    Avx512,
    /// AVX-512 with VNNI: q8 by `vpdpbusd` on 512 bits.
    Avx512Vnni,
}

const PATHS: [Path; 5] = [
    Path::Portable,
    Path::Avx2,
    Path::Avx2Vnni,
    Path::Avx512,
    Path::Avx512Vnni,
];

impl Path {
    pub fn name(self) -> &'static str {
        match self {
            Path::Portable => "portable",
            Path::Avx2 => "avx2",
            Path::Avx2Vnni => "avx2-vnni",
            Path::Avx512 => "avx512",
            Path::Avx512Vnni => "avx512-vnni",
        }
    }

    pub fn from_name(name: &str) -> Option<Path> {
        PATHS.into_iter().find(|p| p.name() == name)
    }

    pub fn all() -> [Path; 5] {
        PATHS
    }

    pub(crate) fn avx512(self) -> bool {
        matches!(self, Path::Avx512 | Path::Avx512Vnni)
    }

    pub(crate) fn vector(self) -> bool {
        self != Path::Portable
    }
}

/// What this CPU has, checked once by std (then cached).
struct Features {
    avx2: bool,
    avx_vnni: bool,
    avx512: bool,
    avx512_vnni: bool,
}

fn features() -> Features {
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c");
        let avx512 = avx2
            && std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("avx512dq");
        Features {
            avx2,
            avx_vnni: avx2 && std::is_x86_feature_detected!("avxvnni"),
            avx512,
            avx512_vnni: avx512 && std::is_x86_feature_detected!("avx512vnni"),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    Features {
        avx2: false,
        avx_vnni: false,
        avx512: false,
        avx512_vnni: false,
    }
}

/// The widest path this CPU runs.
pub fn best_path() -> Path {
    let f = features();
    if f.avx512_vnni {
        Path::Avx512Vnni
    } else if f.avx512 {
        Path::Avx512
    } else if f.avx_vnni {
        Path::Avx2Vnni
    } else if f.avx2 {
        Path::Avx2
    } else {
        Path::Portable
    }
}

/// Whether `path` runs on this CPU.
pub fn path_available(path: Path) -> bool {
    let f = features();
    match path {
        Path::Portable => true,
        Path::Avx2 => f.avx2,
        Path::Avx2Vnni => f.avx_vnni,
        Path::Avx512 => f.avx512,
        Path::Avx512Vnni => f.avx512_vnni,
    }
}

/// `out[r, o] = Σ_j x[r, j] · dequant(w)[o, j]` in the order of `act` (see
/// the module docs) for row-major `x` (n, k), a packed weight `p` (`pack`:
/// m rows of k values in format `q`) and `out` (n, m), on `threads`
/// threads (1: the calling thread; the others from `pool::global`) each
/// taking a range of panels, on the instruction `path` (a path this CPU
/// lacks is an error).
#[allow(clippy::too_many_arguments)]
pub fn qlinear(
    x: &[f32],
    p: &[u8],
    q: QType,
    out: &mut [f32],
    n: usize,
    k: usize,
    m: usize,
    threads: usize,
    path: Path,
    act: Act,
) -> crate::Result<()> {
    product("qlinear", x, p, q, out, n, k, m, None, threads, path, act)
}

/// `qlinear` on the output panels `panels` only (each of 16 outputs: panel
/// i is outputs 16i..16i + 16; strictly increasing, below ⌈m / 16⌉): those
/// outputs of every x row get exactly the bits `qlinear` gives them (the
/// same sums in the same order), the others are not written. An LM head
/// whose rows are masked (a grammar's allowed tokens) reads only the
/// panels that hold an allowed token. Threads take equal shares of the
/// listed panels (at least `PANELS_PER_PART` each).
#[allow(clippy::too_many_arguments)]
pub fn qlinear_panels(
    x: &[f32],
    p: &[u8],
    q: QType,
    out: &mut [f32],
    n: usize,
    k: usize,
    m: usize,
    panels: &[usize],
    threads: usize,
    path: Path,
    act: Act,
) -> crate::Result<()> {
    let count = m.div_ceil(PANEL);
    if let Some(i) = (0..panels.len()).find(|&i| panels[i] >= count || (i > 0 && panels[i] <= panels[i - 1])) {
        return Err(SpecError::Invalid(format!(
            "qlinear_panels: panels[{i}] = {} after {:?}; expected strictly increasing panel indices \
             below {count} (= ⌈m / {PANEL}⌉, m = {m})",
            panels[i],
            i.checked_sub(1).map(|j| panels[j])
        )));
    }
    product(
        "qlinear_panels",
        x,
        p,
        q,
        out,
        n,
        k,
        m,
        Some(panels),
        threads,
        path,
        act,
    )
}

/// The fewest listed panels a thread of `qlinear_panels` takes: a few
/// panels cost less than waking a second thread.
const PANELS_PER_PART: usize = 8;

/// `qlinear` (`panels` None: every panel) or `qlinear_panels`.
#[allow(clippy::too_many_arguments)]
fn product(
    what: &str,
    x: &[f32],
    p: &[u8],
    q: QType,
    out: &mut [f32],
    n: usize,
    k: usize,
    m: usize,
    panels: Option<&[usize]>,
    threads: usize,
    path: Path,
    act: Act,
) -> crate::Result<()> {
    if !path_available(path) {
        return Err(SpecError::Invalid(format!(
            "{what}: this CPU cannot run the {} path (its best is {})",
            path.name(),
            best_path().name()
        )));
    }
    q.row_bytes(k)?;
    check_len(what, x.len(), n * k, "x", "n · k")?;
    check_len(what, p.len(), q.packed_len(m, k)?, "w", "the packed length (see pack)")?;
    check_len(what, out.len(), n * m, "out", "n · m")?;
    check_threads(what, threads)?;
    let act = if q.blocked() || q.kquant() { act } else { Act::F32 };
    let q8 = act == Act::Q8;
    let quantized = (q8 && q.blocked()).then(|| Q8Rows::of(x, n, k, q.with_min(), path.vector()));
    let quantized_k = (q8 && q.kquant()).then(|| Q8KRows::of(x, n, k, path.vector()));
    let xq = Quantized {
        q8: quantized.as_ref(),
        q8k: quantized_k.as_ref(),
    };
    let lay = Layout::of(q, k);
    let passes = x_passes(n, crate::kernels::x_rows(path, false, q));
    if q8 || !interleaves(passes) {
        walk(x, xq, p, lay, out, (n, m), panels, threads, path);
    } else {
        // float32 tiles of many rows read them side by side (`interleave`)
        INTERLEAVED.with_borrow_mut(|x_il| {
            interleave(x, k, passes, x_il, path);
            walk(x_il, xq, p, lay, out, (n, m), panels, threads, path);
        });
    }
    Ok(())
}

thread_local! {
    /// The calling thread's interleaved x (`interleave`), kept between products.
    static INTERLEAVED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `product`'s walk of the panels (all, or the listed ones) on `threads`.
#[allow(clippy::too_many_arguments)]
fn walk(
    x: &[f32],
    xq: Quantized<'_>,
    p: &[u8],
    lay: Layout,
    out: &mut [f32],
    (n, m): (usize, usize),
    panels: Option<&[usize]>,
    threads: usize,
    path: Path,
) {
    let ptr = SharedOut(out.as_mut_ptr());
    match panels {
        None => {
            let (panels, stripes) = (m.div_ceil(PANEL), m.div_ceil(PANEL * STRIPE));
            let parts = threads.min(stripes).max(1);
            // equal shares of panels: a stripe may be split between two parts (9
            // stripes on 2 threads: 18 panels each, not 4 and 5 stripes)
            let job = |part: usize| {
                let (lo, hi) = (part * panels / parts, (part + 1) * panels / parts);
                // SAFETY: each part writes only the columns of its panels lo..hi
                // (rows below m) of `out`, which holds n · m entries (checked above).
                unsafe { panels_range(x, xq, p, lay, ptr, n, m, lo, hi, path) };
            };
            run_parts(threads, parts, &job);
        }
        Some(list) => {
            let parts = threads.min(list.len() / PANELS_PER_PART).max(1);
            let job = |part: usize| {
                let share = &list[part * list.len() / parts..(part + 1) * list.len() / parts];
                // each run of consecutive panels in one walk
                let mut i = 0;
                while i < share.len() {
                    let mut j = i + 1;
                    while j < share.len() && share[j] == share[j - 1] + 1 {
                        j += 1;
                    }
                    // SAFETY: the listed panels are distinct and below ⌈m / 16⌉
                    // (checked by `qlinear_panels`), so the parts write disjoint
                    // columns (rows below m) of `out`, which holds n · m entries.
                    unsafe { panels_range(x, xq, p, lay, ptr, n, m, share[i], share[j - 1] + 1, path) };
                    i = j;
                }
            };
            run_parts(threads, parts, &job);
        }
    }
}

/// A product's quantized activations: none (float32), a 32-block format's
/// q8_0/q8_1 rows, or a K-quant's q8_K rows.
#[derive(Clone, Copy)]
pub(crate) struct Quantized<'a> {
    pub(crate) q8: Option<&'a Q8Rows>,
    pub(crate) q8k: Option<&'a Q8KRows>,
}

impl Quantized<'_> {
    pub(crate) fn any(self) -> bool {
        self.q8.is_some() || self.q8k.is_some()
    }
}

/// Panels lo..hi against every x row into `out` (n, m), stripe by stripe:
/// tiles of W panels of one stripe (fewer x rows, more panels), each
/// tile's panels passed over by the x rows XR at a time while they sit in
/// cache; the first tile of a stripe asks the memory for the stripe's next
/// blocks (of a stripe shared with another part, each tile for its own
/// panels'). A stripe of several tiles is walked in chunks of blocks where
/// the tiles allow it (`kernels::chunk_blocks`), each tile of the first
/// pass asking for its own panels' next blocks, its sums carried from
/// chunk to chunk.
#[allow(clippy::too_many_arguments)]
unsafe fn panels_range(
    x: &[f32],
    xq: Quantized<'_>,
    p: &[u8],
    lay: Layout,
    out: SharedOut,
    n: usize,
    m: usize,
    lo: usize,
    hi: usize,
    path: Path,
) {
    let passes = x_passes(n, crate::kernels::x_rows(path, xq.any(), lay.q));
    let w = crate::kernels::panels_per_tile(path, passes.rows(0), xq.any(), lay.q);
    let tiles = STRIPE.div_ceil(w) * passes.count;
    let chunk = crate::kernels::chunk_blocks(path, lay.q).filter(|_| tiles > 1 && n <= CHUNKED_ROWS);
    let chunked = chunk.is_some();
    let chunk = chunk.unwrap_or(lay.nb);
    // one tile's sums, or (chunked) each tile's carried from chunk to chunk
    let mut carry: Vec<Sums> = vec![[[[0.0; PANEL]; XMAX]; WMAX]; if chunked { tiles } else { 1 }];
    let panels = m.div_ceil(PANEL);
    for stripe in lo / STRIPE..hi.div_ceil(STRIPE) {
        let stripe_end = ((stripe + 1) * STRIPE).min(panels);
        let (start, end) = ((stripe * STRIPE).max(lo), stripe_end.min(hi));
        let whole = start == stripe * STRIPE && end == stripe_end;
        let mut b0 = 0;
        while b0 < lay.nb {
            let b1 = (b0 + chunk).min(lay.nb);
            let mut panel = start;
            let mut ti = 0;
            while panel < end {
                let wt = w.min(end - panel);
                let mut r0 = 0;
                for pass in 0..passes.count {
                    let xr = passes.rows(pass);
                    let lead = r0 == 0 && (chunked || panel == start);
                    let t = crate::kernels::Tile {
                        r0,
                        xr,
                        panel,
                        w: wt,
                        lead,
                        own: chunked || !whole,
                        b0,
                        b1,
                    };
                    let sums = &mut carry[if chunked { ti } else { 0 }];
                    crate::kernels::tile(x, xq, p, lay, t, path, sums);
                    if b1 == lay.nb {
                        for (i, s) in sums.iter().enumerate().take(wt) {
                            let first = (panel + i) * PANEL;
                            let rows = PANEL.min(m - first);
                            for (r, lanes) in s.iter().enumerate().take(xr) {
                                let at = out.at((r0 + r) * m + first);
                                if rows == PANEL {
                                    // a whole panel's row: a fixed-size copy, inlined (a
                                    // slice's length sent each 64 bytes through memmove)
                                    *(at as *mut [f32; PANEL]) = *lanes;
                                } else {
                                    std::slice::from_raw_parts_mut(at, rows).copy_from_slice(&lanes[..rows]);
                                }
                            }
                        }
                    }
                    r0 += xr;
                    ti += 1;
                }
                panel += wt;
            }
            b0 = b1;
        }
    }
}

/// How a tile's panels are passed over by n x rows: `count` passes of
/// ⌊n/count⌋ or ⌈n/count⌉ rows (the larger ones first), the fewest passes
/// of at most `most` rows. Balanced, so that no pass is a lone row left
/// over (17 rows as 9 + 8, not 16 + 1: a pass of one row keeps one chain
/// of multiply-adds per panel, each waiting on the last).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct XPasses {
    pub(crate) count: usize,
    n: usize,
}

impl XPasses {
    /// The x rows of pass i (< count).
    pub(crate) fn rows(self, i: usize) -> usize {
        if self.count == 0 {
            return 0;
        }
        self.n / self.count + usize::from(i < self.n % self.count)
    }
}

/// n x rows in passes of at most `most` (`XPasses`).
pub(crate) fn x_passes(n: usize, most: usize) -> XPasses {
    XPasses {
        count: n.div_ceil(most),
        n,
    }
}

/// A float32 pass of at least this many x rows reads them interleaved
/// (`interleave`): a tile then reaches its rows' values of one element
/// from one address by constant offsets. Row-major, the addresses of 9 or
/// more rows spill the general registers (SmolLM2's float32 forward over 9
/// and 17 positions took 1.20x and 1.25x the time); at 8 rows (a tile of
/// two panels) the copy cost more than it saved (0.94x).
pub(crate) const INTERLEAVED_ROWS: usize = 9;

/// Where element j of row r of a float32 pass of xr rows is, from the
/// pass's first value (at r0·k): j·xr + r if xr ≥ `INTERLEAVED_ROWS`
/// (the rows side by side), else r·k + j (row-major).
#[inline(always)]
pub(crate) fn x_index(xr: usize, k: usize, r: usize, j: usize) -> usize {
    if xr >= INTERLEAVED_ROWS {
        j * xr + r
    } else {
        r * k + j
    }
}

/// Whether any pass of `passes` reads its rows interleaved.
fn interleaves(passes: XPasses) -> bool {
    passes.count > 0 && passes.rows(0) >= INTERLEAVED_ROWS
}

/// x (n rows of k) as the float32 tiles read it (`x_index`): each pass
/// (`x_passes`) of at least `INTERLEAVED_ROWS` rows with its rows side by
/// side, the others row-major as they were.
fn interleave(x: &[f32], k: usize, passes: XPasses, out: &mut Vec<f32>, path: Path) {
    out.resize(x.len(), 0.0);
    let mut r0 = 0;
    for pass in 0..passes.count {
        let xr = passes.rows(pass);
        let (rows, to) = (&x[r0 * k..(r0 + xr) * k], &mut out[r0 * k..(r0 + xr) * k]);
        if xr < INTERLEAVED_ROWS {
            to.copy_from_slice(rows);
        } else {
            crate::kernels::interleave_rows(rows, k, xr, to, path);
        }
        r0 += xr;
    }
}

/// The most x rows a chunked walk takes (`panels_range`): verification
/// blocks and batches; a prefill's many passes walk each panel whole.
const CHUNKED_ROWS: usize = 2 * XMAX;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::linear::tests::data;

    /// Random bytes of m rows in format q (scales as arbitrary float16
    /// bit patterns of finite, modest values, including 0 and negatives).
    pub(crate) fn weight(q: QType, m: usize, k: usize, seed: u32) -> Vec<u8> {
        let rb = q.row_bytes(k).unwrap();
        let mut b: Vec<u8> = (0..m * rb)
            .map(|i| ((i as u32).wrapping_mul(2_246_822_519).wrapping_add(seed * 97) >> 13) as u8)
            .collect();
        let (elems, bytes) = q.block();
        if q.kquant() {
            // d (and dmin) modest float16s of both signs; the rest random
            let at = if q == QType::Q6_K { vec![208] } else { vec![0, 2] };
            for blk in 0..m * (k / elems) {
                for (i, &a) in at.iter().enumerate() {
                    let h = 0x1800 + ((blk * 53 + i * 7) % 0x0c00) as u16;
                    let h = if (blk + i) % 3 == 0 { h | 0x8000 } else { h };
                    b[blk * bytes + a..blk * bytes + a + 2].copy_from_slice(&h.to_le_bytes());
                }
            }
            return b;
        }
        for blk in 0..m * (k / elems) {
            for s in 0..q.scales() {
                // |d| around 2^-7..2^-3, some zero
                let h: u16 = if blk % 11 == 3 {
                    0
                } else {
                    0x2000 + ((blk * 37 + s * 5) % 0x0c00) as u16
                };
                let h = if (blk + s) % 3 == 0 { h | 0x8000 } else { h };
                b[blk * bytes + 2 * s..blk * bytes + 2 * s + 2].copy_from_slice(&h.to_le_bytes());
            }
        }
        if q == QType::Q8_0 {
            for blk in 0..m * (k / elems) {
                b[blk * bytes + 2] = 0x80; // -128: a code the file may hold
            }
        }
        if q == QType::F32 {
            for (i, c) in b.chunks_mut(4).enumerate() {
                c.copy_from_slice(&data(1, i as u32)[0].to_le_bytes());
            }
        }
        if q == QType::F16 {
            for c in b.chunks_mut(2) {
                c[1] &= 0x3f; // finite, modest
            }
        }
        if q == QType::BF16 {
            for c in b.chunks_mut(2) {
                c[1] = 0x3c | (c[1] & 0x81); // exponent near 1, both signs
            }
        }
        b
    }

    /// The float32 values of a row-major weight, block by block (the reference).
    pub(crate) fn dequant(q: QType, w: &[u8], m: usize, k: usize) -> Vec<f32> {
        let (elems, bytes) = q.block();
        let rb = q.row_bytes(k).unwrap();
        let mut out = vec![0.0; m * k];
        for r in 0..m {
            for b in 0..k / elems {
                dequant_block(q, &w[r * rb + b * bytes..], &mut out[r * k + b * elems..]);
            }
        }
        out
    }

    pub(crate) const ALL: [QType; 12] = [
        QType::F32,
        QType::F16,
        QType::BF16,
        QType::Q8_0,
        QType::Q4_0,
        QType::Q4_1,
        QType::Q5_0,
        QType::Q5_1,
        QType::IQ4_NL,
        QType::Q4_K,
        QType::Q5_K,
        QType::Q6_K,
    ];

    /// A short row length of format q (a few blocks).
    pub(crate) fn short_k(q: QType) -> usize {
        match q.block().0 {
            1 => 13,
            QK => 96,
            _ => 2 * QK_K,
        }
    }

    /// (threads, path) pairs: every path this CPU runs, on 1, 2 and 3 threads.
    pub(crate) fn runs() -> Vec<(usize, Path)> {
        let available: Vec<Path> = Path::all().into_iter().filter(|p| path_available(*p)).collect();
        available.iter().flat_map(|&p| [(1, p), (2, p), (3, p)]).collect()
    }

    /// `qlinear` of `x` (n, k) by `packed` (m rows) gives `want` bit for bit
    /// on every (threads, path) this CPU runs.
    pub(crate) fn assert_every_path(
        x: &[f32],
        packed: &[u8],
        q: QType,
        (n, k, m): (usize, usize, usize),
        act: Act,
        want: &[f32],
    ) {
        for (threads, path) in runs() {
            let mut out = vec![f32::NAN; n * m];
            qlinear(x, packed, q, &mut out, n, k, m, threads, path, act).unwrap();
            assert_eq!(
                bits(&out),
                bits(want),
                "{q:?} n={n} k={k} m={m} threads={threads} {path:?}"
            );
        }
    }

    /// The documented f32 order, written out plainly on the dequantized weight.
    fn reference_f32(x: &[f32], wf: &[f32], n: usize, k: usize, m: usize) -> Vec<f32> {
        let mut out = vec![0.0f32; n * m];
        for r in 0..n {
            for o in 0..m {
                let mut acc = 0.0f32;
                for j in 0..k {
                    acc = wf[o * k + j].mul_add(x[r * k + j], acc);
                }
                out[r * m + o] = acc;
            }
        }
        out
    }

    /// The documented q8 order, from the row-major bytes and the quantized rows.
    fn reference_q8(x: &[f32], q: QType, w: &[u8], n: usize, k: usize, m: usize) -> Vec<f32> {
        let xq = Q8Rows::of(x, n, k, q.with_min(), false);
        let (rb, bytes) = (q.row_bytes(k).unwrap(), q.block().1);
        let mut out = vec![0.0f32; n * m];
        for r in 0..n {
            for o in 0..m {
                let mut acc = 0.0f32;
                for b in 0..k / QK {
                    let blk = &w[o * rb + b * bytes..o * rb + (b + 1) * bytes];
                    let codes: Vec<i32> = (0..QK)
                        .map(|e| match q {
                            QType::Q8_0 => blk[2 + e] as i8 as i32,
                            _ => {
                                let at = 2 * q.scales() + if q.high_bits() { 4 } else { 0 };
                                let byte = blk[at + e % 16];
                                let mut nib = if e < 16 { byte & 15 } else { byte >> 4 } as i32;
                                if q.high_bits() {
                                    let s = 2 * q.scales();
                                    let qh = u32::from_le_bytes([blk[s], blk[s + 1], blk[s + 2], blk[s + 3]]);
                                    nib |= (((qh >> e) & 1) as i32) << 4;
                                }
                                match q {
                                    QType::Q4_0 => nib - 8,
                                    QType::Q5_0 => nib - 16,
                                    QType::IQ4_NL => IQ4_NL_VALUES[nib as usize] as i32,
                                    _ => nib,
                                }
                            }
                        })
                        .collect();
                    let s: i32 = (0..QK).map(|e| codes[e] * xq.q[r * k + b * QK + e] as i32).sum();
                    let dw = f16_to_f32(u16::from_le_bytes([blk[0], blk[1]]));
                    acc = (dw * xq.d[r * (k / QK) + b]).mul_add(s as f32, acc);
                    if q.with_min() {
                        let mw = f16_to_f32(u16::from_le_bytes([blk[2], blk[3]]));
                        acc = mw.mul_add(xq.s[r * (k / QK) + b], acc);
                    }
                }
                out[r * m + o] = acc;
            }
        }
        out
    }

    pub(crate) fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn packing_keeps_every_byte_and_dequantizes_as_the_rows_do() {
        for q in ALL {
            let k = short_k(q);
            for m in [1, 7, 16, 17, 37] {
                let w = weight(q, m, k, 9);
                let packed = pack(&w, q, m, k).unwrap();
                assert_eq!(packed.len(), q.packed_len(m, k).unwrap());
                let rows: Vec<i64> = (0..m as i64).rev().collect();
                let back = unpack_rows(&packed, q, k, m, &rows).unwrap();
                let rb = q.row_bytes(k).unwrap();
                for (i, &r) in rows.iter().enumerate() {
                    let r = r as usize;
                    assert_eq!(
                        &back[i * rb..(i + 1) * rb],
                        &w[r * rb..(r + 1) * rb],
                        "{q:?} m={m} row {r}"
                    );
                }
                let want = dequant(q, &w, m, k);
                let all: Vec<i64> = (0..m as i64).collect();
                let mut values = vec![0.0f32; m * k];
                dequantize_rows(&packed, q, k, m, &all, &mut values, 1).unwrap();
                assert_eq!(bits(&values), bits(&want), "{q:?} m={m}");
                for threads in [1, 2] {
                    let mut t = vec![f32::NAN; k * m];
                    dequantize_transposed(&packed, q, k, m, &mut t, threads).unwrap();
                    for o in 0..m {
                        for j in 0..k {
                            assert_eq!(t[j * m + o].to_bits(), want[o * k + j].to_bits(), "{q:?} m={m}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn rows_dequantize_as_gguf_py_in_any_order_on_any_thread_count() {
        for q in ALL {
            let (m, k) = (300, short_k(q));
            let w = weight(q, m, k, 5);
            let packed = pack(&w, q, m, k).unwrap();
            let want = dequant(q, &w, m, k);
            // every row, reversed, then some repeated
            let rows: Vec<i64> = (0..m as i64).rev().chain([7, 7, 299, 0]).collect();
            for threads in [1, 2, 3] {
                let mut got = vec![f32::NAN; rows.len() * k];
                dequantize_rows(&packed, q, k, m, &rows, &mut got, threads).unwrap();
                for (i, &r) in rows.iter().enumerate() {
                    let (a, b) = (&got[i * k..(i + 1) * k], &want[r as usize * k..(r as usize + 1) * k]);
                    assert_eq!(bits(a), bits(b), "{q:?} row {r} threads={threads}");
                }
            }
        }
    }

    const SHAPES: [(usize, usize); 17] = [
        (1, 1),
        (1, 19),
        (1, 70), // 5 panels: a tile of 4, then one of 1; on 2 threads stripe 0 split 2 + 2
        (2, 40),
        (2, 200), // 13 panels in 4 stripes: on 2 threads stripe 1 split 2 + 2
        (3, 16),
        (3, 70),  // q8: tiles of 2 panels (x shared), then one of 1
        (4, 200), // q8: tiles of 2 panels across split stripes
        (5, 33),
        (6, 50),  // q8: two panels walked operand by operand, then one of 1
        (7, 200), // q8: the same, across split stripes
        (8, 9),
        (9, 40), // q8 with VNNI: the most rows of a pass of two panels
        (13, 70),
        (16, 17),
        (17, 16),
        (23, 50),
    ];

    #[test]
    fn f32_activations_follow_the_documented_order_on_every_path() {
        for q in ALL {
            let k_list: &[usize] = match q.block().0 {
                1 => &[1, 7, 45, 576],
                QK => &[32, 96, 576],
                _ => &[256, 768],
            };
            for &k in k_list {
                for &(n, m) in &SHAPES {
                    let (x, w) = (data(n * k, 1), weight(q, m, k, 2));
                    let packed = pack(&w, q, m, k).unwrap();
                    let want = reference_f32(&x, &dequant(q, &w, m, k), n, k, m);
                    assert_every_path(&x, &packed, q, (n, k, m), Act::F32, &want);
                }
            }
        }
    }

    #[test]
    fn q8_activations_follow_the_documented_order_on_every_path() {
        for q in [
            QType::Q8_0,
            QType::Q4_0,
            QType::Q4_1,
            QType::Q5_0,
            QType::Q5_1,
            QType::IQ4_NL,
        ] {
            for &k in &[32, 96, 576] {
                for &(n, m) in &SHAPES {
                    let (mut x, w) = (data(n * k, 3), weight(q, m, k, 4));
                    x[0] = 0.0; // a block whose largest entry is 0 stays 0
                    if k >= 64 {
                        x[32..64].fill(0.0);
                    }
                    let packed = pack(&w, q, m, k).unwrap();
                    let want = reference_q8(&x, q, &w, n, k, m);
                    assert_every_path(&x, &packed, q, (n, k, m), Act::Q8, &want);
                }
            }
        }
        // a float format takes float32 activations in either mode
        let (q, k) = (QType::F16, 256);
        let (x, w) = (data(3 * k, 1), weight(q, 5, k, 2));
        let packed = pack(&w, q, 5, k).unwrap();
        let (mut a, mut b) = (vec![0.0f32; 15], vec![0.0f32; 15]);
        qlinear(&x, &packed, q, &mut a, 3, k, 5, 1, best_path(), Act::F32).unwrap();
        qlinear(&x, &packed, q, &mut b, 3, k, 5, 1, best_path(), Act::Q8).unwrap();
        assert_eq!(bits(&a), bits(&b));
    }

    #[test]
    fn a_row_gives_the_same_bits_alone_or_in_a_batch() {
        for act in [Act::F32, Act::Q8] {
            for q in ALL.into_iter().filter(|q| !matches!(q, QType::F32 | QType::BF16)) {
                let (n, k, m) = (20, if q.kquant() { 256 } else { 64 }, 37);
                let (x, w) = (data(n * k, 3), weight(q, m, k, 4));
                let packed = pack(&w, q, m, k).unwrap();
                let mut all = vec![0.0f32; n * m];
                qlinear(&x, &packed, q, &mut all, n, k, m, 1, best_path(), act).unwrap();
                for r in 0..n {
                    for (threads, path) in runs() {
                        let mut one = vec![0.0f32; m];
                        qlinear(
                            &x[r * k..(r + 1) * k],
                            &packed,
                            q,
                            &mut one,
                            1,
                            k,
                            m,
                            threads,
                            path,
                            act,
                        )
                        .unwrap();
                        assert_eq!(
                            bits(&one),
                            bits(&all[r * m..(r + 1) * m]),
                            "{q:?} row {r} {path:?} {act:?}"
                        );
                    }
                }
            }
        }
    }

    /// `qlinear_panels` writes the listed panels' outputs with `qlinear`'s
    /// bits (single panels, runs across stripes, the padded last panel,
    /// shares split between threads) and nothing else.
    #[test]
    fn listed_panels_get_the_whole_products_bits_and_nothing_else_is_written() {
        let m = 16 * 23 + 5; // 24 panels, the last holding 5 rows
        let lists: [&[usize]; 5] = [
            &[0],
            &[23],
            &[2, 3, 4, 5, 6, 9, 17, 18, 23],
            &(0..24).collect::<Vec<_>>(),
            &[1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21],
        ];
        for act in [Act::F32, Act::Q8] {
            for q in [QType::Q4_1, QType::Q8_0, QType::Q4_K, QType::F16] {
                for n in [1, 3, 5, 17] {
                    let k = if q.kquant() { 256 } else { 64 };
                    let (x, w) = (data(n * k, 5), weight(q, m, k, 6));
                    let packed = pack(&w, q, m, k).unwrap();
                    let mut all = vec![0.0f32; n * m];
                    qlinear(&x, &packed, q, &mut all, n, k, m, 1, best_path(), act).unwrap();
                    for list in lists {
                        for (threads, path) in runs() {
                            let mut got = vec![f32::NAN; n * m];
                            qlinear_panels(&x, &packed, q, &mut got, n, k, m, list, threads, path, act).unwrap();
                            for r in 0..n {
                                for o in 0..m {
                                    let (g, a) = (got[r * m + o], all[r * m + o]);
                                    if list.contains(&(o / PANEL)) {
                                        assert_eq!(g.to_bits(), a.to_bits(), "{q:?} n {n} {list:?} {path:?} {act:?}");
                                    } else {
                                        assert!(g.is_nan(), "{q:?} output {o} of an unlisted panel written");
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn panel_lists_out_of_order_or_range_are_errors() {
        let (n, k, m) = (1, 64, 40); // 3 panels
        let (x, w) = (data(n * k, 1), weight(QType::Q4_1, m, k, 2));
        let packed = pack(&w, QType::Q4_1, m, k).unwrap();
        let mut out = vec![0.0f32; n * m];
        for list in [&[3usize][..], &[1, 1], &[2, 0]] {
            let e = qlinear_panels(
                &x,
                &packed,
                QType::Q4_1,
                &mut out,
                n,
                k,
                m,
                list,
                1,
                best_path(),
                Act::F32,
            );
            assert!(
                matches!(e, Err(SpecError::Invalid(ref s)) if s.contains("strictly increasing")),
                "{list:?}: {e:?}"
            );
        }
        qlinear_panels(
            &x,
            &packed,
            QType::Q4_1,
            &mut out,
            n,
            k,
            m,
            &[],
            2,
            best_path(),
            Act::F32,
        )
        .unwrap();
    }

    #[test]
    fn x_rows_pass_in_the_fewest_balanced_passes() {
        assert_eq!(x_passes(0, 16).count, 0);
        for most in [1, 4, 8, 16] {
            for n in 1..=70 {
                let passes = x_passes(n, most);
                let rows: Vec<usize> = (0..passes.count).map(|i| passes.rows(i)).collect();
                assert_eq!(rows.iter().sum::<usize>(), n, "{n} rows, {most} a pass");
                assert_eq!(passes.count, n.div_ceil(most));
                assert!(rows.windows(2).all(|w| w[0] >= w[1] && w[0] - w[1] <= 1), "{rows:?}");
                assert!(rows[0] <= most && *rows.last().unwrap() >= 1, "{rows:?}");
            }
        }
        let passes = x_passes(17, 16);
        assert_eq!((passes.rows(0), passes.rows(1)), (9, 8));
    }

    /// The module docs' claim: fma(d, q, m) is d·q then + m, bit for bit,
    /// for every float16 d (infinities and NaNs included), every code q of
    /// Q4_1 and Q5_1 and minima m of every magnitude and sign.
    #[test]
    fn a_fused_code_product_and_sum_rounds_as_the_separate_ones() {
        let ms = [
            0.0f32,
            -0.0,
            1.0,
            -3.75,
            1e-8,
            -2.5e-5,
            0.1,
            7.0e3,
            -6.5e4,
            f32::INFINITY,
        ];
        for bits in 0..=u16::MAX {
            let d = half(&bits.to_le_bytes(), 0);
            for q in 0..32 {
                let q = q as f32;
                for &m in &ms {
                    let (fused, separate) = (d.mul_add(q, m), d * q + m);
                    assert!(
                        fused.to_bits() == separate.to_bits() || (fused.is_nan() && separate.is_nan()),
                        "d {d} q {q} m {m}: {fused} vs {separate}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_q8_mode_is_close_to_the_f32_one() {
        // activations quantized to 8 bits: within a few parts in a thousand of the f32 product
        let (n, k, m) = (4, 576, 40);
        let (x, w) = (data(n * k, 7), weight(QType::Q4_1, m, k, 8));
        let packed = pack(&w, QType::Q4_1, m, k).unwrap();
        let (mut a, mut b) = (vec![0.0f32; n * m], vec![0.0f32; n * m]);
        qlinear(&x, &packed, QType::Q4_1, &mut a, n, k, m, 1, best_path(), Act::F32).unwrap();
        qlinear(&x, &packed, QType::Q4_1, &mut b, n, k, m, 1, best_path(), Act::Q8).unwrap();
        let scale = a.iter().map(|v| v.abs()).fold(0.0f32, f32::max);
        assert!(a.iter().zip(&b).all(|(u, v)| (u - v).abs() <= 0.02 * scale), "{scale}");
    }

    #[test]
    fn bad_shapes_are_errors() {
        let mut out = vec![0.0f32; 2];
        let p = best_path();
        let packed = vec![0u8; QType::Q4_1.packed_len(1, 32).unwrap()];
        for act in [Act::F32, Act::Q8] {
            assert!(qlinear(&[0.0; 64], &packed, QType::Q4_1, &mut out, 2, 32, 1, 1, p, act).is_ok());
            assert!(qlinear(&[0.0; 60], &packed, QType::Q4_1, &mut out, 2, 30, 1, 1, p, act).is_err());
            assert!(qlinear(&[0.0; 64], &packed[1..], QType::Q4_1, &mut out, 2, 32, 1, 1, p, act).is_err());
            assert!(qlinear(&[0.0; 64], &packed, QType::Q4_1, &mut out, 2, 32, 1, 0, p, act).is_err());
        }
        assert!(pack(&[0; 19], QType::Q4_1, 1, 32).is_err());
        let mut one = vec![0.0f32; 32];
        assert!(dequantize_rows(&packed, QType::Q4_1, 32, 1, &[1], &mut one, 1).is_err());
        assert!(dequantize_rows(&packed, QType::Q4_1, 32, 1, &[-1], &mut one, 1).is_err());
        assert!(dequantize_rows(&packed, QType::Q4_1, 32, 1, &[0], &mut one, 0).is_err());
        assert!(dequantize_rows(&packed[1..], QType::Q4_1, 32, 1, &[0], &mut one, 1).is_err());
    }
}
