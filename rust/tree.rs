//! Exact verification of a draft tree. p = target, q = draft.
//!
//! A tree has n draft nodes in topological order; node i carries token
//! `tokens[i]` and hangs below `parents[i]` (−1 = the root, the position after
//! the committed text). Row 0 of p is the target at the root, row i + 1 the
//! target after the path ending at node i; row r of q is the distribution the
//! children of row r were drawn from. The walk starts at the root; at a node
//! with children it decides which child (if any) to follow:
//!
//! - `Iid` (children drawn independently from q; duplicates allowed), multi-step
//!   speculative sampling (SpecInfer): try the children in order, accept x
//!   with min(1, p'(x) / q(x)); on a rejection p' ← norm(max(0, p' − q)).
//! - `WithoutReplacement` (drawn from q without replacement), recursive
//!   rejection sampling (Jeon et al., 2024): as `Iid`, with child j tested
//!   against q_j = q / (1 − mass of the j − 1 tokens drawn before it) and p'
//!   updated with that q_j.
//! - `Fixed` (deterministic candidates, q not read): draw y from p; follow
//!   the child whose token is y, otherwise emit y.
//!
//! When every child is rejected the walk emits a sample of the last p'; at a
//! node without children it emits a bonus token from that node's p row. The
//! output law is the target's. p' is never written out: after j rejections
//! p'(x) = f_j(…f_1(p(x))) with f(y) = max(0, y − b·q(x)) / z, evaluated per
//! entry, so each rejection costs one pass over p and q (the pass that finds
//! its z) and an accepted child costs two gathers.
//!
//! Over 400 lines: the tree verifier's topology, walk and known-bug rules, one rule.

use ndarray::{ArrayView1, ArrayView2};
use rand::RngExt;

use crate::error::{Loc, Result, SpecError};
use crate::names::{from_name, Named};
pub use crate::prob::Update;
use crate::prob::{
    check_entry, check_row, later_weights, pick, pick_residual, residual_weights_scaled, sample_row, updated, Prob,
    Residual, Row,
};
use crate::rng::{stream, Stream};
use crate::verify::Checks;

/// How the children of a node were chosen, which fixes the rule that verifies them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Children {
    Iid,
    WithoutReplacement,
    Fixed,
}

impl Named for Children {
    const WHAT: &'static str = "children kind";
    const TABLE: &'static [(Children, &'static str)] = &[
        (Children::Iid, "iid"),
        (Children::WithoutReplacement, "without_replacement"),
        (Children::Fixed, "fixed"),
    ];
}

from_name!(Children);

/// The rule a walk applies: exact, or one of the known tree bugs (the engine
/// reproduces them so that tests can show they are caught).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TreeRule {
    Exact,
    /// Children are tested against the original p (p' never updated); when
    /// all are rejected, one residual norm(max(0, p − q)).
    NoUpdate,
    /// p' is updated for the final sample, but every child is tested against
    /// the original p.
    OriginalP,
    /// When every child is rejected, the token comes from the last rejected
    /// child's p row (the bonus of a rejected node) instead of p'.
    BonusAtRejected,
    /// Fixed or without-replacement children verified with the iid rule.
    AsIid,
}

impl Named for TreeRule {
    const WHAT: &'static str = "tree variant";
    const TABLE: &'static [(TreeRule, &'static str)] = &[
        (TreeRule::Exact, "exact"),
        (TreeRule::NoUpdate, "no_update"),
        (TreeRule::OriginalP, "original_p"),
        (TreeRule::BonusAtRejected, "bonus_at_rejected"),
        (TreeRule::AsIid, "as_iid"),
    ];
}

from_name!(TreeRule);

/// The shape of a tree: each row's children (row 0 the root, row i + 1 node i).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    start: Vec<usize>,
    kids: Vec<usize>,
    parent_row: Vec<usize>,
    depth: usize,
}

impl Topology {
    /// From `parents` (n entries, each −1 or an earlier node's index).
    pub fn new(parents: &[i64]) -> Result<Topology> {
        let n = parents.len();
        let mut parent_row = Vec::with_capacity(n);
        let mut depth_of = vec![0usize; n + 1];
        for (i, &par) in parents.iter().enumerate() {
            if par < -1 || par >= i as i64 {
                return Err(SpecError::Invalid(format!(
                    "parents[{i}] = {par} is not an earlier node; expected -1 (the root) or an \
                     index below {i} (nodes in topological order: every parent before its children)"
                )));
            }
            let r = (par + 1) as usize;
            parent_row.push(r);
            depth_of[i + 1] = depth_of[r] + 1;
        }
        let mut count = vec![0usize; n + 2];
        for &r in &parent_row {
            count[r + 1] += 1;
        }
        for r in 0..=n {
            count[r + 1] += count[r];
        }
        let start = count.clone();
        let mut fill = count;
        let mut kids = vec![0usize; n];
        for (i, &r) in parent_row.iter().enumerate() {
            kids[fill[r]] = i;
            fill[r] += 1;
        }
        Ok(Topology {
            start,
            kids,
            parent_row,
            depth: depth_of.into_iter().max().unwrap_or(0),
        })
    }

    /// Number of draft nodes.
    pub fn len(&self) -> usize {
        self.parent_row.len()
    }

    pub fn is_empty(&self) -> bool {
        self.parent_row.is_empty()
    }

    /// The children (node indices, in order) of row r.
    pub fn children(&self, r: usize) -> &[usize] {
        &self.kids[self.start[r]..self.start[r + 1]]
    }

    /// The row of node i's parent (0 = the root).
    pub fn parent_row(&self, i: usize) -> usize {
        self.parent_row[i]
    }

    /// The longest path's number of nodes; a walk emits at most depth + 1 tokens.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// The most children any row has.
    pub fn widest(&self) -> usize {
        (0..=self.len()).map(|r| self.children(r).len()).max().unwrap_or(0)
    }

    /// Check `tokens` against the tree: ids in [0, V), and distinct siblings
    /// when they were drawn without replacement.
    pub fn check_tokens(&self, tokens: &[usize], v: usize, kind: Children) -> Result<()> {
        if let Some(i) = tokens.iter().position(|&t| t >= v) {
            return Err(SpecError::Invalid(format!(
                "tokens[{i}] = {} is outside the vocabulary [0, {v}); expected token ids below V",
                tokens[i]
            )));
        }
        if kind == Children::WithoutReplacement {
            for r in 0..=self.len() {
                let kids = self.children(r);
                for (a, &i) in kids.iter().enumerate() {
                    if let Some(&j) = kids[..a].iter().find(|&&j| tokens[j] == tokens[i]) {
                        return Err(SpecError::Invalid(format!(
                            "nodes {j} and {i} are siblings with the same token {}, but \
                             children=\"without_replacement\" means siblings were drawn without \
                             replacement; pass distinct siblings, or children=\"iid\"",
                            tokens[i]
                        )));
                    }
                }
            }
        }
        Ok(())
    }
}

/// What a walk emitted: the tokens (accepted path, then one more) and the
/// accepted nodes (one fewer).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Walk {
    pub tokens: Vec<i64>,
    pub nodes: Vec<usize>,
}

/// The mass z of max(0, p' − b·q) after a rejection (one pass), or the
/// token drawn from it with uniform `u` when `u` is given.
fn reject<P: Prob, Q: Prob>(
    p: Row<'_, P>,
    q: Row<'_, Q>,
    updates: &[Update],
    b: f64,
    u: Option<f64>,
) -> Result<(f64, Option<usize>)> {
    if updates.is_empty() {
        let r = residual_weights_scaled(p, q, 1.0, b)?;
        let z = match &r {
            Residual::Mass { w, .. } => w.total,
            Residual::FromP(_) => 0.0,
        };
        return Ok((z, u.map(|u| pick_residual(p.data, q.data, &r, u))));
    }
    let (w, fallback) = later_weights(p.data, q.data, updates, b);
    let Some(u) = u else { return Ok((w.total, None)) };
    let (pd, qd) = (p.data, q.data);
    if w.total > 0.0 {
        let at = |j: usize| (updated(pd[j].to_f64(), qd[j].to_f64(), updates) - b * qd[j].to_f64()).max(0.0);
        return Ok((w.total, Some(pick(&w.sums, pd.len(), u * w.total, at))));
    }
    if fallback.total <= 0.0 {
        return Err(SpecError::ZeroMass { loc: p.loc });
    }
    // Rounding left no residual mass: p' ≤ b·q everywhere, so p' = b·q; draw from p'.
    let at = |j: usize| updated(pd[j].to_f64(), qd[j].to_f64(), updates);
    Ok((0.0, Some(pick(&fallback.sums, pd.len(), u * fallback.total, at))))
}

fn zero_q(node: usize, token: usize, row: usize) -> SpecError {
    SpecError::Invalid(format!(
        "tokens[{node}] = {token} has probability 0 under q_rows row {row} (the distribution \
         its parent's children were drawn from), so it cannot have been drawn from it; pass the \
         q rows the children were drawn from (one-hot rows for a greedy drafter), or \
         children=\"fixed\" for deterministic candidates"
    ))
}

/// The rows a walk reads: `p(r)` for r in 0..=n and `q(r)` for the rows with children.
pub struct TreeRows<PF, QF> {
    pub p: PF,
    pub q: QF,
}

/// Walk the tree from the root; appends to `out` (cleared first). `updates` is scratch.
#[allow(clippy::too_many_arguments)]
pub fn walk<'a, P: Prob, Q: Prob, PF, QF>(
    topo: &Topology,
    tokens: &[usize],
    kind: Children,
    rule: TreeRule,
    rows: &TreeRows<PF, QF>,
    rng: &mut Stream,
    updates: &mut Vec<Update>,
    out: &mut Walk,
) -> Result<()>
where
    PF: Fn(usize) -> Row<'a, P>,
    QF: Fn(usize) -> Row<'a, Q>,
{
    out.tokens.clear();
    out.nodes.clear();
    let mut r = 0;
    loop {
        let kids = topo.children(r);
        let p = (rows.p)(r);
        if kids.is_empty() {
            out.tokens.push(sample_row(p, rng.random())? as i64);
            return Ok(());
        }
        let kind = if rule == TreeRule::AsIid { Children::Iid } else { kind };
        if kind == Children::Fixed {
            let y = sample_row(p, rng.random())?;
            out.tokens.push(y as i64);
            match kids.iter().find(|&&c| tokens[c] == y) {
                Some(&c) => {
                    out.nodes.push(c);
                    r = c + 1;
                    continue;
                }
                None => return Ok(()),
            }
        }
        let q = (rows.q)(r);
        updates.clear();
        let mut drawn = 0.0; // q mass of the children tried (without replacement)
        let mut next = None;
        for (j, &c) in kids.iter().enumerate() {
            let x = tokens[c];
            let (px, qx) = (p.data[x].to_f64(), q.data[x].to_f64());
            check_entry(px, p.loc, x)?;
            check_entry(qx, q.loc, x)?;
            if qx <= 0.0 {
                return Err(zero_q(c, x, r));
            }
            let b = if kind == Children::WithoutReplacement {
                if 1.0 - drawn <= 0.0 {
                    return Err(SpecError::Invalid(format!(
                        "the siblings before node {c} already hold all of q_rows row {r}'s \
                         mass, so node {c} cannot have been drawn without replacement"
                    )));
                }
                1.0 / (1.0 - drawn)
            } else {
                1.0
            };
            let target = match rule {
                TreeRule::NoUpdate | TreeRule::OriginalP => px,
                _ => updated(px, qx, updates),
            };
            let u: f64 = rng.random();
            if u * b * qx < target {
                next = Some(c);
                break;
            }
            drawn += qx;
            if j + 1 < kids.len() {
                if rule != TreeRule::NoUpdate {
                    let (z, _) = reject(p, q, updates, b, None)?;
                    if z > 0.0 {
                        updates.push(Update { b, z });
                    }
                }
                continue;
            }
            let u: f64 = rng.random();
            let y = match rule {
                TreeRule::BonusAtRejected => Some(sample_row((rows.p)(c + 1), u)?),
                TreeRule::NoUpdate => reject(p, q, &[], b, Some(u))?.1,
                _ => reject(p, q, updates, b, Some(u))?.1,
            };
            let y = y.ok_or_else(|| SpecError::Invalid("internal error: a rejection drew no token".into()))?;
            out.tokens.push(y as i64);
            return Ok(());
        }
        let Some(c) = next else {
            return Err(SpecError::Invalid("internal error: the walk lost its node".into()));
        };
        out.tokens.push(tokens[c] as i64);
        out.nodes.push(c);
        r = c + 1;
    }
}

/// Where row r of the p or q array sits, for error messages.
pub fn row_loc(array: &'static str, r: usize) -> Loc {
    Loc::new(array, None, r)
}

/// The rows of a C-contiguous (rows, V) array.
fn row_of<'a, T: Prob>(data: &'a [T], v: usize, array: &'static str, tol: f64) -> impl Fn(usize) -> Row<'a, T> {
    move |r| Row::new(&data[r * v..(r + 1) * v], row_loc(array, r), tol)
}

/// Verify one draft tree; see the module docs. p: (n + 1, V), q: (n + 1, V)
/// (or (0, V) for `Fixed`, which does not read q), tokens and parents: (n,).
/// Same inputs + same seed = same output.
pub fn verify_tree<P: Prob, Q: Prob>(
    p: ArrayView2<'_, P>,
    q: ArrayView2<'_, Q>,
    tokens: ArrayView1<'_, i64>,
    parents: ArrayView1<'_, i64>,
    seed: u64,
    kind: Children,
    checks: Checks,
) -> Result<Walk> {
    let n = tokens.len();
    let (rows, v) = p.dim();
    if parents.len() != n {
        return Err(SpecError::Shape(format!(
            "tokens has {n} entries but parents has {}; expected one parent per node",
            parents.len()
        )));
    }
    if rows != n + 1 || v == 0 {
        return Err(SpecError::Shape(format!(
            "p_rows has shape ({rows}, {v}); expected (n + 1, V) = ({}, V >= 1): the target at \
             the root, then after each node's path",
            n + 1
        )));
    }
    let q_needed = kind != Children::Fixed;
    if (q.nrows() != n + 1 && (q_needed || q.nrows() != 0)) || (q.nrows() > 0 && q.ncols() != v) {
        return Err(SpecError::Shape(format!(
            "q_rows has shape {:?}; expected (n + 1, V) = ({}, {v}): row r the distribution \
             the children of row r were drawn from{}",
            q.dim(),
            n + 1,
            if q_needed {
                ""
            } else {
                " (or (0, V): children=\"fixed\" does not read q)"
            }
        )));
    }
    if let Some(i) = tokens.iter().position(|&t| t < 0) {
        return Err(SpecError::Invalid(format!(
            "tokens[{i}] = {} is negative; expected token ids in [0, {v})",
            tokens[i]
        )));
    }
    let ids: Vec<usize> = tokens.iter().map(|&t| t as usize).collect();
    let parents: Vec<i64> = parents.iter().copied().collect();
    let topo = Topology::new(&parents)?;
    topo.check_tokens(&ids, v, kind)?;
    let not_contiguous =
        |name: &str| SpecError::Invalid(format!("{name} is not C-contiguous; pass np.ascontiguousarray({name})"));
    let p_data = p.as_slice().ok_or_else(|| not_contiguous("p_rows"))?;
    let q_data = q.as_slice().ok_or_else(|| not_contiguous("q_rows"))?;
    let tree_rows = TreeRows {
        p: row_of(p_data, v, "p_rows", checks.p_tol),
        q: row_of(q_data, v, "q_rows", checks.q_tol),
    };
    if checks.full {
        for r in 0..=n {
            check_row((tree_rows.p)(r))?;
        }
        if q_needed {
            for r in (0..=n).filter(|&r| !topo.children(r).is_empty()) {
                check_row((tree_rows.q)(r))?;
            }
        }
    }
    let mut out = Walk::default();
    walk(
        &topo,
        &ids,
        kind,
        TreeRule::Exact,
        &tree_rows,
        &mut stream(seed),
        &mut Vec::new(),
        &mut out,
    )?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn walk_once(
        parents: &[i64],
        tokens: &[usize],
        p: &[Vec<f64>],
        q: &[Vec<f64>],
        kind: Children,
        seed: u64,
    ) -> Result<Walk> {
        let topo = Topology::new(parents)?;
        let rows = TreeRows {
            p: |r: usize| Row::new(&p[r][..], row_loc("p_rows", r), 1e-9),
            q: |r: usize| Row::new(&q[r][..], row_loc("q_rows", r), 1e-9),
        };
        let mut out = Walk::default();
        walk(
            &topo,
            tokens,
            kind,
            TreeRule::Exact,
            &rows,
            &mut stream(seed),
            &mut Vec::new(),
            &mut out,
        )?;
        Ok(out)
    }

    #[test]
    fn topology_lists_children_in_order() {
        let t = Topology::new(&[-1, -1, 0, 0, 1, 3]).unwrap();
        assert_eq!(t.children(0), &[0, 1]);
        assert_eq!(t.children(1), &[2, 3]);
        assert_eq!(t.children(2), &[4]);
        assert_eq!(t.children(4), &[5]);
        assert!(t.children(6).is_empty());
        assert_eq!(t.depth(), 3);
        assert_eq!(t.widest(), 2);
        assert!(Topology::new(&[0]).is_err());
        assert!(Topology::new(&[-1, 5]).is_err());
        assert!(Topology::new(&[-2]).is_err());
    }

    #[test]
    fn a_chain_with_p_equal_q_accepts_every_node() {
        let p = vec![vec![0.5, 0.5]; 4];
        for kind in [Children::Iid, Children::WithoutReplacement] {
            for seed in 0..50 {
                let w = walk_once(&[-1, 0, 1], &[1, 0, 1], &p, &p, kind, seed).unwrap();
                assert_eq!(w.nodes, vec![0, 1, 2]);
                assert_eq!(&w.tokens[..3], &[1, 0, 1]);
            }
        }
    }

    #[test]
    fn the_second_child_is_tried_after_the_first_is_rejected() {
        // p is certain of token 1; the first child (token 0) is always
        // rejected; the residual puts all mass on 1, so child 2 (token 1) is
        // accepted with probability p'(1)/q(1) = 1.
        let p = vec![vec![0.0, 1.0, 0.0], vec![1.0, 0.0, 0.0], vec![0.0, 0.0, 1.0]];
        let q = vec![vec![0.5, 0.5, 0.0], vec![1.0, 0.0, 0.0], vec![1.0, 0.0, 0.0]];
        for kind in [Children::Iid, Children::WithoutReplacement, Children::Fixed] {
            for seed in 0..50 {
                let w = walk_once(&[-1, -1], &[0, 1], &p, &q, kind, seed).unwrap();
                assert_eq!(w.nodes, vec![1], "{kind:?}");
                assert_eq!(w.tokens, vec![1, 2]);
            }
        }
    }

    #[test]
    fn bad_trees_are_errors() {
        let p = vec![vec![0.5, 0.5]; 3];
        let q = vec![vec![1.0, 0.0]; 3];
        let err = walk_once(&[-1, -1], &[1, 0], &p, &q, Children::Iid, 0).unwrap_err();
        assert!(err.to_string().contains("probability 0 under q_rows row 0"));
        let topo = Topology::new(&[-1, -1]).unwrap();
        let err = topo.check_tokens(&[1, 1], 2, Children::WithoutReplacement).unwrap_err();
        assert!(err.to_string().contains("same token 1"));
        assert!(topo.check_tokens(&[1, 1], 2, Children::Iid).is_ok());
        assert!(topo.check_tokens(&[1, 2], 2, Children::Iid).is_err());
    }
}
