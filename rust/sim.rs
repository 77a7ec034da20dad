//! Monte Carlo engine: many speculative rounds of a toy model given as tables.
//!
//! p = target, q = draft, k = γ. A table has shape (S, V): S = V is a Markov
//! chain on the last token (row r is the distribution after token r), S = 1 a
//! prefix-independent model. Besides the exact rule, the engine reproduces the
//! known bugs (`Variant`) so that tests can show they are caught.
//!
//! Work is cut into fixed blocks of `BLOCK` runs (or rounds), block b drawing
//! from the stream of `row_seed(seed, b)`: counts are integer sums over
//! blocks, identical for any thread count.

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};

use ndarray::ArrayView2;
use rand::RngExt;
use rayon::prelude::*;

use crate::error::{Loc, Result, SpecError};
use crate::prob::{check_row, Row};
use crate::rng::{row_seed, stream, Stream};

/// Runs (or rounds) per independent random stream.
const BLOCK: u64 = 4096;
/// Largest joint histogram `simulate` builds (entries).
pub const MAX_HIST: usize = 1 << 24;

/// The speculative step, exact or with one of the known bugs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// The exact rule.
    Exact,
    /// No bonus token when all k drafts pass (still exact, fewer tokens).
    NoBonus,
    /// On rejection, sample from p instead of the residual.
    ResampleFromP,
    /// After a rejection, keep verifying the remaining drafts (and add the bonus).
    ContinueAfterReject,
    /// Accept with min(1, q/p) instead of min(1, p/q).
    InvertedRatio,
    /// Accept iff the draft is p's argmax; emit p's argmax otherwise (and as bonus).
    GreedyCheck,
    /// Emit every draft, then a bonus token from p.
    NoVerification,
    /// Verify draft i against p conditioned on drafts[..=i] (one position late).
    OffByOne,
}

impl Variant {
    /// Every variant with its name: the one table both directions read.
    pub const TABLE: [(Variant, &'static str); 8] = [
        (Variant::Exact, "exact"),
        (Variant::NoBonus, "no_bonus"),
        (Variant::ResampleFromP, "resample_from_p"),
        (Variant::ContinueAfterReject, "continue_after_reject"),
        (Variant::InvertedRatio, "inverted_ratio"),
        (Variant::GreedyCheck, "greedy_check"),
        (Variant::NoVerification, "no_verification"),
        (Variant::OffByOne, "off_by_one"),
    ];

    pub fn name(self) -> &'static str {
        Variant::TABLE.iter().find(|(v, _)| *v == self).map_or("", |(_, n)| n)
    }

    pub fn names() -> impl Iterator<Item = &'static str> {
        Variant::TABLE.iter().map(|(_, n)| *n)
    }
}

impl FromStr for Variant {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self> {
        Variant::TABLE
            .iter()
            .find(|(_, n)| *n == s)
            .map(|(v, _)| *v)
            .ok_or_else(|| {
                SpecError::Invalid(format!(
                    "unknown variant {s:?}; expected one of {}",
                    Variant::names().collect::<Vec<_>>().join(", ")
                ))
            })
    }
}

/// A toy target/draft pair with the per-row tables a round needs precomputed.
pub struct Chain {
    v: usize,
    s: usize,
    p: Vec<f64>,
    q: Vec<f64>,
    cdf_p: Vec<f64>,
    cdf_q: Vec<f64>,
    cdf_residual: Vec<f64>,
    argmax_p: Vec<usize>,
}

/// Normalized cumulative sums; from the last positive entry on, +inf, so a
/// search with any u in [0, 1) lands on an entry of positive weight.
fn cdf(weights: &[f64]) -> Vec<f64> {
    let total: f64 = weights.iter().sum();
    let mut out = Vec::with_capacity(weights.len());
    let mut cum = 0.0;
    for &w in weights {
        cum += w;
        out.push(cum / total);
    }
    if let Some(last) = weights.iter().rposition(|&w| w > 0.0) {
        out[last..].iter_mut().for_each(|c| *c = f64::INFINITY);
    }
    out
}

#[inline(always)]
fn draw(cdf_row: &[f64], u: f64) -> usize {
    cdf_row.partition_point(|&c| c <= u)
}

impl Chain {
    /// Build from p and q tables of shape (S, V), S = 1 or S = V.
    /// Each row is checked: finite, ≥ 0, sum within `p_tol` / `q_tol` of 1.
    /// Sampling normalizes every row by its sum.
    pub fn new(p: ArrayView2<'_, f64>, q: ArrayView2<'_, f64>, p_tol: f64, q_tol: f64) -> Result<Chain> {
        let (s, v) = p.dim();
        if q.dim() != (s, v) {
            return Err(SpecError::Shape(format!(
                "p_table has shape ({s}, {v}) but q_table has shape {:?}; expected equal shapes",
                q.dim()
            )));
        }
        if v == 0 || (s != 1 && s != v) {
            return Err(SpecError::Shape(format!(
                "tables have shape ({s}, {v}); expected (V, V) for a chain on the last token \
                 or (1, V) for a prefix-independent model, with V >= 1"
            )));
        }
        let p: Vec<f64> = p.iter().copied().collect();
        let q: Vec<f64> = q.iter().copied().collect();
        for r in 0..s {
            check_row(Row::new(&p[r * v..(r + 1) * v], Loc::new("p_table", None, r), p_tol))?;
            check_row(Row::new(&q[r * v..(r + 1) * v], Loc::new("q_table", None, r), q_tol))?;
        }
        let mut chain = Chain {
            v,
            s,
            p,
            q,
            cdf_p: vec![],
            cdf_q: vec![],
            cdf_residual: vec![],
            argmax_p: vec![],
        };
        for r in 0..s {
            let (pr, qr) = (chain.p_row(r).to_vec(), chain.q_row(r).to_vec());
            chain.cdf_p.extend(cdf(&pr));
            chain.cdf_q.extend(cdf(&qr));
            chain.cdf_residual.extend(residual_cdf(&pr, &qr));
            chain.argmax_p.push(argmax(&pr));
        }
        Ok(chain)
    }

    pub fn vocab(&self) -> usize {
        self.v
    }

    #[inline(always)]
    fn state(&self, token: usize) -> usize {
        if self.s == 1 {
            0
        } else {
            token
        }
    }
    #[inline(always)]
    fn p_row(&self, s: usize) -> &[f64] {
        &self.p[s * self.v..(s + 1) * self.v]
    }
    #[inline(always)]
    fn q_row(&self, s: usize) -> &[f64] {
        &self.q[s * self.v..(s + 1) * self.v]
    }
    #[inline(always)]
    fn row<'a>(&self, table: &'a [f64], s: usize) -> &'a [f64] {
        &table[s * self.v..(s + 1) * self.v]
    }

    /// One round after context token `last`; appends the emitted tokens to `out`
    /// (cleared first). `drafts` is scratch space.
    pub fn round(
        &self,
        variant: Variant,
        k: usize,
        last: usize,
        rng: &mut Stream,
        drafts: &mut Vec<usize>,
        out: &mut Vec<usize>,
    ) {
        out.clear();
        drafts.clear();
        let mut cur = last;
        for _ in 0..k {
            let x = draw(self.row(&self.cdf_q, self.state(cur)), rng.random());
            drafts.push(x);
            cur = x;
        }
        let mut ctx = last; // the token before draft i
        let mut all_accepted = true;
        for &x in drafts.iter() {
            let s = self.state(ctx);
            let (px, qx) = (self.p_row(s)[x], self.q_row(s)[x]);
            let u: f64 = rng.random();
            let accept = match variant {
                Variant::InvertedRatio => u * px < qx,
                Variant::GreedyCheck => x == self.argmax_p[s],
                Variant::NoVerification => true,
                Variant::OffByOne => u * qx < self.p_row(self.state(x))[x],
                _ => u * qx < px,
            };
            if accept {
                out.push(x);
                ctx = x;
                continue;
            }
            all_accepted = false;
            let u: f64 = rng.random();
            let y = match variant {
                Variant::ResampleFromP => draw(self.row(&self.cdf_p, s), u),
                Variant::GreedyCheck => self.argmax_p[s],
                Variant::OffByOne => draw(&residual_cdf(self.p_row(self.state(x)), self.q_row(s)), u),
                _ => draw(self.row(&self.cdf_residual, s), u),
            };
            out.push(y);
            if variant != Variant::ContinueAfterReject {
                break;
            }
            ctx = x; // the bug: later drafts stay conditioned on the rejected one
        }
        if all_accepted || variant == Variant::ContinueAfterReject {
            let s = self.state(ctx);
            match variant {
                Variant::NoBonus => {}
                Variant::GreedyCheck => out.push(self.argmax_p[s]),
                _ => out.push(draw(self.row(&self.cdf_p, s), rng.random())),
            }
        }
    }
}

fn residual_cdf(p: &[f64], q: &[f64]) -> Vec<f64> {
    let w: Vec<f64> = p.iter().zip(q).map(|(&a, &b)| (a - b).max(0.0)).collect();
    if w.iter().sum::<f64>() > 0.0 {
        cdf(&w)
    } else {
        cdf(p) // p == q: rejection has probability 0; see prob::sample_residual
    }
}

fn argmax(row: &[f64]) -> usize {
    let mut best = 0;
    for (j, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = j;
        }
    }
    best
}

/// What a simulation runs: the rule (exact or a known bug), drafts per round,
/// the context token every run (or generation) starts from, and the seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sim {
    pub variant: Variant,
    pub k: usize,
    pub start: usize,
    pub seed: u64,
}

impl Sim {
    fn check(&self, chain: &Chain) -> Result<()> {
        if self.start >= chain.v {
            return Err(SpecError::Invalid(format!(
                "start = {} is outside the vocabulary [0, {}); expected a token id",
                self.start, chain.v
            )));
        }
        if self.variant == Variant::NoBonus && self.k == 0 {
            return Err(SpecError::Invalid(
                "variant no_bonus with k = 0 emits no tokens; use k >= 1".into(),
            ));
        }
        Ok(())
    }
}

/// Split `total` items into blocks: (block index, items in it).
fn blocks(total: u64) -> impl ParallelIterator<Item = (u64, u64)> {
    let n = total.div_ceil(BLOCK);
    (0..n).into_par_iter().map(move |b| (b, BLOCK.min(total - b * BLOCK)))
}

fn add(mut a: Vec<i64>, b: Vec<i64>) -> Result<Vec<i64>> {
    a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
    Ok(a)
}

/// `Err(Interrupted)` once `stop` is set (checked between runs and rounds).
#[inline(always)]
fn go_on(stop: &AtomicBool) -> Result<()> {
    if stop.load(Ordering::Relaxed) {
        return Err(SpecError::Interrupted);
    }
    Ok(())
}

/// Joint histogram of the first `num_tokens` tokens emitted after `sim.start`,
/// over `runs` independent runs; flat, index Σ_j tok_j · V^(m−1−j).
/// Setting `stop` (from another thread) ends the work early with `Interrupted`.
pub fn simulate(chain: &Chain, sim: Sim, runs: u64, num_tokens: usize, stop: &AtomicBool) -> Result<Vec<i64>> {
    sim.check(chain)?;
    let v = chain.v;
    let size = (0..num_tokens).try_fold(1usize, |acc, _| acc.checked_mul(v).filter(|&n| n <= MAX_HIST));
    let size = match (num_tokens, size) {
        (0, _) => return Err(SpecError::Invalid("num_tokens = 0; expected num_tokens >= 1".into())),
        (_, Some(n)) => n,
        (_, None) => {
            return Err(SpecError::Invalid(format!(
                "a joint histogram of {num_tokens} tokens over V = {v} has more than {MAX_HIST} \
                 entries; lower num_tokens"
            )))
        }
    };
    blocks(runs)
        .try_fold(
            || vec![0i64; size],
            |mut hist, (b, n)| {
                let mut rng = stream(row_seed(sim.seed, b));
                let (mut drafts, mut out) = (Vec::new(), Vec::new());
                for _ in 0..n {
                    let (mut emitted, mut idx, mut last) = (0, 0usize, sim.start);
                    while emitted < num_tokens {
                        go_on(stop)?;
                        chain.round(sim.variant, sim.k, last, &mut rng, &mut drafts, &mut out);
                        for &t in out.iter().take(num_tokens - emitted) {
                            idx = idx * v + t;
                            emitted += 1;
                        }
                        last = *out.last().unwrap_or(&last);
                    }
                    hist[idx] += 1;
                }
                Ok(hist)
            },
        )
        .try_reduce(|| vec![0i64; size], add)
}

/// Counts of rounds by tokens emitted (index 0..=k+1) over `rounds` rounds.
/// Each block of rounds is one continuing generation from `sim.start`: the
/// next round's context is the last token emitted. `stop` as in `simulate`.
pub fn simulate_round_lengths(chain: &Chain, sim: Sim, rounds: u64, stop: &AtomicBool) -> Result<Vec<i64>> {
    sim.check(chain)?;
    let k = sim.k;
    blocks(rounds)
        .try_fold(
            || vec![0i64; k + 2],
            |mut counts, (b, n)| {
                let mut rng = stream(row_seed(sim.seed, b));
                let (mut drafts, mut out) = (Vec::new(), Vec::new());
                let mut last = sim.start;
                for _ in 0..n {
                    go_on(stop)?;
                    chain.round(sim.variant, k, last, &mut rng, &mut drafts, &mut out);
                    counts[out.len()] += 1;
                    last = *out.last().unwrap_or(&last);
                }
                Ok(counts)
            },
        )
        .try_reduce(|| vec![0i64; k + 2], add)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    fn lab_chain() -> Chain {
        let p = array![[0.6, 0.3, 0.1], [0.1, 0.2, 0.7], [0.3, 0.3, 0.4]];
        let q = array![[0.2, 0.5, 0.3], [0.4, 0.4, 0.2], [0.1, 0.8, 0.1]];
        Chain::new(p.view(), q.view(), 1e-6, 1e-6).unwrap()
    }

    fn sim(variant: Variant, k: usize, start: usize, seed: u64) -> Sim {
        Sim {
            variant,
            k,
            start,
            seed,
        }
    }

    static GO: AtomicBool = AtomicBool::new(false);

    fn tv(hist: &[i64], exact: &[f64]) -> f64 {
        let n: i64 = hist.iter().sum();
        hist.iter()
            .zip(exact)
            .map(|(&c, &e)| (c as f64 / n as f64 - e).abs())
            .sum::<f64>()
            / 2.0
    }

    #[test]
    fn exact_pairs_match_the_target_and_bugs_do_not() {
        let chain = lab_chain();
        let p0 = chain.p_row(0).to_vec();
        let exact: Vec<f64> = (0..9).map(|i| p0[i / 3] * chain.p_row(i / 3)[i % 3]).collect();
        let hist = simulate(&chain, sim(Variant::Exact, 2, 0, 0), 30_000, 2, &GO).unwrap();
        assert!(tv(&hist, &exact) < 0.015);
        for v in [
            Variant::ResampleFromP,
            Variant::ContinueAfterReject,
            Variant::InvertedRatio,
            Variant::GreedyCheck,
            Variant::NoVerification,
            Variant::OffByOne,
        ] {
            let hist = simulate(&chain, sim(v, 2, 0, 0), 30_000, 2, &GO).unwrap();
            assert!(tv(&hist, &exact) > 0.015, "{v:?} passed");
        }
    }

    #[test]
    fn results_do_not_depend_on_thread_count() {
        let chain = lab_chain();
        let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let three = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
        let a = one.install(|| simulate_round_lengths(&chain, sim(Variant::Exact, 3, 0, 9), 50_000, &GO).unwrap());
        let b = three.install(|| simulate_round_lengths(&chain, sim(Variant::Exact, 3, 0, 9), 50_000, &GO).unwrap());
        assert_eq!(a, b);
        assert_eq!(a.iter().sum::<i64>(), 50_000);
        assert_eq!(a[0], 0);
    }

    #[test]
    fn no_bonus_never_emits_k_plus_one() {
        let chain = lab_chain();
        let counts = simulate_round_lengths(&chain, sim(Variant::NoBonus, 2, 0, 1), 10_000, &GO).unwrap();
        assert_eq!(counts[3], 0);
        assert!(matches!(
            simulate_round_lengths(&chain, sim(Variant::NoBonus, 0, 0, 1), 10, &GO),
            Err(SpecError::Invalid(_))
        ));
    }

    #[test]
    fn unknown_variant_and_bad_shapes_are_errors() {
        assert!("exactly".parse::<Variant>().is_err());
        let p = array![[0.5, 0.5]];
        let q = array![[0.5, 0.5], [0.5, 0.5]];
        assert!(Chain::new(p.view(), q.view(), 1e-6, 1e-6).is_err());
        for (v, name) in Variant::TABLE {
            assert_eq!(name.parse::<Variant>().unwrap(), v);
            assert_eq!(v.name(), name);
        }
    }

    #[test]
    fn row_tolerances_are_the_callers() {
        let p = array![[0.5, 0.5004]];
        assert!(Chain::new(p.view(), p.view(), 1e-6, 1e-6).is_err());
        assert!(Chain::new(p.view(), p.view(), 1e-3, 1e-3).is_ok());
    }

    #[test]
    fn a_set_stop_flag_ends_the_work() {
        let chain = lab_chain();
        let stop = AtomicBool::new(true);
        let err = simulate(&chain, sim(Variant::Exact, 2, 0, 0), u64::MAX, 2, &stop).unwrap_err();
        assert_eq!(err, SpecError::Interrupted);
        let err = simulate_round_lengths(&chain, sim(Variant::Exact, 2, 0, 0), u64::MAX, &stop).unwrap_err();
        assert_eq!(err, SpecError::Interrupted);
    }
}
