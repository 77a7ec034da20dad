//! Probability rows: the element trait (f32 or f64, summed in f64), fast
//! row scans that validate, and inverse-CDF sampling that reads a row once.
//!
//! Sampling from weights w (for the bonus token w = p, for the residual
//! w = max(0, p − q)) takes one pass that sums w per chunk of `CHUNK`
//! entries, then a scan of the one chunk that holds u · Σw. The token
//! returned always has w > 0.
//!
//! Over 400 lines: every row scan the verifiers share, each portable body beside its AVX2
//! twin, which must agree with it bit for bit (read side by side, tested together).

use crate::error::{Loc, Result, SpecError};

/// Chunk size of the two-level inverse CDF.
pub(crate) const CHUNK: usize = 1024;
/// Independent accumulators per sum: two 4-lane vectors of f64.
pub(crate) const LANES: usize = 8;

/// A probability element type. All arithmetic is done in f64.
pub trait Prob: Copy + Send + Sync + 'static {
    /// The default allowed |row sum − 1| for this precision (callers may pass
    /// another, e.g. for float16 rows widened to f32).
    const SUM_TOL: f64;
    fn to_f64(self) -> f64;
    /// Entries 0..8 of `chunk` (8 long) widened to f64, as two 4-lane vectors.
    ///
    /// # Safety
    /// Only from a function compiled with AVX2 enabled, on a CPU that has it.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(chunk: &[Self]) -> (x86::__m256d, x86::__m256d);
}

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64 as x86;

impl Prob for f32 {
    const SUM_TOL: f64 = 1e-3;
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(chunk: &[f32]) -> (x86::__m256d, x86::__m256d) {
        debug_assert!(chunk.len() >= 8);
        let v = x86::_mm256_loadu_ps(chunk.as_ptr());
        (
            x86::_mm256_cvtps_pd(x86::_mm256_castps256_ps128(v)),
            x86::_mm256_cvtps_pd(x86::_mm256_extractf128_ps::<1>(v)),
        )
    }
}

impl Prob for f64 {
    const SUM_TOL: f64 = 1e-6;
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(chunk: &[f64]) -> (x86::__m256d, x86::__m256d) {
        debug_assert!(chunk.len() >= 8);
        (
            x86::_mm256_loadu_pd(chunk.as_ptr()),
            x86::_mm256_loadu_pd(chunk.as_ptr().add(4)),
        )
    }
}

/// Whether the row scans may use 256-bit vectors (checked once by std, then
/// cached). Each lane accumulates in the same order on every path, so the
/// sums, and the tokens sampled, are bitwise the same with or without it.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn wide_simd() -> bool {
    std::is_x86_feature_detected!("avx2")
}

/// Lanes 0..4 and 4..8 of an accumulator, as the portable code keeps them.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn lanes(v0: x86::__m256d, v1: x86::__m256d) -> [f64; LANES] {
    let mut out = [0.0f64; LANES];
    x86::_mm256_storeu_pd(out.as_mut_ptr(), v0);
    x86::_mm256_storeu_pd(out.as_mut_ptr().add(4), v1);
    out
}

#[inline(always)]
fn min(a: f64, b: f64) -> f64 {
    if b < a {
        b
    } else {
        a
    }
}

/// Sum of a row in f64 and whether every entry is a finite, non-negative number.
///
/// NaN and ±inf show up in the sum and negatives in the running minimum;
/// testing each entry's class instead keeps LLVM from vectorizing the loop.
#[inline]
fn sum_and_ok<T: Prob>(row: &[T]) -> (f64, bool) {
    #[cfg(target_arch = "x86_64")]
    if row.len() >= LANES && wide_simd() {
        // SAFETY: the CPU supports AVX2 (checked at run time just above).
        return unsafe { sum_and_ok_avx2(row) };
    }
    sum_and_ok_body(row)
}

/// `sum_and_ok_body` with explicit 256-bit vectors, lane for lane the same
/// additions in the same order (bitwise the same sum).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_and_ok_avx2<T: Prob>(row: &[T]) -> (f64, bool) {
    use x86::*;
    let zero = _mm256_setzero_pd();
    let (mut a0, mut a1, mut l0, mut l1) = (zero, zero, zero, zero);
    let chunks = row.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        let (x0, x1) = T::load8(c);
        a0 = _mm256_add_pd(a0, x0);
        a1 = _mm256_add_pd(a1, x1);
        l0 = _mm256_min_pd(x0, l0); // x < low ? x : low, as `min(low, x)`
        l1 = _mm256_min_pd(x1, l1);
    }
    sum_tail(tail, &lanes(a0, a1), &lanes(l0, l1))
}

#[inline(always)]
fn sum_and_ok_body<T: Prob>(row: &[T]) -> (f64, bool) {
    let mut acc = [0.0f64; LANES];
    let mut low = [0.0f64; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for l in 0..LANES {
            let x = c[l].to_f64();
            acc[l] += x;
            low[l] = min(low[l], x);
        }
    }
    sum_tail(tail, &acc, &low)
}

/// The lanes folded, then the tail entries (fewer than `LANES`) added.
#[inline(always)]
fn sum_tail<T: Prob>(tail: &[T], acc: &[f64; LANES], low: &[f64; LANES]) -> (f64, bool) {
    let mut sum: f64 = acc.iter().sum();
    let mut lowest = low.iter().fold(0.0, |a, &b| min(a, b));
    for &x in tail {
        let x = x.to_f64();
        sum += x;
        lowest = min(lowest, x);
    }
    (sum, sum.is_finite() && lowest >= 0.0)
}

/// One probability row as the round sees it: its entries, where it sits in the
/// input (for error messages) and its allowed |sum − 1|.
#[derive(Clone, Copy)]
pub struct Row<'a, T> {
    pub data: &'a [T],
    pub loc: Loc,
    pub tol: f64,
}

impl<'a, T: Prob> Row<'a, T> {
    pub fn new(data: &'a [T], loc: Loc, tol: f64) -> Self {
        Row { data, loc, tol }
    }
}

/// The first bad entry of a row known to hold one (slow path, errors only).
fn bad_entry<T: Prob>(row: &[T], loc: Loc) -> SpecError {
    for (col, &x) in row.iter().enumerate() {
        let x = x.to_f64();
        if !x.is_finite() {
            return SpecError::NotFinite { loc, col };
        }
        if x < 0.0 {
            return SpecError::Negative { loc, col, value: x };
        }
    }
    SpecError::Invalid(format!("{loc}: internal error locating a bad entry"))
}

fn check_sum(sum: f64, loc: Loc, tol: f64) -> Result<()> {
    if (sum - 1.0).abs() > tol {
        return Err(SpecError::NotNormalized { loc, sum, tol });
    }
    Ok(())
}

/// Full check of one probability row: finite, non-negative, sums to 1 ± tol.
pub fn check_row<T: Prob>(row: Row<'_, T>) -> Result<()> {
    let (sum, ok) = sum_and_ok(row.data);
    if !ok {
        return Err(bad_entry(row.data, row.loc));
    }
    check_sum(sum, row.loc, row.tol)
}

/// Check one gathered probability (a single entry the round reads).
#[inline]
pub fn check_entry(x: f64, loc: Loc, col: usize) -> Result<()> {
    if !x.is_finite() {
        return Err(SpecError::NotFinite { loc, col });
    }
    if x < 0.0 {
        return Err(SpecError::Negative { loc, col, value: x });
    }
    Ok(())
}

/// Pick the token at mass `target` in a row of weights given per-chunk sums.
///
/// `weight(j)` must be the same values the chunk sums were built from.
/// Returns an index with weight > 0; the caller guarantees Σ chunk sums > 0.
#[inline(always)]
pub(crate) fn pick<W: Fn(usize) -> f64>(sums: &[f64], len: usize, target: f64, weight: W) -> usize {
    let mut before = 0.0;
    let mut chosen = None;
    let mut last_positive = 0;
    for (c, &s) in sums.iter().enumerate() {
        if s > 0.0 {
            last_positive = c;
            if before + s > target {
                chosen = Some(c);
                break;
            }
        }
        before += s;
    }
    let c = match chosen {
        Some(c) => c,
        None => {
            // u · Σw rounded up to Σw: take the last chunk with mass.
            before = sums[..last_positive].iter().sum();
            last_positive
        }
    };
    let start = c * CHUNK;
    let end = (start + CHUNK).min(len);
    let t = target - before;
    let mut cum = 0.0;
    let mut last = None;
    for j in start..end {
        let w = weight(j);
        if w > 0.0 {
            cum += w;
            last = Some(j);
            if cum > t {
                return j;
            }
        }
    }
    // Rounding between the lane sums and this scan: the chunk's last positive entry.
    last.unwrap_or(start)
}

/// Per-chunk sums, inline for rows of up to 4 chunks (4096 entries): a small
/// row's round allocates nothing (the Monte Carlo engine runs millions a second).
pub type ChunkSums = smallvec::SmallVec<[f64; 4]>;

/// Per-chunk sums of a row's sampling weights, from which `pick` finds the
/// token at a given mass (total > 0).
#[derive(Debug, Clone, PartialEq)]
pub struct Weights {
    pub sums: ChunkSums,
    pub total: f64,
}

/// The weights w = row, after checking the whole row (finite, ≥ 0, sum 1 ± tol).
#[inline]
pub fn row_weights<T: Prob>(row: Row<'_, T>) -> Result<Weights> {
    let Row { data, loc, tol } = row;
    let mut sums = ChunkSums::with_capacity(data.len().div_ceil(CHUNK));
    let mut all_ok = true;
    let mut total = 0.0;
    for chunk in data.chunks(CHUNK) {
        let (s, ok) = sum_and_ok(chunk);
        all_ok &= ok;
        sums.push(s);
        total += s;
    }
    if !all_ok {
        return Err(bad_entry(data, loc));
    }
    check_sum(total, loc, tol)?;
    if total <= 0.0 {
        return Err(SpecError::ZeroMass { loc });
    }
    Ok(Weights { sums, total })
}

/// Sample an index of `row` with probability proportional to its entries,
/// reading the row once (plus one chunk). Checks the whole row on the way.
pub fn sample_row<T: Prob>(row: Row<'_, T>, u: f64) -> Result<usize> {
    let w = row_weights(row)?;
    Ok(pick_row(row.data, &w, u))
}

/// The token at mass u · Σw of `row` (w from `row_weights(row)`).
#[inline(always)]
pub fn pick_row<T: Prob>(row: &[T], w: &Weights, u: f64) -> usize {
    pick(&w.sums, row.len(), u * w.total, |j| row[j].to_f64())
}

/// Per-chunk sums of max(0, a·p − b·q), Σp, Σq and validity, in one pass.
/// With a = b = 1 the sums are bitwise those of max(0, p − q).
///
/// Rows shorter than one vector take the portable body (bitwise the same, and
/// inlined: the engine's toy rows have a few entries).
#[inline]
fn residual_chunk<P: Prob, Q: Prob>(p: &[P], q: &[Q], a: f64, b: f64) -> (f64, f64, f64, bool) {
    #[cfg(target_arch = "x86_64")]
    if p.len() >= LANES && wide_simd() {
        // SAFETY: the CPU supports AVX2 (checked at run time just above).
        return unsafe { residual_chunk_avx2(p, q, a, b) };
    }
    residual_chunk_body(p, q, a, b)
}

/// `residual_chunk_body` with explicit 256-bit vectors: lanes 0..4 and 4..8
/// of each accumulator are one vector each, and every lane adds the same
/// entries in the same order as the portable body, so the sums are bitwise
/// the same (max(0, NaN) is 0 on both paths; a NaN shows in Σp or Σq).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn residual_chunk_avx2<P: Prob, Q: Prob>(p: &[P], q: &[Q], a: f64, b: f64) -> (f64, f64, f64, bool) {
    use x86::*;
    let (va, vb, zero) = (_mm256_set1_pd(a), _mm256_set1_pd(b), _mm256_setzero_pd());
    let (mut w0, mut w1, mut p0, mut p1) = (zero, zero, zero, zero);
    let (mut q0, mut q1, mut l0, mut l1) = (zero, zero, zero, zero);
    let pc = p.chunks_exact(LANES);
    let qc = q.chunks_exact(LANES);
    let (pt, qt) = (pc.remainder(), qc.remainder());
    for (c, d) in pc.zip(qc) {
        let (x0, x1) = P::load8(c);
        let (y0, y1) = Q::load8(d);
        // max(d, 0) returns 0 when d is NaN, as f64::max(d, 0) does
        w0 = _mm256_add_pd(
            w0,
            _mm256_max_pd(_mm256_sub_pd(_mm256_mul_pd(va, x0), _mm256_mul_pd(vb, y0)), zero),
        );
        w1 = _mm256_add_pd(
            w1,
            _mm256_max_pd(_mm256_sub_pd(_mm256_mul_pd(va, x1), _mm256_mul_pd(vb, y1)), zero),
        );
        p0 = _mm256_add_pd(p0, x0);
        p1 = _mm256_add_pd(p1, x1);
        q0 = _mm256_add_pd(q0, y0);
        q1 = _mm256_add_pd(q1, y1);
        l0 = _mm256_min_pd(_mm256_min_pd(x0, y0), l0);
        l1 = _mm256_min_pd(_mm256_min_pd(x1, y1), l1);
    }
    let (w_acc, p_acc, q_acc, low) = (lanes(w0, w1), lanes(p0, p1), lanes(q0, q1), lanes(l0, l1));
    residual_tail(pt, qt, a, b, &w_acc, &p_acc, &q_acc, &low)
}

#[inline(always)]
fn residual_chunk_body<P: Prob, Q: Prob>(p: &[P], q: &[Q], a: f64, b: f64) -> (f64, f64, f64, bool) {
    let mut w_acc = [0.0f64; LANES];
    let mut p_acc = [0.0f64; LANES];
    let mut q_acc = [0.0f64; LANES];
    let mut low = [0.0f64; LANES];
    let pc = p.chunks_exact(LANES);
    let qc = q.chunks_exact(LANES);
    let (pt, qt) = (pc.remainder(), qc.remainder());
    for (c, d) in pc.zip(qc) {
        for l in 0..LANES {
            let (x, y) = (c[l].to_f64(), d[l].to_f64());
            w_acc[l] += (a * x - b * y).max(0.0);
            p_acc[l] += x;
            q_acc[l] += y;
            low[l] = min(min(x, y), low[l]);
        }
    }
    residual_tail(pt, qt, a, b, &w_acc, &p_acc, &q_acc, &low)
}

/// The lanes folded, then the tail entries (fewer than `LANES`) added.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn residual_tail<P: Prob, Q: Prob>(
    pt: &[P],
    qt: &[Q],
    a: f64,
    b: f64,
    w_acc: &[f64; LANES],
    p_acc: &[f64; LANES],
    q_acc: &[f64; LANES],
    low: &[f64; LANES],
) -> (f64, f64, f64, bool) {
    let mut w: f64 = w_acc.iter().sum();
    let mut ps: f64 = p_acc.iter().sum();
    let mut qs: f64 = q_acc.iter().sum();
    let mut lowest = low.iter().fold(0.0, |a, &b| min(a, b));
    for (&x, &y) in pt.iter().zip(qt) {
        let (x, y) = (x.to_f64(), y.to_f64());
        w += (a * x - b * y).max(0.0);
        ps += x;
        qs += y;
        lowest = min(lowest, min(x, y));
    }
    (w, ps, qs, ps.is_finite() && qs.is_finite() && lowest >= 0.0)
}

/// The weights a rejection samples from: max(0, p − q), or p itself when
/// rounding leaves no residual mass (p ≤ q everywhere, which for normalized
/// rows means p = q up to rounding: the exact residual is undefined, and
/// drawing from p keeps P(emit x) = p(x) and never picks a zero-probability token).
#[derive(Debug, Clone, PartialEq)]
pub enum Residual {
    /// Weights max(0, a·p − b·q); a = b = 1 for the token-wise residual.
    Mass {
        w: Weights,
        a: f64,
        b: f64,
    },
    FromP(Weights),
}

/// `Residual` of a p row and a q row in one pass over both, checking each
/// against its own precision's tolerance.
#[inline]
pub fn residual_weights<P: Prob, Q: Prob>(p_row: Row<'_, P>, q_row: Row<'_, Q>) -> Result<Residual> {
    residual_weights_scaled(p_row, q_row, 1.0, 1.0)
}

/// The residual of scaled rows, w = max(0, a·p − b·q), in one pass that
/// checks both rows: block verification's max(0, p_τ·p − q) (b = 1), the
/// tree's max(0, p − q/(1 − drawn mass)) for children drawn without
/// replacement (a = 1), the token-wise residual (a = b = 1). Without
/// residual mass it falls back to p.
#[inline]
pub fn residual_weights_scaled<P: Prob, Q: Prob>(
    p_row: Row<'_, P>,
    q_row: Row<'_, Q>,
    a: f64,
    b: f64,
) -> Result<Residual> {
    let (p, q) = (p_row.data, q_row.data);
    let chunks = p.len().div_ceil(CHUNK);
    let (mut sums, mut p_sums) = (ChunkSums::with_capacity(chunks), ChunkSums::with_capacity(chunks));
    let (mut total, mut p_sum, mut q_sum, mut all_ok) = (0.0, 0.0, 0.0, true);
    for (pc, qc) in p.chunks(CHUNK).zip(q.chunks(CHUNK)) {
        let (w, ps, qs, ok) = residual_chunk(pc, qc, a, b);
        sums.push(w);
        p_sums.push(ps);
        total += w;
        p_sum += ps;
        q_sum += qs;
        all_ok &= ok;
    }
    if !all_ok {
        check_row(p_row)?;
        return Err(bad_entry(q, q_row.loc));
    }
    check_sum(p_sum, p_row.loc, p_row.tol)?;
    check_sum(q_sum, q_row.loc, q_row.tol)?;
    if total > 0.0 {
        return Ok(Residual::Mass {
            w: Weights { sums, total },
            a,
            b,
        });
    }
    if p_sum <= 0.0 {
        return Err(SpecError::ZeroMass { loc: p_row.loc });
    }
    Ok(Residual::FromP(Weights {
        sums: p_sums,
        total: p_sum,
    }))
}

/// The token at mass u · Σw of the residual of p and q.
#[inline(always)]
pub fn pick_residual<P: Prob, Q: Prob>(p: &[P], q: &[Q], r: &Residual, u: f64) -> usize {
    match r {
        Residual::Mass { w, a, b } => pick(&w.sums, p.len(), u * w.total, |j| {
            (a * p[j].to_f64() - b * q[j].to_f64()).max(0.0)
        }),
        Residual::FromP(w) => pick_row(p, w, u),
    }
}

/// Sample from the residual norm(max(0, p − q)) in one pass over p and q.
pub fn sample_residual<P: Prob, Q: Prob>(p_row: Row<'_, P>, q_row: Row<'_, Q>, u: f64) -> Result<usize> {
    let r = residual_weights(p_row, q_row)?;
    Ok(pick_residual(p_row.data, q_row.data, &r, u))
}

// ---- the updated residual of a tree walk ----------------------------------
// After rejections among a node's children, p' = max(0, p' − b·q) / z for
// each; the scans below read p and q once and apply the updates on the fly.

/// One rejection among a node's children: p' ← max(0, p' − b·q) / z.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Update {
    pub b: f64,
    pub z: f64,
}

/// p'(x) from p(x) and q(x) after `updates` (the same arithmetic as the
/// passes: multiplied by 1/z).
#[inline(always)]
pub fn updated(px: f64, qx: f64, updates: &[Update]) -> f64 {
    updates.iter().fold(px, |y, u| (y - u.b * qx).max(0.0) * (1.0 / u.z))
}

/// p'(x) after `N` updates, unrolled (N is known at compile time).
#[inline(always)]
fn updated_n<const N: usize>(px: f64, qx: f64, ups: &[(f64, f64); N]) -> f64 {
    let mut y = px;
    for &(b, inv_z) in ups {
        y = (y - b * qx).max(0.0) * inv_z;
    }
    y
}

/// Sums over one chunk of max(0, p' − b·q) and of p', with `LANES` accumulators.
#[inline(always)]
fn later_chunk_body<const N: usize, P: Prob, Q: Prob>(p: &[P], q: &[Q], ups: &[(f64, f64); N], b: f64) -> (f64, f64) {
    let (mut w, mut s) = ([0.0f64; LANES], [0.0f64; LANES]);
    let (pc, qc) = (p.chunks_exact(LANES), q.chunks_exact(LANES));
    let (pt, qt) = (pc.remainder(), qc.remainder());
    for (c, d) in pc.zip(qc) {
        for l in 0..LANES {
            let (x, y) = (c[l].to_f64(), d[l].to_f64());
            let xp = updated_n(x, y, ups);
            w[l] += (xp - b * y).max(0.0);
            s[l] += xp;
        }
    }
    later_tail(pt, qt, ups, b, &w, &s)
}

/// The lanes folded, then the tail entries (fewer than `LANES`) added.
#[inline(always)]
fn later_tail<const N: usize, P: Prob, Q: Prob>(
    pt: &[P],
    qt: &[Q],
    ups: &[(f64, f64); N],
    b: f64,
    w: &[f64; LANES],
    s: &[f64; LANES],
) -> (f64, f64) {
    let (mut w, mut s): (f64, f64) = (w.iter().sum(), s.iter().sum());
    for (&x, &y) in pt.iter().zip(qt) {
        let xp = updated_n(x.to_f64(), y.to_f64(), ups);
        w += (xp - b * y.to_f64()).max(0.0);
        s += xp;
    }
    (w, s)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn later_chunk_avx2<const N: usize, P: Prob, Q: Prob>(
    p: &[P],
    q: &[Q],
    ups: &[(f64, f64); N],
    b: f64,
) -> (f64, f64) {
    use std::arch::x86_64::*;
    let (zero, vb) = (_mm256_setzero_pd(), _mm256_set1_pd(b));
    let factors = ups.map(|(ub, inv_z)| (_mm256_set1_pd(ub), _mm256_set1_pd(inv_z)));
    let updated = |x: __m256d, y: __m256d| {
        let mut v = x;
        for &(ub, inv_z) in &factors {
            v = _mm256_mul_pd(_mm256_max_pd(_mm256_sub_pd(v, _mm256_mul_pd(ub, y)), zero), inv_z);
        }
        v
    };
    let (mut w0, mut w1, mut s0, mut s1) = (zero, zero, zero, zero);
    let (pc, qc) = (p.chunks_exact(LANES), q.chunks_exact(LANES));
    let (pt, qt) = (pc.remainder(), qc.remainder());
    for (c, d) in pc.zip(qc) {
        let (x0, x1) = P::load8(c);
        let (y0, y1) = Q::load8(d);
        let (u0, u1) = (updated(x0, y0), updated(x1, y1));
        w0 = _mm256_add_pd(w0, _mm256_max_pd(_mm256_sub_pd(u0, _mm256_mul_pd(vb, y0)), zero));
        w1 = _mm256_add_pd(w1, _mm256_max_pd(_mm256_sub_pd(u1, _mm256_mul_pd(vb, y1)), zero));
        s0 = _mm256_add_pd(s0, u0);
        s1 = _mm256_add_pd(s1, u1);
    }
    later_tail(pt, qt, ups, b, &lanes(w0, w1), &lanes(s0, s1))
}

fn later_chunk<const N: usize, P: Prob, Q: Prob>(p: &[P], q: &[Q], ups: &[(f64, f64); N], b: f64) -> (f64, f64) {
    #[cfg(target_arch = "x86_64")]
    if wide_simd() {
        // SAFETY: the CPU supports AVX2 (checked at run time just above).
        return unsafe { later_chunk_avx2(p, q, ups, b) };
    }
    later_chunk_body(p, q, ups, b)
}

/// Chunk sums of w = max(0, p' − b·q) and of p' with N updates.
fn later_sums<const N: usize, P: Prob, Q: Prob>(
    p: &[P],
    q: &[Q],
    ups: &[(f64, f64); N],
    b: f64,
) -> (ChunkSums, ChunkSums) {
    p.chunks(CHUNK)
        .zip(q.chunks(CHUNK))
        .map(|(pc, qc)| later_chunk(pc, qc, ups, b))
        .unzip()
}

/// The updates as (b, 1/z) pairs, the form the passes use.
fn factors(updates: &[Update]) -> Vec<(f64, f64)> {
    updates.iter().map(|u| (u.b, 1.0 / u.z)).collect()
}

/// Chunk sums of w = max(0, p' − b·q) and of p' itself, where p' is p after
/// `updates` (non-empty: the rows were checked by the first update's pass).
/// Up to three updates run unrolled and vectorized; more take a general loop.
pub fn later_weights<P: Prob, Q: Prob>(p: &[P], q: &[Q], updates: &[Update], b: f64) -> (Weights, Weights) {
    let f = factors(updates);
    let (w_sums, p_sums): (ChunkSums, ChunkSums) = match f.len() {
        1 => later_sums(p, q, &[f[0]], b),
        2 => later_sums(p, q, &[f[0], f[1]], b),
        3 => later_sums(p, q, &[f[0], f[1], f[2]], b),
        _ => p
            .chunks(CHUNK)
            .zip(q.chunks(CHUNK))
            .map(|(pc, qc)| {
                pc.iter().zip(qc).fold((0.0, 0.0), |(w, s), (&x, &y)| {
                    let xp = updated(x.to_f64(), y.to_f64(), updates);
                    (w + (xp - b * y.to_f64()).max(0.0), s + xp)
                })
            })
            .unzip(),
    };
    let total = |v: &ChunkSums| v.iter().sum();
    (
        Weights {
            total: total(&w_sums),
            sums: w_sums,
        },
        Weights {
            total: total(&p_sums),
            sums: p_sums,
        },
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn at<T: Prob>(data: &[T]) -> Row<'_, T> {
        Row::new(data, Loc::new("p_rows", None, 0), T::SUM_TOL)
    }

    /// Rows of `n` entries from a fixed recurrence: zeros, ties between p
    /// and q, and (when `bad`) a negative entry and a NaN.
    pub(crate) fn test_rows(n: usize, bad: bool) -> (Vec<f64>, Vec<f64>) {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        let mut p: Vec<f64> = (0..n).map(|_| next()).collect();
        let mut q: Vec<f64> = (0..n).map(|_| next()).collect();
        for i in (0..n).step_by(5) {
            q[i] = p[i]; // ties: p − q = 0
        }
        for i in (0..n).step_by(11) {
            p[i] = 0.0;
        }
        if bad && n > 3 {
            p[3] = -0.25;
            q[n - 1] = f64::NAN;
        }
        (p, q)
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_scans_equal_the_portable_ones_bitwise() {
        if !wide_simd() {
            return; // nothing to compare on this CPU
        }
        let same = |x: (f64, f64, f64, bool), y: (f64, f64, f64, bool)| {
            x.0.to_bits() == y.0.to_bits()
                && x.1.to_bits() == y.1.to_bits()
                && x.2.to_bits() == y.2.to_bits()
                && x.3 == y.3
        };
        for n in [0, 1, 7, 8, 9, 1023, 1024] {
            for bad in [false, true] {
                let (p, q) = test_rows(n, bad);
                let (p32, q32): (Vec<f32>, Vec<f32>) = (
                    p.iter().map(|&x| x as f32).collect(),
                    q.iter().map(|&x| x as f32).collect(),
                );
                for (a, b) in [(1.0, 1.0), (0.7, 1.0), (1.0, 1.3)] {
                    // SAFETY: AVX2 checked above.
                    unsafe {
                        assert!(same(
                            residual_chunk_avx2(&p, &q, a, b),
                            residual_chunk_body(&p, &q, a, b)
                        ));
                        assert!(same(
                            residual_chunk_avx2(&p32, &q, a, b),
                            residual_chunk_body(&p32, &q, a, b)
                        ));
                        assert!(same(
                            residual_chunk_avx2(&p32, &q32, a, b),
                            residual_chunk_body(&p32, &q32, a, b)
                        ));
                    }
                }
                // SAFETY: AVX2 checked above.
                let (x, y) = unsafe { (sum_and_ok_avx2(&p32), sum_and_ok_avx2(&q)) };
                let (u, v) = (sum_and_ok_body(&p32), sum_and_ok_body(&q));
                assert!(x.0.to_bits() == u.0.to_bits() && x.1 == u.1, "n = {n}");
                assert!(y.0.to_bits() == v.0.to_bits() && y.1 == v.1, "n = {n}");
            }
        }
    }

    #[test]
    fn sample_row_inverse_cdf_on_a_small_row() {
        let row = [0.25f64, 0.0, 0.75];
        assert_eq!(sample_row(at(&row), 0.0).unwrap(), 0);
        assert_eq!(sample_row(at(&row), 0.2499).unwrap(), 0);
        assert_eq!(sample_row(at(&row), 0.25).unwrap(), 2);
        assert_eq!(sample_row(at(&row), 0.999_999_999).unwrap(), 2);
    }

    #[test]
    fn sample_row_never_returns_zero_weight_across_chunks() {
        // mass only at the very ends of a row spanning several chunks
        let mut row = vec![0.0f32; 5000];
        row[3] = 0.5;
        row[4999] = 0.5;
        for i in 0..=1000 {
            let u = i as f64 / 1000.0 * (1.0 - 1e-12);
            let j = sample_row(at(&row), u).unwrap();
            assert!(j == 3 || j == 4999, "u={u} gave {j}");
        }
    }

    #[test]
    fn residual_is_p_minus_q_normalized() {
        let p = [0.5f64, 0.3, 0.2];
        let q = [0.3f64, 0.3, 0.4];
        // residual = [0.2, 0, 0] / 0.2 -> always token 0
        for i in 0..100 {
            let u = i as f64 / 100.0;
            assert_eq!(sample_residual(at(&p), at(&q), u).unwrap(), 0);
        }
    }

    #[test]
    fn a_tiny_residual_mass_is_found_not_divided_away() {
        let p = [0.5f64, 0.5];
        let q = [0.5 + 1e-15, 0.5 - 1e-15];
        for i in 0..100 {
            let u = i as f64 / 100.0;
            assert_eq!(sample_residual(at(&p), at(&q), u).unwrap(), 1);
        }
    }

    #[test]
    fn residual_without_mass_falls_back_to_p() {
        let p = [0.5f64, 0.5];
        let j = sample_residual(at(&p), at(&p), 0.75).unwrap();
        assert_eq!(j, 1);
    }

    #[test]
    fn bad_rows_are_errors() {
        assert!(matches!(
            check_row(at(&[0.5f64, f64::NAN])),
            Err(SpecError::NotFinite { col: 1, .. })
        ));
        assert!(matches!(
            check_row(at(&[1.5f64, -0.5])),
            Err(SpecError::Negative { col: 1, .. })
        ));
        assert!(matches!(
            check_row(at(&[0.5f32, 0.4])),
            Err(SpecError::NotNormalized { .. })
        ));
        assert!(check_row(at(&[0.5f32, 0.5005])).is_ok());
        assert!(matches!(
            sample_row(at(&[0.0f64; 4]), 0.5),
            Err(SpecError::NotNormalized { .. })
        ));
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_later_pass_equals_the_portable_one_bitwise() {
        if !wide_simd() {
            return; // nothing to compare on this CPU
        }
        for n in [0, 1, 7, 8, 9, 1023, 1024] {
            let (p, q) = test_rows(n, false);
            let p32: Vec<f32> = p.iter().map(|&x| x as f32).collect();
            let ups = [(1.0, 1.0 / 0.6), (0.8, 1.0 / 0.7), (1.0, 1.0 / 0.9)];
            // SAFETY: AVX2 checked above.
            unsafe {
                let same =
                    |x: (f64, f64), y: (f64, f64)| x.0.to_bits() == y.0.to_bits() && x.1.to_bits() == y.1.to_bits();
                assert!(same(
                    later_chunk_avx2(&p, &q, &[ups[0]], 1.0),
                    later_chunk_body(&p, &q, &[ups[0]], 1.0)
                ));
                assert!(same(
                    later_chunk_avx2(&p32, &q, &ups, 0.5),
                    later_chunk_body(&p32, &q, &ups, 0.5)
                ));
            }
        }
    }
}
