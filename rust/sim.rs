//! Monte Carlo engine: many speculative rounds of a toy model given as tables.
//!
//! p = target, q = draft, k = γ. A table has shape (S, V): S = V is a Markov
//! chain on the last token (row r is the distribution after token r), S = 1 a
//! prefix-independent model. The exact rounds run the verifier's own code
//! (`verify::chain_round_with`, `block::block_round`, `tree::walk`); besides them
//! the engine reproduces the known bugs (`Variant`), which alone keep code of
//! their own, so that tests can show they are caught.
//!
//! Work is cut into fixed blocks of `BLOCK` runs (or rounds), block b drawing
//! from the stream of `row_seed(seed, b)`: counts are integer sums over
//! blocks, identical for any thread count.
//!
//! Over 400 lines: the engine and the known bugs it reproduces (each bug's rule is its
//! own code; the exact rounds are the verifiers').

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};

use ndarray::ArrayView2;
use rand::RngExt;
use rayon::prelude::*;

use crate::block::block_round;
use crate::error::{Loc, Result, SpecError};
use crate::names::{from_name, Named};
use crate::prob::{check_row, Row};
use crate::rng::{row_seed, stream, Stream};
use crate::tree::{walk, Children, Topology, TreeRows, TreeRule, Update, Walk};
use crate::verify::{chain_round_with, Last};

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
    /// Block verification (exact; keeps at least as many drafts on average).
    Block,
}

impl Named for Variant {
    const WHAT: &'static str = "variant";
    const TABLE: &'static [(Variant, &'static str)] = &[
        (Variant::Exact, "exact"),
        (Variant::NoBonus, "no_bonus"),
        (Variant::ResampleFromP, "resample_from_p"),
        (Variant::ContinueAfterReject, "continue_after_reject"),
        (Variant::InvertedRatio, "inverted_ratio"),
        (Variant::GreedyCheck, "greedy_check"),
        (Variant::NoVerification, "no_verification"),
        (Variant::OffByOne, "off_by_one"),
        (Variant::Block, "block"),
    ];
}

from_name!(Variant);

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
    /// Per state, the tokens by q descending (ties: lower id first).
    order_q: Vec<usize>,
    /// Per state, the number of tokens q gives positive probability.
    support_q: Vec<usize>,
    /// Per state, the verifier's weights of a round's last token there
    /// (`Last::of` on the state's rows): after a rejection and as the bonus.
    residual: Vec<Last>,
    bonus: Vec<Last>,
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
            order_q: vec![],
            support_q: vec![],
            residual: vec![],
            bonus: vec![],
        };
        for r in 0..s {
            let (pr, qr) = (chain.p_row(r).to_vec(), chain.q_row(r).to_vec());
            chain.cdf_p.extend(cdf(&pr));
            chain.cdf_q.extend(cdf(&qr));
            chain.cdf_residual.extend(residual_cdf(&pr, &qr));
            chain.argmax_p.push(argmax(&pr));
            let mut order: Vec<usize> = (0..v).collect();
            order.sort_by(|&a, &b| qr[b].total_cmp(&qr[a]).then(a.cmp(&b)));
            chain.order_q.extend(order);
            chain.support_q.push(qr.iter().filter(|&&x| x > 0.0).count());
            let (p_row, q_row) = (
                chain.table_row(&chain.p, "p_table", r),
                chain.table_row(&chain.q, "q_table", r),
            );
            chain.residual.push(Last::of(p_row, Some(q_row))?);
            chain.bonus.push(Last::of(p_row, None::<Row<'_, f64>>)?);
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

    /// Row `s` of p or q as the verifiers read it (rows were checked when
    /// the chain was built, so the sum check is off).
    fn table_row<'a>(&self, table: &'a [f64], array: &'static str, s: usize) -> Row<'a, f64> {
        Row::new(self.row(table, s), Loc::new(array, None, s), f64::INFINITY)
    }

    /// Block verification of `drafts` after context `last` into `out`.
    fn block_round(&self, last: usize, rng: &mut Stream, drafts: &[usize], out: &mut Vec<usize>) -> Result<()> {
        let ctx = |i: usize| self.state(if i == 0 { last } else { drafts[i - 1] });
        let (kept, y) = block_round(
            drafts.len(),
            |i| drafts[i],
            |i| self.table_row(&self.p, "p_table", ctx(i)),
            |i| self.table_row(&self.q, "q_table", ctx(i)),
            rng,
            None,
        )?;
        out.extend_from_slice(&drafts[..kept]);
        out.push(y);
        Ok(())
    }

    /// The exact chain round: the verifier's own round (`chain_round_with`)
    /// on the table rows of each draft's context, the last token's weights
    /// those `Last::of` gave for that row when the chain was built.
    fn exact_round(&self, last: usize, rng: &mut Stream, drafts: &[usize], out: &mut Vec<usize>) -> Result<()> {
        let k = drafts.len();
        let ctx = |i: usize| self.state(if i == 0 { last } else { drafts[i - 1] });
        let weights = |m: usize| {
            let table = if m < k { &self.residual } else { &self.bonus };
            Ok(Cow::Borrowed(&table[ctx(m)]))
        };
        let (kept, y) = chain_round_with(
            k,
            |i| drafts[i],
            |i| self.table_row(&self.p, "p_table", ctx(i)),
            |i| self.table_row(&self.q, "q_table", ctx(i)),
            rng,
            None,
            weights,
        )?;
        out.extend_from_slice(&drafts[..kept]);
        out.push(y);
        Ok(())
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
    ) -> Result<()> {
        out.clear();
        drafts.clear();
        let mut cur = last;
        for _ in 0..k {
            let x = draw(self.row(&self.cdf_q, self.state(cur)), rng.random());
            drafts.push(x);
            cur = x;
        }
        match variant {
            Variant::Block => return self.block_round(last, rng, drafts, out),
            Variant::Exact => return self.exact_round(last, rng, drafts, out),
            _ => {}
        }
        // The known bugs (and no_bonus) keep a rule of their own.
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
        Ok(())
    }

    /// A token of state `s`'s q drawn without replacement: from q restricted to
    /// the tokens not in `taken` (whose q mass is `taken_mass`), with uniform u.
    fn draw_without(&self, s: usize, taken: &[usize], taken_mass: f64, u: f64) -> usize {
        let q = self.q_row(s);
        let total: f64 = q.iter().sum::<f64>() - taken_mass;
        let target = u * total;
        let (mut cum, mut last) = (0.0, 0);
        for (x, &w) in q.iter().enumerate() {
            if w <= 0.0 || taken.contains(&x) {
                continue;
            }
            cum += w;
            last = x;
            if cum > target {
                return x;
            }
        }
        last
    }

    /// One tree round after context token `last`: the node tokens drawn as
    /// `kind` says, then the walk; the emitted tokens go to `out`.
    #[allow(clippy::too_many_arguments)]
    pub fn tree_round(
        &self,
        topo: &Topology,
        kind: Children,
        rule: TreeRule,
        last: usize,
        rng: &mut Stream,
        scratch: &mut TreeScratch,
        out: &mut Vec<usize>,
    ) -> Result<()> {
        let TreeScratch {
            tokens,
            taken,
            updates,
            walked,
        } = scratch;
        tokens.clear();
        tokens.resize(topo.len(), 0);
        for r in 0..=topo.len() {
            let s = self.state(if r == 0 { last } else { tokens[r - 1] });
            let (mut taken_mass, q) = (0.0, self.q_row(s));
            taken.clear();
            for (j, &c) in topo.children(r).iter().enumerate() {
                let x = match kind {
                    Children::Iid => draw(self.row(&self.cdf_q, s), rng.random()),
                    Children::Fixed => self.order_q[s * self.v + j],
                    Children::WithoutReplacement => self.draw_without(s, taken, taken_mass, rng.random()),
                };
                taken.push(x);
                taken_mass += q[x];
                tokens[c] = x;
            }
        }
        let tokens = &*tokens;
        let state = |r: usize| self.state(if r == 0 { last } else { tokens[r - 1] });
        let rows = TreeRows {
            p: |r: usize| self.table_row(&self.p, "p_table", state(r)),
            q: |r: usize| self.table_row(&self.q, "q_table", state(r)),
        };
        walk(topo, tokens, kind, rule, &rows, rng, updates, walked)?;
        out.clear();
        out.extend(walked.tokens.iter().map(|&t| t as usize));
        Ok(())
    }
}

/// Scratch space of tree rounds, reused across rounds.
#[derive(Debug, Default)]
pub struct TreeScratch {
    tokens: Vec<usize>,
    taken: Vec<usize>,
    updates: Vec<Update>,
    walked: Walk,
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

/// A tree simulation: the tree's shape, how children are drawn (iid from q,
/// without replacement, or q's top tokens for `Fixed`), the rule (exact or a
/// known tree bug), the start token and the seed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeSim {
    pub topo: Topology,
    pub kind: Children,
    pub rule: TreeRule,
    pub start: usize,
    pub seed: u64,
}

/// A kind of round the engine repeats: a chain of k drafts or a tree.
pub trait Rounds: Sync {
    type Scratch: Default;
    fn start(&self) -> usize;
    fn seed(&self) -> u64;
    /// The most tokens one round emits.
    fn max_tokens(&self) -> usize;
    fn check(&self, chain: &Chain) -> Result<()>;
    /// One round after context `last` into `out` (cleared first).
    fn round(
        &self,
        chain: &Chain,
        last: usize,
        rng: &mut Stream,
        scratch: &mut Self::Scratch,
        out: &mut Vec<usize>,
    ) -> Result<()>;
}

impl Rounds for Sim {
    type Scratch = Vec<usize>;
    fn start(&self) -> usize {
        self.start
    }
    fn seed(&self) -> u64 {
        self.seed
    }
    fn max_tokens(&self) -> usize {
        self.k + 1
    }
    fn check(&self, chain: &Chain) -> Result<()> {
        Sim::check(self, chain)
    }
    fn round(
        &self,
        chain: &Chain,
        last: usize,
        rng: &mut Stream,
        drafts: &mut Vec<usize>,
        out: &mut Vec<usize>,
    ) -> Result<()> {
        chain.round(self.variant, self.k, last, rng, drafts, out)
    }
}

impl Rounds for TreeSim {
    type Scratch = TreeScratch;
    fn start(&self) -> usize {
        self.start
    }
    fn seed(&self) -> u64 {
        self.seed
    }
    fn max_tokens(&self) -> usize {
        self.topo.depth() + 1
    }
    fn check(&self, chain: &Chain) -> Result<()> {
        if self.start >= chain.v {
            return Err(SpecError::Invalid(format!(
                "start = {} is outside the vocabulary [0, {}); expected a token id",
                self.start, chain.v
            )));
        }
        let widest = self.topo.widest();
        let room = match self.kind {
            Children::Iid => usize::MAX,
            Children::Fixed => chain.v,
            Children::WithoutReplacement => chain.support_q.iter().copied().min().unwrap_or(0),
        };
        if widest > room {
            return Err(SpecError::Invalid(format!(
                "a node has {widest} children but only {room} distinct tokens can be drawn for \
                 children={:?}; use fewer children per node",
                self.kind
            )));
        }
        Ok(())
    }
    fn round(
        &self,
        chain: &Chain,
        last: usize,
        rng: &mut Stream,
        scratch: &mut TreeScratch,
        out: &mut Vec<usize>,
    ) -> Result<()> {
        chain.tree_round(&self.topo, self.kind, self.rule, last, rng, scratch, out)
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

/// Joint histogram of the first `num_tokens` tokens emitted after `sim.start()`,
/// over `runs` independent runs; flat, index Σ_j tok_j · V^(m−1−j).
/// Setting `stop` (from another thread) ends the work early with `Interrupted`.
pub fn simulate<R: Rounds>(
    chain: &Chain,
    sim: &R,
    runs: u64,
    num_tokens: usize,
    stop: &AtomicBool,
) -> Result<Vec<i64>> {
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
                let mut rng = stream(row_seed(sim.seed(), b));
                let (mut scratch, mut out) = (R::Scratch::default(), Vec::new());
                for _ in 0..n {
                    let (mut emitted, mut idx, mut last) = (0, 0usize, sim.start());
                    while emitted < num_tokens {
                        go_on(stop)?;
                        sim.round(chain, last, &mut rng, &mut scratch, &mut out)?;
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

/// Counts of rounds by tokens emitted (index 0..=max tokens per round) over
/// `rounds` rounds. Each block of rounds is one continuing generation from
/// `sim.start()`: the next round's context is the last token emitted.
/// `stop` as in `simulate`.
pub fn simulate_round_lengths<R: Rounds>(chain: &Chain, sim: &R, rounds: u64, stop: &AtomicBool) -> Result<Vec<i64>> {
    sim.check(chain)?;
    let width = sim.max_tokens() + 1;
    blocks(rounds)
        .try_fold(
            || vec![0i64; width],
            |mut counts, (b, n)| {
                let mut rng = stream(row_seed(sim.seed(), b));
                let (mut scratch, mut out) = (R::Scratch::default(), Vec::new());
                let mut last = sim.start();
                for _ in 0..n {
                    go_on(stop)?;
                    sim.round(chain, last, &mut rng, &mut scratch, &mut out)?;
                    counts[out.len()] += 1;
                    last = *out.last().unwrap_or(&last);
                }
                Ok(counts)
            },
        )
        .try_reduce(|| vec![0i64; width], add)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::{Children, Topology, TreeRule};
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
        let hist = simulate(&chain, &sim(Variant::Exact, 2, 0, 0), 30_000, 2, &GO).unwrap();
        assert!(tv(&hist, &exact) < 0.015);
        for v in [
            Variant::ResampleFromP,
            Variant::ContinueAfterReject,
            Variant::InvertedRatio,
            Variant::GreedyCheck,
            Variant::NoVerification,
            Variant::OffByOne,
        ] {
            let hist = simulate(&chain, &sim(v, 2, 0, 0), 30_000, 2, &GO).unwrap();
            assert!(tv(&hist, &exact) > 0.015, "{v:?} passed");
        }
    }

    #[test]
    fn results_do_not_depend_on_thread_count() {
        let chain = lab_chain();
        let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let three = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
        let a = one.install(|| simulate_round_lengths(&chain, &sim(Variant::Exact, 3, 0, 9), 50_000, &GO).unwrap());
        let b = three.install(|| simulate_round_lengths(&chain, &sim(Variant::Exact, 3, 0, 9), 50_000, &GO).unwrap());
        assert_eq!(a, b);
        assert_eq!(a.iter().sum::<i64>(), 50_000);
        assert_eq!(a[0], 0);
    }

    #[test]
    fn no_bonus_never_emits_k_plus_one() {
        let chain = lab_chain();
        let counts = simulate_round_lengths(&chain, &sim(Variant::NoBonus, 2, 0, 1), 10_000, &GO).unwrap();
        assert_eq!(counts[3], 0);
        assert!(matches!(
            simulate_round_lengths(&chain, &sim(Variant::NoBonus, 0, 0, 1), 10, &GO),
            Err(SpecError::Invalid(_))
        ));
    }

    #[test]
    fn unknown_variant_and_bad_shapes_are_errors() {
        assert!("exactly".parse::<Variant>().is_err());
        let p = array![[0.5, 0.5]];
        let q = array![[0.5, 0.5], [0.5, 0.5]];
        assert!(Chain::new(p.view(), q.view(), 1e-6, 1e-6).is_err());
        for &(v, name) in Variant::TABLE {
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
        let err = simulate(&chain, &sim(Variant::Exact, 2, 0, 0), u64::MAX, 2, &stop).unwrap_err();
        assert_eq!(err, SpecError::Interrupted);
        let err = simulate_round_lengths(&chain, &sim(Variant::Exact, 2, 0, 0), u64::MAX, &stop).unwrap_err();
        assert_eq!(err, SpecError::Interrupted);
    }

    fn tree_sim(parents: &[i64], kind: Children, rule: TreeRule, seed: u64) -> TreeSim {
        TreeSim {
            topo: Topology::new(parents).unwrap(),
            kind,
            rule,
            start: 0,
            seed,
        }
    }

    fn exact_pairs(chain: &Chain) -> Vec<f64> {
        let p0 = chain.p_row(0).to_vec();
        (0..9).map(|i| p0[i / 3] * chain.p_row(i / 3)[i % 3]).collect()
    }

    #[test]
    fn block_verification_is_exact_and_keeps_more() {
        let chain = lab_chain();
        let hist = simulate(&chain, &sim(Variant::Block, 3, 0, 0), 30_000, 2, &GO).unwrap();
        let t = tv(&hist, &exact_pairs(&chain));
        assert!(t < 0.015, "block TV {t}");
        let mean = |v: Variant| {
            let c = simulate_round_lengths(&chain, &sim(v, 4, 0, 5), 400_000, &GO).unwrap();
            c.iter().enumerate().map(|(n, &k)| n as f64 * k as f64).sum::<f64>() / 400_000.0
        };
        let (token, block) = (mean(Variant::Exact), mean(Variant::Block));
        println!("tokens per round: token-wise {token:.4}, block {block:.4}");
        assert!(block > token);
    }

    const BINARY: [i64; 6] = [-1, -1, 0, 0, 1, 1];

    #[test]
    fn tree_rounds_are_exact_for_every_children_kind() {
        let chain = lab_chain();
        let exact = exact_pairs(&chain);
        for &(kind, _) in Children::TABLE {
            let hist = simulate(&chain, &tree_sim(&BINARY, kind, TreeRule::Exact, 1), 30_000, 2, &GO).unwrap();
            let t = tv(&hist, &exact);
            println!("{kind:?}: TV {t:.4}");
            assert!(t < 0.015, "{kind:?} TV {t}");
        }
    }

    #[test]
    fn tree_bugs_are_caught() {
        let chain = lab_chain();
        let exact = exact_pairs(&chain);
        for (kind, rule) in [
            (Children::Iid, TreeRule::NoUpdate),
            (Children::Iid, TreeRule::OriginalP),
            (Children::Iid, TreeRule::BonusAtRejected),
            (Children::WithoutReplacement, TreeRule::NoUpdate),
            (Children::Fixed, TreeRule::AsIid),
        ] {
            let hist = simulate(&chain, &tree_sim(&BINARY, kind, rule, 2), 30_000, 2, &GO).unwrap();
            let t = tv(&hist, &exact);
            println!("{kind:?} {rule:?}: TV {t:.4}");
            assert!(t > 0.015, "{kind:?} {rule:?} passed with TV {t}");
        }
    }
}
