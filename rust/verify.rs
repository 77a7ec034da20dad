//! The exact verifier: one speculative round, and B independent rounds.
//!
//! p = target, q = draft, k = γ. Row i of p is the target distribution
//! conditioned on prefix + drafts[..i] (k + 1 rows), row i of q the
//! distribution draft i was sampled from (k rows). Draft i is accepted with
//! probability min(1, p_i(x)/q_i(x)) (tested as u · q_i(x) < p_i(x)); the first
//! rejection emits a sample of norm(max(0, p_i − q_i)) and ends the round;
//! if all k pass, a bonus token is drawn from p_k. Output: 1..=k+1 tokens.
//!
//! Cost: 2k gathers for the accept tests plus one pass over one p row (bonus)
//! or one p row and one q row (residual). With `Checks::full` every row is
//! also checked (finite, ≥ 0, sums to 1 within its tolerance); without it,
//! only the entries and rows the round reads are checked, so no input can
//! cause a panic, a NaN or an id outside [0, V), but an unread row that does
//! not sum to 1 goes unseen.
//!
//! Over 400 lines: the chain round, its checks, the two-phase (gathered) round and the
//! batch: one rule and the three ways it is called.

use ndarray::{ArrayView1, ArrayView2, ArrayView3, Axis};
use rand::RngExt;
use rayon::prelude::*;

use std::borrow::Cow;

use crate::block::block_round;
use crate::error::{Loc, Result, SpecError};
use crate::names::{from_name, Named};
use crate::prob::{
    check_entry, check_row, pick_residual, pick_row, residual_weights, row_weights, Prob, Residual, Row, Weights,
};
use crate::rng::{row_seed, stream, Stream};

/// The two dimensions of a round, checked: k (number of drafts) and V.
fn round_dims(p: (usize, usize), q: (usize, usize), drafts: usize) -> Result<(usize, usize)> {
    let (kp1, v) = p;
    if kp1 == 0 {
        return Err(SpecError::Shape(
            "p_rows has 0 rows; expected k + 1 rows (the target distribution at each \
             draft position plus the bonus position)"
                .into(),
        ));
    }
    let k = kp1 - 1;
    if v == 0 {
        return Err(SpecError::Shape(
            "p_rows has vocabulary size V = 0; expected V >= 1".into(),
        ));
    }
    if q.0 != k || drafts != k {
        return Err(SpecError::Shape(format!(
            "shapes do not fit: p_rows has {kp1} rows, so k = {k} and q_rows must have {k} \
             rows and drafts {k} entries, but q_rows has {} rows and drafts {} entries",
            q.0, drafts
        )));
    }
    if q.1 != v {
        return Err(SpecError::Shape(format!(
            "vocabulary mismatch: p_rows has V = {v} columns but q_rows has {}; \
             expected the same vocabulary (slice both to the shared tokenizer's size)",
            q.1
        )));
    }
    Ok((k, v))
}

fn row_slice<'a, T>(a: &'a ArrayView2<'_, T>, i: usize, name: &str) -> Result<&'a [T]> {
    a.index_axis(Axis(0), i)
        .to_slice()
        .ok_or_else(|| SpecError::Invalid(format!("{name} is not C-contiguous; pass np.ascontiguousarray({name})")))
}

/// The acceptance rule of a chain round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Token-wise: stop at the first rejected draft (Leviathan et al.).
    Token,
    /// Block verification (Sun et al., 2025; see `block`): the longest
    /// prefix the joint ratios allow; never fewer tokens in expectation.
    Block,
}

impl Named for Method {
    const WHAT: &'static str = "method";
    const TABLE: &'static [(Method, &'static str)] = &[(Method::Token, "token"), (Method::Block, "block")];
}

from_name!(Method);

/// How much of the input a round checks, and each array's row-sum tolerance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Checks {
    /// Check every row in full before the round; otherwise only what the round
    /// reads (the 2k gathered entries and the one or two rows it samples from).
    pub full: bool,
    /// Allowed |row sum − 1| of p's rows and of q's rows.
    pub p_tol: f64,
    pub q_tol: f64,
}

impl Checks {
    /// The default tolerances of the element types (1e-3 for f32, 1e-6 for f64).
    pub fn of<P: Prob, Q: Prob>(full: bool) -> Self {
        Checks {
            full,
            p_tol: P::SUM_TOL,
            q_tol: Q::SUM_TOL,
        }
    }
}

/// Below this many entries a full check runs on the calling thread: handing
/// the rows to the rayon pool costs tens of µs, more than checking them.
const PARALLEL_CHECK_MIN: usize = 1 << 16;

/// Check every row of `rows` in full; large inputs row-parallel (memory-bound:
/// two cores read faster than one). The lowest bad row's error is returned.
pub fn check_rows<T: Prob>(
    rows: &ArrayView2<'_, T>,
    array: &'static str,
    batch: Option<usize>,
    tol: f64,
) -> Result<()> {
    let check = |i: usize| check_row(Row::new(row_slice(rows, i, array)?, Loc::new(array, batch, i), tol));
    if rows.len() < PARALLEL_CHECK_MIN {
        return (0..rows.nrows()).try_for_each(check);
    }
    let results: Vec<Result<()>> = (0..rows.nrows()).into_par_iter().map(check).collect();
    results.into_iter().collect()
}

/// The names a round's errors use for p and q (batch rows say "p", "q").
fn names(batch: Option<usize>) -> (&'static str, &'static str) {
    if batch.is_some() {
        ("p", "q")
    } else {
        ("p_rows", "q_rows")
    }
}

/// The accept tests of a round on its gathered values: `gathered(i)` gives
/// (p_i(x_i), q_i(x_i)) for draft x_i = `token(i)`. Draft i is kept when
/// u_i · q_i(x_i) < p_i(x_i); the first rejection ends the loop. Returns the
/// number kept, m ≤ k, after drawing m + 1 uniforms (k when all are kept).
/// Each gathered value is checked (finite, ≥ 0, q_i(x_i) > 0).
pub fn accept_prefix(
    k: usize,
    gathered: impl Fn(usize) -> (f64, f64),
    token: impl Fn(usize) -> i64,
    rng: &mut Stream,
    batch: Option<usize>,
) -> Result<usize> {
    let (p_name, q_name) = names(batch);
    for i in 0..k {
        let x = token(i);
        let (px, qx) = gathered(i);
        check_entry(px, Loc::new(p_name, batch, i), x as usize)?;
        check_entry(qx, Loc::new(q_name, batch, i), x as usize)?;
        if qx <= 0.0 {
            return Err(SpecError::ZeroDraftProb {
                batch,
                index: i,
                token: x,
            });
        }
        let u: f64 = rng.random();
        if u * qx >= px {
            return Ok(i);
        }
    }
    Ok(k)
}

/// The uniforms `accept_prefix` drew for a round that kept m of k drafts.
pub fn accept_draws(m: usize, k: usize) -> usize {
    if m < k {
        m + 1
    } else {
        k
    }
}

/// Draft ids in [0, V): they index everything else.
fn check_drafts(drafts: &ArrayView1<'_, i64>, v: usize, batch: Option<usize>) -> Result<()> {
    for (i, &x) in drafts.iter().enumerate() {
        if x < 0 || x as u64 >= v as u64 {
            return Err(SpecError::DraftOutOfRange {
                batch,
                index: i,
                token: x,
                vocab: v,
            });
        }
    }
    Ok(())
}

/// What a round's last token is drawn from: the residual of p_m and q_m
/// after a rejection at draft m, or the bonus row p_k.
#[derive(Debug, Clone, PartialEq)]
pub enum Last {
    Residual(Residual),
    Bonus(Weights),
}

impl Last {
    /// The weights after `m` of `k` drafts were kept: `residual_weights(p_m,
    /// q_m)` (m < k) or `row_weights(p_k)`; `p_row` / `q_row` are those rows.
    pub fn of<P: Prob, Q: Prob>(p_row: Row<'_, P>, q_row: Option<Row<'_, Q>>) -> Result<Last> {
        match q_row {
            Some(q_row) => Ok(Last::Residual(residual_weights(p_row, q_row)?)),
            None => Ok(Last::Bonus(row_weights(p_row)?)),
        }
    }

    /// The token at mass u of these weights (`p`, `q`: the rows they came from).
    #[inline(always)]
    pub fn pick<P: Prob, Q: Prob>(&self, p: &[P], q: &[Q], u: f64) -> usize {
        match self {
            Last::Residual(r) => pick_residual(p, q, r, u),
            Last::Bonus(w) => pick_row(p, w, u),
        }
    }
}

/// The weights of the round's last token after `m` of `k` kept drafts: the
/// residual of p_m and q_m (m < k) or the bonus row p_k. With `full`, every
/// other row is checked in the same pass (row-parallel for large inputs), so
/// each byte of p and q is read once; the error of the first bad row in the
/// order p_0..p_k, q_0..q_{k-1} is returned.
fn last_weights<'a, P, Q, PF, QF>(k: usize, m: usize, p_row: &PF, q_row: &QF, full: bool) -> Result<Last>
where
    P: Prob,
    Q: Prob,
    PF: Fn(usize) -> Row<'a, P> + Sync,
    QF: Fn(usize) -> Row<'a, Q> + Sync,
{
    let sample = || Last::of(p_row(m), (m < k).then(|| q_row(m)));
    if !full {
        return sample();
    }
    // Tasks in error-report order: p rows 0..=k (row m samples), then q rows.
    let task = |t: usize| -> Result<Option<Last>> {
        if t == m {
            return sample().map(Some);
        }
        if t <= k {
            return check_row(p_row(t)).map(|_| None);
        }
        let i = t - (k + 1);
        if i == m {
            return Ok(None); // read with p_m by the residual
        }
        check_row(q_row(i)).map(|_| None)
    };
    let tasks = 2 * k + 1;
    let entries = (2 * k + 1) * p_row(0).data.len();
    let results: Vec<Result<Option<Last>>> = if entries < PARALLEL_CHECK_MIN {
        (0..tasks).map(task).collect()
    } else {
        (0..tasks).into_par_iter().map(task).collect()
    };
    let mut last = None;
    for r in results {
        if let Some(l) = r? {
            last = Some(l);
        }
    }
    last.ok_or_else(|| SpecError::Invalid("internal error: the round sampled nothing".into()))
}

/// One token-wise round (the shipped rule) on rows given by accessors:
/// `x(i)` is draft i (in [0, V)), `p_row(i)` for i in 0..=k and `q_row(i)`
/// for i in 0..k the rows it is verified on. Returns (m, the last token):
/// drafts 0..m are kept, then the token drawn from the residual of p_m and
/// q_m (m < k) or from the bonus row p_k (m = k). `verify` and
/// `verify_batch` run it; the Monte Carlo engine's exact chain round runs
/// `chain_round_with` on the same rule. `full`: check every row, not only
/// those read; `batch` labels errors.
pub fn chain_round<'a, P, Q, PF, QF>(
    k: usize,
    x: impl Fn(usize) -> usize,
    p_row: PF,
    q_row: QF,
    rng: &mut Stream,
    full: bool,
    batch: Option<usize>,
) -> Result<(usize, usize)>
where
    P: Prob,
    Q: Prob,
    PF: Fn(usize) -> Row<'a, P> + Sync,
    QF: Fn(usize) -> Row<'a, Q> + Sync,
{
    let last = |m: usize| last_weights(k, m, &p_row, &q_row, full).map(Cow::Owned);
    chain_round_with(k, x, &p_row, &q_row, rng, batch, last)
}

/// `chain_round` with the last token's weights from `last(m)`, which must
/// equal `Last::of` on the rows the round would read (p_m and q_m, or p_k):
/// the engine passes them computed once per table row, the verifier
/// computes them from the round's rows.
pub fn chain_round_with<'a, 'w, P, Q>(
    k: usize,
    x: impl Fn(usize) -> usize,
    p_row: impl Fn(usize) -> Row<'a, P>,
    q_row: impl Fn(usize) -> Row<'a, Q>,
    rng: &mut Stream,
    batch: Option<usize>,
    last: impl FnOnce(usize) -> Result<Cow<'w, Last>>,
) -> Result<(usize, usize)>
where
    P: Prob,
    Q: Prob,
{
    let gathered = |i: usize| {
        let xi = x(i);
        (p_row(i).data[xi].to_f64(), q_row(i).data[xi].to_f64())
    };
    let m = accept_prefix(k, gathered, |i| x(i) as i64, rng, batch)?;
    let weights = last(m)?;
    let u: f64 = rng.random();
    let q: &[Q] = if m < k { q_row(m).data } else { &[] };
    Ok((m, weights.pick(p_row(m).data, q, u)))
}

/// A C-contiguous (rows, V) array's data.
fn contiguous<'a, T>(a: &'a ArrayView2<'_, T>, name: &str) -> Result<&'a [T]> {
    a.as_slice()
        .ok_or_else(|| SpecError::Invalid(format!("{name} is not C-contiguous; pass np.ascontiguousarray({name})")))
}

/// One round into `out` (length ≥ k + 1); returns the number of tokens emitted.
///
/// `batch` only labels error messages.
#[allow(clippy::too_many_arguments)]
pub fn verify_into<P: Prob, Q: Prob>(
    p: &ArrayView2<'_, P>,
    q: &ArrayView2<'_, Q>,
    drafts: &ArrayView1<'_, i64>,
    rng: &mut Stream,
    checks: Checks,
    method: Method,
    batch: Option<usize>,
    out: &mut [i64],
) -> Result<usize> {
    let (k, v) = round_dims(p.dim(), q.dim(), drafts.len())?;
    check_drafts(drafts, v, batch)?;
    let (p_name, q_name) = names(batch);
    let (pd, qd) = (contiguous(p, p_name)?, contiguous(q, q_name)?);
    let p_row = |i: usize| Row::new(&pd[i * v..(i + 1) * v], Loc::new(p_name, batch, i), checks.p_tol);
    let q_row = |i: usize| Row::new(&qd[i * v..(i + 1) * v], Loc::new(q_name, batch, i), checks.q_tol);
    let x = |i: usize| drafts[i] as usize;
    let (kept, last) = match method {
        Method::Token => chain_round(k, x, p_row, q_row, rng, checks.full, batch)?,
        Method::Block => {
            if checks.full {
                check_rows(p, p_name, batch, checks.p_tol)?;
                check_rows(q, q_name, batch, checks.q_tol)?;
            }
            block_round(k, x, p_row, q_row, rng, batch)?
        }
    };
    for (o, &x) in out.iter_mut().zip(drafts.iter()).take(kept) {
        *o = x;
    }
    out[kept] = last as i64;
    Ok(kept + 1)
}

/// Phase 1 of a round whose rows live elsewhere (e.g. on a GPU): the number
/// of drafts kept, from the gathered values px[i] = p_i(x_i), qx[i] = q_i(x_i).
/// With `finish_round` on the same seed it equals `verify` on the full rows.
pub fn accept_gathered(px: ArrayView1<'_, f64>, qx: ArrayView1<'_, f64>, seed: u64) -> Result<usize> {
    let k = px.len();
    if qx.len() != k {
        return Err(SpecError::Shape(format!(
            "px has {k} entries but qx has {}; expected one p and one q value per draft",
            qx.len()
        )));
    }
    // the values are gathered already: error messages name no token
    accept_prefix(k, |i| (px[i], qx[i]), |_| 0, &mut stream(seed), None)
}

/// Phase 2: the round's last token after `m` of `k` drafts were kept: from
/// the residual of `p_row` and `q_row` (m < k, the rows of position m) or
/// from `p_row` alone (m == k, the bonus row; `q_row` is then not read).
/// Draws from the same stream as `verify` with this seed.
pub fn finish_round<P: Prob, Q: Prob>(
    p_row: ArrayView1<'_, P>,
    q_row: ArrayView1<'_, Q>,
    m: usize,
    k: usize,
    seed: u64,
    checks: Checks,
) -> Result<i64> {
    if m > k {
        return Err(SpecError::Invalid(format!("m = {m} kept drafts is more than k = {k}")));
    }
    let (Some(p_data), Some(q_data)) = (p_row.to_slice(), q_row.to_slice()) else {
        return Err(SpecError::Invalid("p_row and q_row must be C-contiguous".into()));
    };
    if p_data.is_empty() || (m < k && q_data.len() != p_data.len()) {
        return Err(SpecError::Shape(format!(
            "p_row has {} entries and q_row {}; expected V >= 1 entries each (q_row is not \
             read when all drafts were kept)",
            p_data.len(),
            q_data.len()
        )));
    }
    let mut rng = stream(seed);
    for _ in 0..accept_draws(m, k) {
        let _: f64 = rng.random();
    }
    let u: f64 = rng.random();
    let p = Row::new(p_data, Loc::new("p_rows", None, m), checks.p_tol);
    let token = if m < k {
        let q = Row::new(q_data, Loc::new("q_rows", None, m), checks.q_tol);
        pick_residual(p_data, q_data, &residual_weights(p, q)?, u)
    } else {
        pick_row(p_data, &row_weights(p)?, u)
    };
    Ok(token as i64)
}

/// One round: the emitted tokens (1..=k+1). Same inputs + same seed = same output.
/// p and q may differ in precision (f32/f64); each is checked with its own tolerance.
pub fn verify<P: Prob, Q: Prob>(
    p: ArrayView2<'_, P>,
    q: ArrayView2<'_, Q>,
    drafts: ArrayView1<'_, i64>,
    seed: u64,
    checks: Checks,
    method: Method,
) -> Result<Vec<i64>> {
    let mut out = vec![-1i64; p.nrows().max(1)];
    let n = verify_into(&p, &q, &drafts, &mut stream(seed), checks, method, None, &mut out)?;
    out.truncate(n);
    Ok(out)
}

/// Result of `verify_batch`: tokens (B × (k+1), row-major, padded with -1)
/// and the number emitted per row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub tokens: Vec<i64>,
    pub num_emitted: Vec<i64>,
    pub width: usize,
}

/// B independent rounds, spread over the current rayon pool. Row b uses the
/// stream of `row_seed(seed, b)`, so it equals `verify` with that seed.
/// On bad input the error of the lowest bad row is returned.
pub fn verify_batch<P: Prob, Q: Prob>(
    p: ArrayView3<'_, P>,
    q: ArrayView3<'_, Q>,
    drafts: ArrayView2<'_, i64>,
    seed: u64,
    checks: Checks,
    method: Method,
) -> Result<Batch> {
    let (b, kp1, v) = p.dim();
    if q.dim().0 != b || drafts.dim().0 != b {
        return Err(SpecError::Shape(format!(
            "batch sizes differ: p has {b} rows, q has {}, drafts has {}; expected the same B",
            q.dim().0,
            drafts.dim().0
        )));
    }
    round_dims((kp1, v), (q.dim().1, q.dim().2), drafts.dim().1)?;
    let width = kp1;
    let mut tokens = vec![-1i64; b * width];
    let mut num_emitted = vec![0i64; b];
    let results: Vec<Result<()>> = tokens
        .par_chunks_mut(width)
        .zip(num_emitted.par_iter_mut())
        .enumerate()
        .map(|(row, (out, n))| {
            let mut rng = stream(row_seed(seed, row as u64));
            let (pr, qr, dr) = (
                p.index_axis(Axis(0), row),
                q.index_axis(Axis(0), row),
                drafts.index_axis(Axis(0), row),
            );
            *n = verify_into(&pr, &qr, &dr, &mut rng, checks, method, Some(row), out)? as i64;
            Ok(())
        })
        .collect();
    results.into_iter().collect::<Result<Vec<()>>>()?;
    Ok(Batch {
        tokens,
        num_emitted,
        width,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{array, Array2};

    const FULL: Checks = Checks {
        full: true,
        p_tol: 1e-6,
        q_tol: 1e-6,
    };
    const READ: Checks = Checks {
        full: false,
        p_tol: 1e-6,
        q_tol: 1e-6,
    };

    #[test]
    fn equal_p_and_q_accept_everything() {
        let p = Array2::from_elem((4, 5), 0.2f64);
        let q = Array2::from_elem((3, 5), 0.2f64);
        let d = array![1i64, 4, 0];
        for seed in 0..200 {
            let out = verify(p.view(), q.view(), d.view(), seed, FULL, Method::Token).unwrap();
            assert_eq!(out.len(), 4);
            assert_eq!(&out[..3], &[1, 4, 0]);
        }
    }

    #[test]
    fn zero_target_probability_is_always_rejected() {
        // target certain of token 1, draft certain of token 0
        let p = array![[0.0f32, 1.0], [0.5, 0.5], [0.5, 0.5]];
        let q = array![[1.0f32, 0.0], [1.0, 0.0]];
        let d = array![0i64, 0];
        for seed in 0..100 {
            assert_eq!(
                verify(p.view(), q.view(), d.view(), seed, FULL, Method::Token).unwrap(),
                vec![1]
            );
        }
    }

    #[test]
    fn k_zero_samples_from_p() {
        let p = array![[0.0f64, 0.0, 1.0]];
        let q = Array2::<f64>::zeros((0, 3));
        let d = ndarray::Array1::<i64>::zeros(0);
        assert_eq!(
            verify(p.view(), q.view(), d.view(), 3, FULL, Method::Token).unwrap(),
            vec![2]
        );
    }

    #[test]
    fn bad_inputs_are_errors_not_panics() {
        let p = array![[0.5f64, 0.5], [0.5, 0.5]];
        let q = array![[0.5f64, 0.5]];
        let err = verify(p.view(), q.view(), array![2i64].view(), 0, FULL, Method::Token).unwrap_err();
        assert!(matches!(err, SpecError::DraftOutOfRange { token: 2, .. }));
        let q0 = array![[1.0f64, 0.0]];
        let err = verify(p.view(), q0.view(), array![1i64].view(), 0, READ, Method::Token).unwrap_err();
        assert!(matches!(err, SpecError::ZeroDraftProb { index: 0, .. }));
        let err = verify(p.view(), q.view(), array![0i64, 1].view(), 0, FULL, Method::Token).unwrap_err();
        assert!(matches!(err, SpecError::Shape(_)));
    }

    #[test]
    fn batch_equals_single_rounds() {
        let p = ndarray::Array3::from_shape_fn((6, 3, 4), |(b, i, j)| ((b + i + j) % 4 + 1) as f64 / 10.0);
        let q = ndarray::Array3::from_shape_fn((6, 2, 4), |(b, i, j)| ((b * 3 + i + 3 * j) % 4 + 1) as f64 / 10.0);
        let d = ndarray::Array2::from_shape_fn((6, 2), |(b, i)| ((b + i) % 4) as i64);
        let batch = verify_batch(p.view(), q.view(), d.view(), 11, FULL, Method::Token).unwrap();
        for row in 0..6 {
            let single = verify(
                p.index_axis(Axis(0), row),
                q.index_axis(Axis(0), row),
                d.index_axis(Axis(0), row),
                row_seed(11, row as u64),
                FULL,
                Method::Token,
            )
            .unwrap();
            let n = batch.num_emitted[row] as usize;
            assert_eq!(&batch.tokens[row * 3..row * 3 + n], single.as_slice());
            assert!(batch.tokens[row * 3 + n..(row + 1) * 3].iter().all(|&t| t == -1));
        }
    }

    #[test]
    fn two_phases_equal_one_call() {
        let p = ndarray::Array2::from_shape_fn((4, 5), |(i, j)| ((i + 2 * j) % 5 + 1) as f64 / 15.0);
        let q = ndarray::Array2::from_shape_fn((3, 5), |(i, j)| ((3 * i + j) % 5 + 1) as f64 / 15.0);
        let d = array![1i64, 3, 0];
        for seed in 0..300 {
            let one = verify(p.view(), q.view(), d.view(), seed, FULL, Method::Token).unwrap();
            let px = ndarray::Array1::from_shape_fn(3, |i| p[[i, d[i] as usize]]);
            let qx = ndarray::Array1::from_shape_fn(3, |i| q[[i, d[i] as usize]]);
            let m = accept_gathered(px.view(), qx.view(), seed).unwrap();
            let q_row = if m < 3 { q.row(m) } else { q.row(0) };
            let last = finish_round(p.row(m), q_row, m, 3, seed, FULL).unwrap();
            assert_eq!(one.len(), m + 1);
            assert_eq!(one[m], last, "seed {seed}");
        }
    }

    #[test]
    fn the_full_check_reads_rows_the_round_does_not() {
        // draft 0 is always accepted (p = q), so row 1 of q is never read
        let p = array![[0.5f64, 0.5], [1.0, 0.0], [0.5, 0.5]];
        let q = array![[0.5f64, 0.5], [f64::NAN, 1.0]];
        let d = array![0i64, 1];
        let read = verify(p.view(), q.view(), d.view(), 0, READ, Method::Token);
        // p_1(1) = 0 rejects draft 1 only after reading q_1(1) = 1; its row has a NaN
        assert!(matches!(read, Err(SpecError::NotFinite { .. })));
        let q = array![[0.5f64, 0.5], [0.0, 1.0]];
        let p_bad = array![[0.5f64, 0.5], [1.0, 0.0], [f64::NAN, 2.0]]; // draft 1 rejected: row 2 unread
        assert!(verify(p_bad.view(), q.view(), d.view(), 0, READ, Method::Token).is_ok());
        let full = verify(p_bad.view(), q.view(), d.view(), 0, FULL, Method::Token).unwrap_err();
        assert!(matches!(
            full,
            SpecError::NotFinite {
                loc: Loc { row: 2, .. },
                ..
            }
        ));
    }
}
