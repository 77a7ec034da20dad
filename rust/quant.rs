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
//!
//! Each weight dequantizes to exactly the float32 value gguf-py's
//! `dequantize` gives: the same float32 operations in the same order (a
//! product, then for Q4_1 a separate sum; never a fused multiply-add).
//!
//! **Panels.** `pack` rearranges a block format's bytes (nothing is
//! converted) so that the kernel reads memory in one sequential stream:
//! rows in panels of 8 (the last padded with zero rows), and within a panel
//! block by block: the 8 rows' d (then m), then their quant bytes in 16-byte
//! runs, each the same 8 bytes of two neighbouring rows (the run one AVX-512
//! register takes). A row of a small matrix is a few hundred bytes, too
//! short for the hardware prefetcher to follow 8 of them at once; a panel
//! is one stream. The float formats stay row-major.
//!
//! The weights are dequantized in registers, block by block, and the
//! activations stay float32; nothing is quantized on the way. Every output
//! entry is summed in the order of `linear.rs`: 8 lanes of fused
//! multiply-adds over k in steps of 8, the lanes added pairwise, then the
//! last `k mod 8` terms (float formats only; the block formats have k a
//! multiple of 32). So `qlinear(x, pack(W))` is bitwise `linear(x,
//! dequant(W))`, and a row's result is the same alone or among any number
//! of rows, on any thread count and on every instruction path.
//!
//! Over 400 lines: six weight formats on three paths (AVX-512, AVX2, portable) with one
//! summation order, which must agree bit for bit; kept in one file to be read together.

use crate::error::SpecError;
use crate::linear::Tile;
use crate::pool::SharedOut;

/// Lanes per accumulator (one 256-bit vector of f32), as in `linear.rs`.
const LANES: usize = 8;
/// Rows of a panel; also accumulators of a tile (weight rows × x rows, in 8-lane units).
const TILE: usize = 8;
/// Elements of a quantized block.
const QK: usize = 32;
/// The most x rows one tile multiplies (one pass over the weight for up to
/// 16 positions: a verification forward reads each weight once).
const XMAX: usize = 16;

/// Panel blocks ahead that a panel's first tile prefetches (`prefetch_ahead`).
const PREFETCH: usize = 8;

/// A tile's accumulators, `[weight row][x row][lane]`, and its sums.
type Lanes = [[[f32; LANES]; XMAX]; TILE];
type Sums = [[f32; XMAX]; TILE];

/// A weight format of a GGUF file that the kernels read natively.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QType {
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_0,
    Q4_1,
}

impl QType {
    /// The format of ggml type id `id` (as gguf-py's `GGMLQuantizationType`).
    pub fn from_ggml(id: u32) -> Option<QType> {
        Some(match id {
            0 => QType::F32,
            1 => QType::F16,
            2 => QType::Q4_0,
            3 => QType::Q4_1,
            8 => QType::Q8_0,
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
        }
    }

    /// (elements, bytes) of one block.
    pub fn block(self) -> (usize, usize) {
        match self {
            QType::F32 => (1, 4),
            QType::F16 | QType::BF16 => (1, 2),
            QType::Q8_0 => (QK, 34),
            QType::Q4_0 => (QK, 18),
            QType::Q4_1 => (QK, 20),
        }
    }

    /// Whether the format is a block format (packed into panels).
    pub fn blocked(self) -> bool {
        self.block().0 == QK
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

    /// Bytes of a packed weight of m rows of k values.
    pub fn packed_len(self, m: usize, k: usize) -> crate::Result<usize> {
        let rb = self.row_bytes(k)?;
        Ok(if self.blocked() {
            m.div_ceil(TILE) * TILE * rb
        } else {
            m * rb
        })
    }
}

/// Where a block format's pieces sit in the packed layout (see the module docs).
#[derive(Clone, Copy)]
struct Panels {
    /// Blocks per row.
    nb: usize,
    /// Bytes of one block of a panel (8 rows).
    unit: usize,
    /// Offset of the quant bytes within a panel block (after d, and m).
    qs: usize,
    /// 16-byte runs per row pair and block: 4 (Q8_0), 2 (Q4).
    runs: usize,
}

impl Panels {
    fn of(q: QType, k: usize) -> Panels {
        let bytes = q.block().1;
        let (qs, runs) = match q {
            QType::Q8_0 => (16, 4),
            QType::Q4_1 => (32, 2),
            _ => (16, 2),
        };
        Panels {
            nb: k / QK,
            unit: TILE * bytes,
            qs,
            runs,
        }
    }

    /// Start of block `b` of the panel holding rows 8·panel ..
    #[inline(always)]
    fn base(self, panel: usize, b: usize) -> usize {
        (panel * self.nb + b) * self.unit
    }

    /// Start of run `r` of row pair `p` (rows 2p, 2p + 1 of the panel).
    #[inline(always)]
    fn run(self, p: usize, r: usize) -> usize {
        self.qs + (p * self.runs + r) * 16
    }

    /// Byte `j` of the quant bytes of panel row `row` in a panel block
    /// starting at `base` (the row-major block's byte offset j after its scales).
    #[inline(always)]
    fn q_byte(self, base: usize, row: usize, j: usize) -> usize {
        base + self.run(row / 2, j / 8) + 8 * (row % 2) + j % 8
    }
}

/// A row-major weight (m rows of `row_bytes(k)`) in the packed layout.
pub fn pack(w: &[u8], q: QType, m: usize, k: usize) -> crate::Result<Vec<u8>> {
    let rb = q.row_bytes(k)?;
    check_len("pack", w.len(), m * rb, "w", "m · row bytes")?;
    if !q.blocked() {
        return Ok(w.to_vec());
    }
    let lay = Panels::of(q, k);
    let bytes = q.block().1;
    let scales = if q == QType::Q4_1 { 2 } else { 1 };
    let mut out = vec![0u8; q.packed_len(m, k)?];
    for r in 0..m {
        let (panel, row) = (r / TILE, r % TILE);
        for b in 0..lay.nb {
            let src = &w[r * rb + b * bytes..r * rb + (b + 1) * bytes];
            let base = lay.base(panel, b);
            for s in 0..scales {
                out[base + 16 * s + 2 * row..base + 16 * s + 2 * row + 2].copy_from_slice(&src[2 * s..2 * s + 2]);
            }
            for (j, &byte) in src[2 * scales..].iter().enumerate() {
                out[lay.q_byte(base, row, j)] = byte;
            }
        }
    }
    Ok(out)
}

/// Block `b` of row `r` of a packed weight, back in the file's row-major
/// block layout (`out` has the block's bytes).
fn row_block(p: &[u8], q: QType, lay: Panels, r: usize, b: usize, out: &mut [u8]) {
    let (panel, row) = (r / TILE, r % TILE);
    let base = lay.base(panel, b);
    let scales = if q == QType::Q4_1 { 2 } else { 1 };
    for s in 0..scales {
        out[2 * s..2 * s + 2].copy_from_slice(&p[base + 16 * s + 2 * row..base + 16 * s + 2 * row + 2]);
    }
    let quant = q.block().1 - 2 * scales;
    for j in 0..quant {
        out[2 * scales + j] = p[lay.q_byte(base, row, j)];
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
    let mut out = vec![0u8; rows.len() * rb];
    if !q.blocked() {
        for (i, &r) in rows.iter().enumerate() {
            out[i * rb..(i + 1) * rb].copy_from_slice(&p[r as usize * rb..(r as usize + 1) * rb]);
        }
        return Ok(out);
    }
    let (lay, bytes) = (Panels::of(q, k), q.block().1);
    for (i, &r) in rows.iter().enumerate() {
        for b in 0..lay.nb {
            let at = i * rb + b * bytes;
            row_block(p, q, lay, r as usize, b, &mut out[at..at + bytes]);
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

#[inline(always)]
fn half(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// One row-major block (`bytes` starting at the block) dequantized into
/// `out` (its elements), as gguf-py computes it.
#[inline(always)]
fn dequant_block(q: QType, bytes: &[u8], out: &mut [f32]) {
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
        QType::Q4_1 => {
            let (d, m) = (half(bytes, 0), half(bytes, 2));
            for j in 0..QK / 2 {
                let b = bytes[4 + j];
                out[j] = d * (b & 0x0f) as f32 + m;
                out[j + QK / 2] = d * (b >> 4) as f32 + m;
            }
        }
    }
}

/// Rows `rows` of a packed weight (m rows of `k` values in format `q`) as
/// float32 into `out` (rows.len(), k), read straight from the panels, on
/// `threads` threads (each a range of the rows). Ids out of range are an
/// error. The whole weight (rows 0..m) is what a prefill's dense products
/// multiply (`QuantLinear.dense`).
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
    let rb = q.row_bytes(k)?;
    let lay = Panels::of(q, k.max(QK));
    let ptr = SharedOut(out.as_mut_ptr());
    let parts = threads.min(rows.len() / 64).max(1); // a thread pays past some rows
    let job = |part: usize| {
        let (lo, hi) = (part * rows.len() / parts, (part + 1) * rows.len() / parts);
        for (i, &r) in rows.iter().enumerate().take(hi).skip(lo) {
            // SAFETY: each part writes only its rows lo..hi of `out` (len(rows) · k, checked).
            let o = unsafe { std::slice::from_raw_parts_mut(ptr.at(i * k), k) };
            dequant_row(p, q, lay, rb, r as usize, o);
        }
    };
    if parts == 1 {
        job(0);
    } else {
        crate::pool::global(threads - 1).run(parts, &job);
    }
    Ok(())
}

/// Row `r` of a packed weight as float32 into `out` (k), block by block as
/// `dequant_block` computes it (the same operations: gguf-py's values).
fn dequant_row(p: &[u8], q: QType, lay: Panels, rb: usize, r: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if path_available(Path::Avx2) {
        // SAFETY: the CPU has AVX2 (checked); the body is the portable one,
        // compiled with the wider vectors.
        return unsafe { dequant_row_avx2(p, q, lay, rb, r, out) };
    }
    dequant_row_body(p, q, lay, rb, r, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn dequant_row_avx2(p: &[u8], q: QType, lay: Panels, rb: usize, r: usize, out: &mut [f32]) {
    dequant_row_body(p, q, lay, rb, r, out)
}

#[inline(always)]
fn dequant_row_body(p: &[u8], q: QType, lay: Panels, rb: usize, r: usize, out: &mut [f32]) {
    if !q.blocked() {
        let (row, size) = (&p[r * rb..(r + 1) * rb], q.block().1);
        for (j, o) in out.iter_mut().enumerate() {
            dequant_block(q, &row[j * size..], std::slice::from_mut(o));
        }
        return;
    }
    let (panel, row) = (r / TILE, r % TILE);
    let (pair, half8) = (row / 2, 8 * (row % 2));
    for (b, o) in out.chunks_exact_mut(QK).enumerate() {
        let o: &mut [f32; QK] = o.try_into().expect("k is whole blocks");
        let base = lay.base(panel, b);
        let d = half(p, base + 2 * row);
        let run = |c: usize| -> &[u8; 8] {
            let at = base + lay.run(pair, c) + half8;
            p[at..at + 8].try_into().expect("a run holds 8 bytes of a row")
        };
        match q {
            QType::Q8_0 => {
                for c in 0..4 {
                    let src = run(c);
                    for j in 0..8 {
                        o[8 * c + j] = (src[j] as i8) as f32 * d;
                    }
                }
            }
            QType::Q4_0 => {
                for h in 0..2 {
                    let src = run(h);
                    for j in 0..8 {
                        o[8 * h + j] = d * ((src[j] & 0x0f) as i32 - 8) as f32;
                        o[16 + 8 * h + j] = d * ((src[j] >> 4) as i32 - 8) as f32;
                    }
                }
            }
            _ => {
                let m = half(p, base + 16 + 2 * row);
                for h in 0..2 {
                    let src = run(h);
                    for j in 0..8 {
                        o[8 * h + j] = d * (src[j] & 0x0f) as f32 + m;
                        o[16 + 8 * h + j] = d * (src[j] >> 4) as f32 + m;
                    }
                }
            }
        }
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

/// The instruction paths, chosen at run time. All three sum every output
/// in the same order, so they give the same bits; only the speed differs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    Portable,
    /// AVX2 + FMA + F16C: one weight row per 8-lane vector.
    Avx2,
    /// AVX-512 (F, BW, VL, DQ) on top: two weight rows per 16-lane vector,
    /// each half an 8-lane accumulator of its own row (so the order stays
    /// that of 8 lanes), and Q4 values looked up in a 16-entry table per
    /// block.
    Avx512,
}

impl Path {
    pub fn name(self) -> &'static str {
        match self {
            Path::Portable => "portable",
            Path::Avx2 => "avx2",
            Path::Avx512 => "avx512",
        }
    }

    pub fn from_name(name: &str) -> Option<Path> {
        [Path::Portable, Path::Avx2, Path::Avx512]
            .into_iter()
            .find(|p| p.name() == name)
    }
}

/// The widest path this CPU runs (checked once by std, then cached).
pub fn best_path() -> Path {
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c");
        let avx512 = std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("avx512dq");
        if avx2 && avx512 {
            return Path::Avx512;
        }
        if avx2 {
            return Path::Avx2;
        }
    }
    Path::Portable
}

/// Whether `path` runs on this CPU.
pub fn path_available(path: Path) -> bool {
    match (path, best_path()) {
        (Path::Portable, _) | (_, Path::Avx512) => true,
        (Path::Avx2, b) => b == Path::Avx2,
        (Path::Avx512, _) => false,
    }
}

/// `out[r, o] = Σ_j x[r, j] · dequant(w)[o, j]` for row-major `x` (n, k), a
/// packed weight `p` (`pack`: m rows of k values in format `q`) and `out`
/// (n, m), on `threads` threads (1: the calling thread; the others from
/// `pool::global`) each taking a range of panels, on the instruction `path`
/// (a path this CPU lacks is an error).
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
) -> crate::Result<()> {
    if !path_available(path) {
        return Err(SpecError::Invalid(format!(
            "qlinear: this CPU cannot run the {} path (its best is {})",
            path.name(),
            best_path().name()
        )));
    }
    let rb = q.row_bytes(k)?;
    check_len("qlinear", x.len(), n * k, "x", "n · k")?;
    check_len(
        "qlinear",
        p.len(),
        q.packed_len(m, k)?,
        "w",
        "the packed length (see pack)",
    )?;
    check_len("qlinear", out.len(), n * m, "out", "n · m")?;
    check_threads("qlinear", threads)?;
    let ptr = SharedOut(out.as_mut_ptr());
    let panels = m.div_ceil(TILE);
    let parts = threads.min(panels).max(1);
    let job = |part: usize| {
        let (lo, hi) = (
            part * panels / parts * TILE,
            ((part + 1) * panels / parts * TILE).min(m),
        );
        if lo < hi {
            // SAFETY: each part writes only the columns lo..hi of `out`, which
            // holds n · m entries (checked above); the parts are disjoint.
            unsafe { rows_range(x, p, q, ptr, n, k, m, lo, hi, rb, path) };
        }
    };
    if parts == 1 {
        job(0);
    } else {
        crate::pool::global(threads - 1).run(parts, &job);
    }
    Ok(())
}

/// Weight rows lo..hi (lo a multiple of TILE) against every x row, into `out` (n, m).
#[allow(clippy::too_many_arguments)]
unsafe fn rows_range(
    x: &[f32],
    p: &[u8],
    q: QType,
    out: SharedOut,
    n: usize,
    k: usize,
    m: usize,
    lo: usize,
    hi: usize,
    rb: usize,
    path: Path,
) {
    let paired = path == Path::Avx512 && q.blocked();
    let mut sums = [[0.0f32; XMAX]; TILE];
    let mut r0 = 0;
    while r0 < n {
        // x rows per tile: AVX-512 up to 16 (every row in one pass), else 8, 4, 2 or 1
        let left = n - r0;
        let xr = if paired {
            left.min(XMAX)
        } else if left >= 8 {
            8
        } else if left >= 4 {
            4
        } else if left >= 2 {
            2
        } else {
            1
        };
        // weight rows per tile: 8 accumulators of 8 lanes (AVX2), or up to
        // 16 of 16 lanes holding two rows each (AVX-512: the registers that
        // `avx512_width` leaves); a tile stays in one panel
        let ow = if paired { avx512_width(xr) } else { TILE / xr };
        let mut o = lo;
        while o < hi {
            // block formats: the padded panel rows are computed and dropped
            let rows = if q.blocked() { ow } else { ow.min(hi - o) };
            let t = Tile { k, r0, xr, o, ow: rows };
            tile(x, p, q, t, rb, path, &mut sums);
            for (i, row) in sums.iter().enumerate().take(rows.min(hi - o)) {
                for (r, &v) in row.iter().enumerate().take(xr) {
                    *out.at((r0 + r) * m + o + i) = v;
                }
            }
            o += rows;
        }
        r0 += xr;
    }
}

/// The tile's dot products, into `sums[weight row][x row]`.
fn tile(x: &[f32], p: &[u8], q: QType, t: Tile, rb: usize, path: Path, sums: &mut Sums) {
    let mut lanes = [[[0.0f32; LANES]; XMAX]; TILE];
    match path {
        // SAFETY (both): the path's instructions are present (`qlinear`
        // checked `path_available`); the tile lies inside x and p by construction.
        #[cfg(target_arch = "x86_64")]
        Path::Avx512 if q.blocked() => unsafe { lanes_avx512(x, p, q, t, &mut lanes) },
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 | Path::Avx512 => unsafe { lanes_avx2(x, p, q, t, rb, &mut lanes) },
        _ => lanes_portable(x, p, q, t, rb, &mut lanes),
    }
    let full = t.k - t.k % LANES;
    let mut tail = [0.0f32; LANES];
    for i in 0..t.ow {
        if full < t.k {
            // float formats only: the last k mod 8 values, one by one
            let row = &p[(t.o + i) * rb..(t.o + i + 1) * rb];
            let size = q.block().1;
            for j in full..t.k {
                dequant_block(q, &row[j * size..], &mut tail[j - full..]);
            }
        }
        for r in 0..t.xr {
            let xrow = &x[(t.r0 + r) * t.k..(t.r0 + r + 1) * t.k];
            let l = &lanes[i][r];
            let mut s = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
            for j in full..t.k {
                s = tail[j - full].mul_add(xrow[j], s);
            }
            sums[i][r] = s;
        }
    }
}

/// The lanes of a tile's accumulators, in portable code: each weight row's
/// next 32 (or 8) values dequantized into a buffer, then multiplied in.
fn lanes_portable(x: &[f32], p: &[u8], q: QType, t: Tile, rb: usize, lanes: &mut Lanes) {
    let (elems, bytes) = q.block();
    let full = t.k - t.k % LANES;
    let lay = Panels::of(q, t.k.max(QK));
    let mut buf = [[0.0f32; QK]; TILE];
    let mut raw = [0u8; 34];
    let step = elems.max(LANES);
    let mut j = 0;
    while j < full {
        let span = step.min(full - j);
        for i in 0..t.ow {
            if q.blocked() {
                row_block(p, q, lay, t.o + i, j / QK, &mut raw[..bytes]);
                dequant_block(q, &raw, &mut buf[i]);
            } else {
                let row = &p[(t.o + i) * rb..];
                for e in 0..span {
                    dequant_block(q, &row[(j + e) * bytes..], &mut buf[i][e..]);
                }
            }
        }
        for c in (0..span).step_by(LANES) {
            for r in 0..t.xr {
                let xv = &x[(t.r0 + r) * t.k + j + c..(t.r0 + r) * t.k + j + c + LANES];
                for i in 0..t.ow {
                    for l in 0..LANES {
                        lanes[i][r][l] = buf[i][c + l].mul_add(xv[l], lanes[i][r][l]);
                    }
                }
            }
        }
        j += span;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lanes_avx2(x: &[f32], p: &[u8], q: QType, t: Tile, rb: usize, lanes: &mut Lanes) {
    match (t.ow, t.xr) {
        (8, 1) => avx2_tile::<8, 1>(x, p, q, t, rb, lanes),
        (4, 2) => avx2_tile::<4, 2>(x, p, q, t, rb, lanes),
        (2, 4) => avx2_tile::<2, 4>(x, p, q, t, rb, lanes),
        (1, 8) => avx2_tile::<1, 8>(x, p, q, t, rb, lanes),
        (_, xr) => {
            // other shapes (the last rows of a float weight; tests), one row at a time
            for (i, slot) in lanes.iter_mut().enumerate().take(t.ow) {
                let one = Tile { o: t.o + i, ow: 1, ..t };
                let mut part = [[[0.0f32; LANES]; XMAX]; TILE];
                match xr {
                    1 => avx2_tile::<1, 1>(x, p, q, one, rb, &mut part),
                    2 => avx2_tile::<1, 2>(x, p, q, one, rb, &mut part),
                    4 => avx2_tile::<1, 4>(x, p, q, one, rb, &mut part),
                    _ => avx2_tile::<1, 8>(x, p, q, one, rb, &mut part),
                }
                *slot = part[0];
            }
        }
    }
}

/// `OW` weight rows times `XR` x rows with the accumulators in registers:
/// per 8 values, each weight row's vector is dequantized (the gguf-py
/// operations, lane-wise), then multiplied into every x row.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)]
unsafe fn avx2_tile<const OW: usize, const XR: usize>(
    x: &[f32],
    p: &[u8],
    q: QType,
    t: Tile,
    rb: usize,
    lanes: &mut Lanes,
) {
    use std::arch::x86_64 as v;
    let (k, full) = (t.k, t.k - t.k % LANES);
    let mut acc = [[v::_mm256_setzero_ps(); XR]; OW];
    let xp = x.as_ptr().add(t.r0 * k);
    if !q.blocked() {
        let size = q.block().1;
        let wp = p.as_ptr().add(t.o * rb);
        let mut j = 0;
        while j < full {
            let mut wv = [v::_mm256_setzero_ps(); OW];
            for i in 0..OW {
                let at = wp.add(i * rb + j * size);
                wv[i] = match q {
                    QType::F32 => v::_mm256_loadu_ps(at as *const f32),
                    QType::F16 => v::_mm256_cvtph_ps(v::_mm_loadu_si128(at as *const v::__m128i)),
                    _ => {
                        let h = v::_mm256_cvtepu16_epi32(v::_mm_loadu_si128(at as *const v::__m128i));
                        v::_mm256_castsi256_ps(v::_mm256_slli_epi32::<16>(h))
                    }
                };
            }
            for r in 0..XR {
                let xv = v::_mm256_loadu_ps(xp.add(r * k + j));
                for i in 0..OW {
                    acc[i][r] = v::_mm256_fmadd_ps(wv[i], xv, acc[i][r]);
                }
            }
            j += LANES;
        }
    } else {
        let lay = Panels::of(q, k);
        let (panel, first) = (t.o / TILE, t.o % TILE);
        let low = v::_mm256_set1_epi32(0x0f);
        let eight = v::_mm256_set1_epi32(8);
        for b in 0..lay.nb {
            let base = p.as_ptr().add(lay.base(panel, b));
            if first == 0 {
                prefetch_ahead(base, lay);
            }
            let (d, m) = panel_scales(base, q);
            for c in 0..4 {
                let mut xv = [v::_mm256_setzero_ps(); XR];
                for r in 0..XR {
                    xv[r] = v::_mm256_loadu_ps(xp.add(r * k + b * QK + 8 * c));
                }
                for i in 0..OW {
                    let row = first + i;
                    let (pair, half) = (row / 2, 8 * (row % 2));
                    let dv = v::_mm256_broadcast_ss(&d[row]);
                    let wv = if q == QType::Q8_0 {
                        let raw = v::_mm_loadl_epi64(base.add(lay.run(pair, c) + half) as *const v::__m128i);
                        v::_mm256_mul_ps(v::_mm256_cvtepi32_ps(v::_mm256_cvtepi8_epi32(raw)), dv)
                    } else {
                        // bytes 0-7 (c = 0, 2) or 8-15 (c = 1, 3): low nibbles, then high ones
                        let raw = v::_mm_loadl_epi64(base.add(lay.run(pair, c % 2) + half) as *const v::__m128i);
                        let wide = v::_mm256_cvtepu8_epi32(raw);
                        let nib = if c < 2 {
                            v::_mm256_and_si256(wide, low)
                        } else {
                            v::_mm256_srli_epi32::<4>(wide)
                        };
                        if q == QType::Q4_1 {
                            let prod = v::_mm256_mul_ps(dv, v::_mm256_cvtepi32_ps(nib));
                            v::_mm256_add_ps(prod, v::_mm256_broadcast_ss(&m[row]))
                        } else {
                            v::_mm256_mul_ps(dv, v::_mm256_cvtepi32_ps(v::_mm256_sub_epi32(nib, eight)))
                        }
                    };
                    for r in 0..XR {
                        acc[i][r] = v::_mm256_fmadd_ps(wv, xv[r], acc[i][r]);
                    }
                }
            }
        }
    }
    for i in 0..OW {
        for r in 0..XR {
            v::_mm256_storeu_ps(lanes[i][r].as_mut_ptr(), acc[i][r]);
        }
    }
}

/// Weight rows of an AVX-512 tile of `xr` x rows: 4 pairs (xr ≤ 3), 2
/// pairs (xr ≤ 11) or 1 (up to 16), so accumulators, weight vectors and
/// the x vector fit in the 32 registers.
fn avx512_width(xr: usize) -> usize {
    if xr <= 3 {
        8
    } else if xr <= 11 {
        4
    } else {
        2
    }
}

/// Asks for the panel block `PREFETCH` blocks after the one at `base` (the
/// next panel's first blocks near a panel's end): one tile per panel asks,
/// the first, so the stream is in cache when the tiles reach it (the
/// hardware prefetcher stops at 4 KiB pages). Measured on the 2-core Intel
/// host, SmolLM2's 30 gate/up weights and its LM head on 2 threads: one row
/// 7.6 → 5.3 ms on AVX-512 and 10.9 → 9.7 ms on AVX2; five rows 12.6 → 10.2
/// and 28.6 → 25.0 ms (medians of 3 interleaved runs, distance 8 against 0).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn prefetch_ahead(base: *const u8, lay: Panels) {
    use std::arch::x86_64 as v;
    // wrapping: past the weight's end the address is only a hint, never read
    let ahead = base.wrapping_add(PREFETCH * lay.unit);
    for line in (0..lay.unit).step_by(64) {
        v::_mm_prefetch::<{ v::_MM_HINT_T0 }>(ahead.wrapping_add(line) as *const i8);
    }
}

/// The 8 rows' d (and, for Q4_1, m) of a panel block starting at `base`,
/// converted from float16 together (F16C).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn panel_scales(base: *const u8, q: QType) -> ([f32; 8], [f32; 8]) {
    use std::arch::x86_64 as v;
    let (mut d, mut m) = ([0.0f32; 8], [0.0f32; 8]);
    v::_mm256_storeu_ps(
        d.as_mut_ptr(),
        v::_mm256_cvtph_ps(v::_mm_loadu_si128(base as *const v::__m128i)),
    );
    if q == QType::Q4_1 {
        let at = base.add(16) as *const v::__m128i;
        v::_mm256_storeu_ps(m.as_mut_ptr(), v::_mm256_cvtph_ps(v::_mm_loadu_si128(at)));
    }
    (d, m)
}

/// AVX-512 tiles of the block formats: row pairs of one panel.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
unsafe fn lanes_avx512(x: &[f32], p: &[u8], q: QType, t: Tile, lanes: &mut Lanes) {
    macro_rules! run {
        ($pairs:literal, $tile:expr, $out:expr, [$($n:literal)*]) => {
            match $tile.xr {
                $($n => avx512_tile::<$pairs, $n>(x, p, q, $tile, $out),)*
                _ => unreachable!("x rows per tile are 1..=16"),
            }
        };
    }
    match (t.ow, t.xr) {
        (8, 1..=3) => run!(4, t, lanes, [1 2 3]),
        (4, 4..=11) => run!(2, t, lanes, [4 5 6 7 8 9 10 11]),
        (2, _) => run!(1, t, lanes, [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16]),
        (ow, _) => {
            // other shapes (tests), a pair at a time
            debug_assert!(ow.is_multiple_of(2) && t.o.is_multiple_of(2));
            for pr in 0..ow / 2 {
                let two = Tile {
                    o: t.o + 2 * pr,
                    ow: 2,
                    ..t
                };
                let mut part = [[[0.0f32; LANES]; XMAX]; TILE];
                run!(1, two, &mut part, [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16]);
                lanes[2 * pr] = part[0];
                lanes[2 * pr + 1] = part[1];
            }
        }
    }
}

/// `P` row pairs of one panel times `XR` x rows. Accumulator p holds row
/// o + 2p in lanes 0-7 and row o + 2p + 1 in lanes 8-15; the x vector is
/// the same 8 values in both halves. Per block, a Q4 row's 16 possible
/// values (d·q + m, or d·(q − 8)) are computed once, as gguf-py computes
/// them, and each nibble picks its value (vpermt2ps over both rows' tables).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)]
unsafe fn avx512_tile<const P: usize, const XR: usize>(x: &[f32], p: &[u8], q: QType, t: Tile, lanes: &mut Lanes) {
    use std::arch::x86_64 as v;
    let k = t.k;
    let lay = Panels::of(q, k);
    let (panel, first_pair) = (t.o / TILE, (t.o % TILE) / 2);
    let xp = x.as_ptr().add(t.r0 * k);
    let mut acc = [[v::_mm512_setzero_ps(); XR]; P];
    let iota = v::_mm512_set_ps(15., 14., 13., 12., 11., 10., 9., 8., 7., 6., 5., 4., 3., 2., 1., 0.);
    let centered = v::_mm512_sub_ps(iota, v::_mm512_set1_ps(8.0));
    let low = v::_mm512_set1_epi32(0x0f);
    let upper = v::_mm512_set_epi32(16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0);
    for b in 0..lay.nb {
        let base = p.as_ptr().add(lay.base(panel, b));
        if first_pair == 0 {
            prefetch_ahead(base, lay);
        }
        let (d, m) = panel_scales(base, q);
        // wv[p][c]: elements 8c..8c + 8 of rows a = 2·pair and a + 1
        let mut wv = [[v::_mm512_setzero_ps(); 4]; P];
        for pi in 0..P {
            let pair = first_pair + pi;
            let (a, bb) = (2 * pair, 2 * pair + 1);
            if q == QType::Q8_0 {
                let dd = v::_mm512_mask_blend_ps(0xff00, v::_mm512_set1_ps(d[a]), v::_mm512_set1_ps(d[bb]));
                for c in 0..4 {
                    let raw = v::_mm_loadu_si128(base.add(lay.run(pair, c)) as *const v::__m128i);
                    let qv = v::_mm512_cvtepi32_ps(v::_mm512_cvtepi8_epi32(raw));
                    wv[pi][c] = v::_mm512_mul_ps(qv, dd);
                }
                continue;
            }
            let (ta, tb) = if q == QType::Q4_1 {
                (
                    v::_mm512_add_ps(v::_mm512_mul_ps(v::_mm512_set1_ps(d[a]), iota), v::_mm512_set1_ps(m[a])),
                    v::_mm512_add_ps(
                        v::_mm512_mul_ps(v::_mm512_set1_ps(d[bb]), iota),
                        v::_mm512_set1_ps(m[bb]),
                    ),
                )
            } else {
                (
                    v::_mm512_mul_ps(v::_mm512_set1_ps(d[a]), centered),
                    v::_mm512_mul_ps(v::_mm512_set1_ps(d[bb]), centered),
                )
            };
            for h in 0..2 {
                let raw = v::_mm_loadu_si128(base.add(lay.run(pair, h)) as *const v::__m128i);
                let wide = v::_mm512_cvtepu8_epi32(raw);
                let lo = v::_mm512_or_si512(v::_mm512_and_si512(wide, low), upper);
                let hi = v::_mm512_or_si512(v::_mm512_srli_epi32::<4>(wide), upper);
                wv[pi][h] = v::_mm512_permutex2var_ps(ta, lo, tb);
                wv[pi][2 + h] = v::_mm512_permutex2var_ps(ta, hi, tb);
            }
        }
        for c in 0..4 {
            for r in 0..XR {
                let xv = v::_mm512_broadcast_f32x8(v::_mm256_loadu_ps(xp.add(r * k + b * QK + 8 * c)));
                for pi in 0..P {
                    acc[pi][r] = v::_mm512_fmadd_ps(wv[pi][c], xv, acc[pi][r]);
                }
            }
        }
    }
    let mut both = [0.0f32; 16];
    for pi in 0..P {
        for r in 0..XR {
            v::_mm512_storeu_ps(both.as_mut_ptr(), acc[pi][r]);
            lanes[2 * pi][r].copy_from_slice(&both[..8]);
            lanes[2 * pi + 1][r].copy_from_slice(&both[8..]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linear::linear;
    use crate::linear::tests::data;

    /// Random bytes of m rows in format q (scales as arbitrary float16
    /// bit patterns of finite, modest values, including 0 and negatives).
    fn weight(q: QType, m: usize, k: usize, seed: u32) -> Vec<u8> {
        let rb = q.row_bytes(k).unwrap();
        let mut b: Vec<u8> = (0..m * rb)
            .map(|i| ((i as u32).wrapping_mul(2_246_822_519).wrapping_add(seed * 97) >> 13) as u8)
            .collect();
        let (elems, bytes) = q.block();
        let scales = match q {
            QType::Q8_0 | QType::Q4_0 => 1,
            QType::Q4_1 => 2,
            _ => 0,
        };
        for blk in 0..m * (k / elems) {
            for s in 0..scales {
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
    fn dequant(q: QType, w: &[u8], m: usize, k: usize) -> Vec<f32> {
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

    const ALL: [QType; 6] = [
        QType::F32,
        QType::F16,
        QType::BF16,
        QType::Q8_0,
        QType::Q4_0,
        QType::Q4_1,
    ];

    /// (threads, path) pairs: every path this CPU runs, on 1, 2 and 3 threads.
    fn runs() -> Vec<(usize, Path)> {
        let paths = [Path::Portable, Path::Avx2, Path::Avx512];
        let available: Vec<Path> = paths.into_iter().filter(|p| path_available(*p)).collect();
        available.iter().flat_map(|&p| [(1, p), (2, p), (3, p)]).collect()
    }

    #[test]
    fn packing_keeps_every_byte_and_dequantizes_as_the_rows_do() {
        for q in ALL {
            let k = if q.blocked() { 96 } else { 13 };
            for m in [1, 7, 8, 9, 21] {
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
                let mut values = vec![0.0f32; m * k];
                let all: Vec<i64> = (0..m as i64).collect();
                dequantize_rows(&packed, q, k, m, &all, &mut values, 1).unwrap();
                let want = dequant(q, &w, m, k);
                assert!(
                    values.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{q:?} m={m}"
                );
            }
        }
    }

    #[test]
    fn rows_dequantize_as_gguf_py_in_any_order_on_any_thread_count() {
        for q in ALL {
            let (m, k) = (300, if q.blocked() { 96 } else { 13 });
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
                    assert!(
                        a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                        "{q:?} row {r} threads={threads}"
                    );
                }
            }
        }
    }

    #[test]
    fn equals_the_float_product_of_the_dequantized_weight_bitwise() {
        for q in ALL {
            let k_list: &[usize] = if q.blocked() { &[32, 96, 576] } else { &[1, 7, 45, 576] };
            for &k in k_list {
                for &(n, m) in &[(1, 1), (1, 19), (3, 8), (5, 33), (8, 9), (13, 70), (16, 8), (23, 17)] {
                    let (x, w) = (data(n * k, 1), weight(q, m, k, 2));
                    let packed = pack(&w, q, m, k).unwrap();
                    let wf = dequant(q, &w, m, k);
                    let mut want = vec![0.0f32; n * m];
                    linear(&x, &wf, &mut want, n, k, m).unwrap();
                    for (threads, path) in runs() {
                        let mut out = vec![f32::NAN; n * m];
                        qlinear(&x, &packed, q, &mut out, n, k, m, threads, path).unwrap();
                        assert!(
                            out.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{q:?} n={n} k={k} m={m} threads={threads} {path:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_row_gives_the_same_bits_alone_or_in_a_batch() {
        for q in [QType::Q4_1, QType::Q4_0, QType::Q8_0, QType::F16] {
            let (n, k, m) = (16, 64, 37);
            let (x, w) = (data(n * k, 3), weight(q, m, k, 4));
            let packed = pack(&w, q, m, k).unwrap();
            let mut all = vec![0.0f32; n * m];
            qlinear(&x, &packed, q, &mut all, n, k, m, 1, best_path()).unwrap();
            for r in 0..n {
                for (threads, path) in runs() {
                    let mut one = vec![0.0f32; m];
                    qlinear(&x[r * k..(r + 1) * k], &packed, q, &mut one, 1, k, m, threads, path).unwrap();
                    assert_eq!(
                        one.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        all[r * m..(r + 1) * m].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{q:?} row {r} {path:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn every_tile_shape_of_every_path_gives_the_portable_lanes_bitwise() {
        for q in ALL {
            let k = if q.blocked() { 64 } else { 45 };
            let rb = q.row_bytes(k).unwrap();
            let (x, w) = (data(XMAX * k, 5), weight(q, 8, k, 6));
            let packed = pack(&w, q, 8, k).unwrap();
            for path in [Path::Avx2, Path::Avx512].into_iter().filter(|p| path_available(*p)) {
                let paired = path == Path::Avx512 && q.blocked();
                let xrs: &[usize] = if paired {
                    &[1, 2, 3, 4, 5, 8, 11, 12, 16]
                } else {
                    &[1, 2, 4, 8]
                };
                let ows: &[usize] = if paired { &[2, 4, 8] } else { &[1, 2, 4, 8] };
                for &xr in xrs {
                    for &ow in ows {
                        let t = Tile { k, r0: 0, xr, o: 0, ow };
                        let (mut sa, mut sb) = ([[0.0f32; XMAX]; TILE], [[0.0f32; XMAX]; TILE]);
                        tile(&x, &packed, q, t, rb, Path::Portable, &mut sa);
                        tile(&x, &packed, q, t, rb, path, &mut sb);
                        for i in 0..ow {
                            for r in 0..xr {
                                assert_eq!(
                                    sa[i][r].to_bits(),
                                    sb[i][r].to_bits(),
                                    "{q:?} {path:?} xr={xr} ow={ow} i={i} r={r}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

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

    #[test]
    fn bad_shapes_are_errors() {
        let mut out = vec![0.0f32; 2];
        let p = best_path();
        let packed = vec![0u8; QType::Q4_1.packed_len(1, 32).unwrap()];
        assert!(qlinear(&[0.0; 64], &packed, QType::Q4_1, &mut out, 2, 32, 1, 1, p).is_ok());
        assert!(qlinear(&[0.0; 60], &packed, QType::Q4_1, &mut out, 2, 30, 1, 1, p).is_err());
        assert!(qlinear(&[0.0; 64], &packed[1..], QType::Q4_1, &mut out, 2, 32, 1, 1, p).is_err());
        assert!(qlinear(&[0.0; 64], &packed, QType::Q4_1, &mut out, 2, 32, 1, 0, p).is_err());
        assert!(pack(&[0; 19], QType::Q4_1, 1, 32).is_err());
        let mut one = vec![0.0f32; 32];
        assert!(dequantize_rows(&packed, QType::Q4_1, 32, 1, &[1], &mut one, 1).is_err());
        assert!(dequantize_rows(&packed, QType::Q4_1, 32, 1, &[-1], &mut one, 1).is_err());
        assert!(dequantize_rows(&packed, QType::Q4_1, 32, 1, &[0], &mut one, 0).is_err());
        assert!(dequantize_rows(&packed[1..], QType::Q4_1, 32, 1, &[0], &mut one, 1).is_err());
    }
}
