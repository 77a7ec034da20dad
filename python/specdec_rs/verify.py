"""The verifier's Python face. p = target, q = draft, k = γ.

One round: accept draft i with probability min(1, p_i(x)/q_i(x)); at the
first rejection emit a sample of norm(max(0, p_i − q_i)) and stop; if all k
drafts pass, emit a bonus token from p_k. The output is distributed exactly as
sampling from p would be. The work runs in Rust with the GIL released.

`method="block"` verifies the chain as a block (Sun et al., ICLR 2025):
exact too, and never fewer tokens per round on average. `verify_tree`
verifies a tree of drafts (several candidates per position).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from specdec_rs import _checks, _core


def _rows(p_rows: Any, q_rows: Any, ndim: int) -> tuple[np.ndarray, np.ndarray, float, float]:
    """(p, q, p_tol, q_tol): the arrays as the Rust core reads them and their
    row-sum tolerances."""
    p, p_tol = _checks.prob_array(p_rows, "p_rows" if ndim == 2 else "p", ndim)
    q_name = "q_rows" if ndim == 2 else "q"
    q = q_rows
    empty_array = type(q) is np.ndarray and q.size == 0 and q.ndim < ndim
    if empty_array or (isinstance(q, list | tuple) and len(q) == 0):  # k = 0, given flat
        q = np.zeros((*p.shape[:-2], 0, p.shape[-1]), dtype=p.dtype)
    q, q_tol = _checks.prob_array(q, q_name, ndim)
    return p, q, p_tol, q_tol


CHECKS = ("read", "full")
Check = Literal["read", "full"]
METHODS = tuple(_core.METHODS)
Method = Literal["token", "block"]
CHILDREN = tuple(_core.CHILDREN)
ChildrenKind = Literal["iid", "without_replacement", "fixed"]


def _full(check: Any) -> bool:
    return _checks.choice(check, "check", CHECKS) == "full"


def verify(
    p_rows: Any,
    q_rows: Any,
    drafts: Any,
    seed: int,
    *,
    check: Check = "read",
    method: Method = "token",
) -> npt.NDArray[np.int64]:
    """One speculative round; returns the 1..k+1 emitted token ids (int64).

    p_rows: (k+1, V) target probabilities; row i conditioned on prefix + drafts[:i].
    q_rows: (k, V) the distributions draft i was actually sampled from
        (one-hot rows for a greedy drafter: acceptance is then p(x), the residual p without x).
    drafts: (k,) integer token ids.  seed: int in [0, 2**64).
    check: "read" (default) checks everything the round reads: the draft ids,
        the 2k gathered entries p_i(x_i), q_i(x_i), and the one or two rows it
        samples from (finite, >= 0, summing to 1): no output is ever drawn from
        an invalid value. "full" also checks every other row, in the same pass
        (row sums within 1e-6 for float64, 1e-3 for float32, 4e-3 for
        bfloat16, 1e-3 + V·2^-25 for float16).
    method: "token" (default) stops at the first rejected draft. "block" is
        block verification: with r_0 = 1, r_i = min(1, r_{i-1} p_{i-1}(x_i) / q_{i-1}(x_i))
        and h_i = Z_i / (Z_i + 1 − r_i), Z_i = Σ_x max(0, r_i p_i(x) − q_i(x)) (h_k = r_k),
        it keeps τ = max{i : η_i < h_i} drafts (η_i uniform), then draws from
        norm(max(0, r_τ p_τ − q_τ)), or from p_k when τ = k. Exact, and
        E[tokens] is never below "token"'s; the same for one-hot q (greedy
        or lookup drafts). It reads up to k − τ rows in full (one pass each).

    float32 and float64 NumPy arrays and CPU torch tensors are read without a
    copy (p and q may differ in precision; each row is checked with its own
    tolerance); float16/bfloat16 rows are widened to float32 (a copy), tensors
    on another device are copied to the host. Same inputs + same seed give the
    same output.

    >>> import numpy as np
    >>> p = np.array([[0.0, 1.0], [0.5, 0.5], [0.5, 0.5]]); q = np.array([[1.0, 0.0], [1.0, 0.0]])
    >>> verify(p, q, [0, 0], seed=1).tolist()   # p(0) = 0: rejected, the residual is token 1
    [1]
    """
    p, q, p_tol, q_tol = _rows(p_rows, q_rows, 2)
    d = _checks.token_array(drafts, "drafts", 1)
    rule = _checks.choice(method, "method", METHODS)
    return _core.verify(p, q, d, _checks.seed(seed), _full(check), p_tol, q_tol, rule)


def verify_greedy(p_argmax: Any, q_rows: Any, drafts: Any) -> npt.NDArray[np.int64]:
    """`verify` for a greedy target (T = 0), whose rows are one-hot: p_argmax
    (k+1,) each row's argmax, q_rows (k, V) and drafts (k,) as in `verify`.

    Returns what `verify` returns for p = the one-hot rows at p_argmax, with
    any seed: draft i is kept while it equals row i's argmax (p_i(x) = 1
    accepts whatever q_i(x) > 0 is; p_i(x) = 0 rejects), the first that
    differs is replaced by its row's argmax (the residual max(0, p_i − q_i)
    is one-hot there), and if all k are kept the bonus is row k's argmax. No
    row of V values is built or read: the round costs k comparisons and the
    q_i(x_i) it tests. ValueError, as `verify`'s, for ids outside [0, V) and
    for a tested draft with q_i(x_i) = 0, which cannot have been drawn from q.

    >>> import numpy as np
    >>> verify_greedy([3, 1, 2], np.eye(4)[[3, 0]], [3, 0]).tolist()  # keeps 3, replaces 0 by 1
    [3, 1]
    """
    a = _checks.token_array(p_argmax, "p_argmax", 1)
    d = _checks.token_array(drafts, "drafts", 1)
    k = len(d)
    if len(a) != k + 1:
        raise ValueError(
            f"p_argmax has {len(a)} entries for {k} drafts; expected k + 1 = {k + 1} "
            "(one row per draft and the bonus row)"
        )
    q = _checks.as_numpy(q_rows, "q_rows")
    if q.ndim != 2 or q.shape[0] != k or q.dtype.kind != "f":
        raise ValueError(
            f"q_rows has shape {q.shape} and dtype {q.dtype}; expected float rows of shape ({k}, V)"
        )
    vocab = q.shape[1]
    for name, ids in (("p_argmax", a), ("drafts", d)):
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
            raise ValueError(f"{name} holds ids outside [0, {vocab}): {ids.tolist()}")
    differs = np.flatnonzero(d != a[:k])
    kept = int(differs[0]) if len(differs) else k
    # the drafts the accept loop reads: the kept ones and the first rejected
    tested = min(kept + 1, k)
    qx = q[np.arange(tested), d[:tested]]
    bad = np.flatnonzero(~(np.isfinite(qx) & (qx > 0)))
    if len(bad):
        i = int(bad[0])
        raise ValueError(
            f"drafts[{i}] = {int(d[i])} has probability {float(qx[i]):.3g} under q row {i}, so it "
            "cannot have been sampled from q; pass as q_rows the distributions the drafts "
            "were drawn from"
        )
    return np.concatenate([d[:kept], a[kept : kept + 1]])


def verify_tree(
    p_rows: Any,
    q_rows: Any,
    tokens: Any,
    parents: Any,
    seed: int,
    *,
    children: ChildrenKind = "iid",
    check: Check = "read",
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Verify a tree of drafts in one round; returns (emitted tokens, accepted nodes).

    tokens, parents: (n,) the draft nodes in topological order; node i carries
        tokens[i] and hangs below parents[i] (-1 = the root, the position
        after the committed text; otherwise an earlier node).
    p_rows: (n+1, V) row 0 the target at the root, row i+1 the target after
        the path ending at node i.
    q_rows: (n+1, V) row 0 the distribution the root's children were drawn
        from, row i+1 the one node i's children were drawn from (rows of
        nodes without children are not read). None for children="fixed".
    children: how each node's children were chosen, which fixes the rule:
      - "iid": drawn independently from the node's q row (duplicates allowed).
        Multi-step speculative sampling (SpecInfer): try the children in
        order, accept x with min(1, p'(x)/q(x)); on a rejection
        p' ← norm(max(0, p' − q)); if all are rejected, emit a sample of p'.
      - "without_replacement": drawn from q without replacement (distinct
        siblings). Recursive rejection sampling (Jeon et al., 2024): child j
        is tested against q_j = q / (1 − q-mass of the siblings before it),
        and p' is updated with q_j.
      - "fixed": deterministic candidates (top-k, lookup matches): draw y from
        the node's p; follow the child whose token is y, otherwise emit y.
        q is not read.
      At a node without children the walk emits a bonus token from its p row.
    check: as in `verify` ("full" checks every p row and the q rows of nodes
        with children).

    Returns the emitted tokens (the accepted path, then one more: 1..depth+1
    tokens, int64) and the indices of the accepted nodes (one fewer), so the
    caller can keep their cache entries. The output law is the target's. Each
    rejection costs one pass over the node's p and q rows; an accepted child
    costs two gathers. Same inputs + same seed = same output.

    >>> import numpy as np
    >>> p = np.array([[0.0, 1.0], [0.5, 0.5], [0.5, 0.5]]); q = np.full((3, 2), 0.5)
    >>> tokens, nodes = verify_tree(p, q, [0, 1], [-1, -1], seed=3)  # two candidates, one position
    >>> int(tokens[0]), nodes.tolist()  # p(0) = 0 rejects node 0; then p' = [0, 1] accepts node 1
    (1, [1])
    """
    kind = _checks.choice(children, "children", CHILDREN)
    p, p_tol = _checks.prob_array(p_rows, "p_rows", 2)
    if q_rows is None:
        if kind != "fixed":
            raise ValueError(
                f"q_rows is None but children = {kind!r} reads q; pass the (n+1, V) rows the "
                'children were drawn from, or children="fixed" for deterministic candidates'
            )
        q, q_tol = np.zeros((0, p.shape[1]), dtype=p.dtype), p_tol
    else:
        q, q_tol = _checks.prob_array(q_rows, "q_rows", 2)
    t = _checks.token_array(tokens, "tokens", 1)
    par = _checks.token_array(parents, "parents", 1)
    return _core.verify_tree(p, q, t, par, _checks.seed(seed), kind, _full(check), p_tol, q_tol)


def verify_batch(
    p: Any,
    q: Any,
    drafts: Any,
    seed: int,
    *,
    check: Check = "read",
    threads: int | None = None,
    method: Method = "token",
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """B independent rounds, spread over threads with the GIL released.

    p: (B, k+1, V), q: (B, k, V), drafts: (B, k). Returns tokens (B, k+1)
    int64 padded with -1 and num_emitted (B,). Row b equals
    ``verify(p[b], q[b], drafts[b], seed=row_seed(seed, b), method=method)``
    whatever the thread count (threads=None uses one per core). `check` and
    `method` as in `verify`.
    """
    pa, qa, p_tol, q_tol = _rows(p, q, 3)
    d = _checks.token_array(drafts, "drafts", 2)
    rule = _checks.choice(method, "method", METHODS)
    return _core.verify_batch(
        pa,
        qa,
        d,
        _checks.seed(seed),
        _full(check),
        p_tol,
        q_tol,
        _checks.threads(threads),
        rule,
    )


def verify_device(p_rows: Any, q_rows: Any, drafts: Any, seed: int) -> npt.NDArray[np.int64]:
    """`verify` for torch tensors wherever they live (e.g. a GPU), moving
    little: p_i(x_i) and q_i(x_i) are gathered on the device and copied to
    the host in one transfer (2k values and the drafts); the Rust accept
    tests decide how many drafts are kept; then only the row(s) the last
    token is drawn from are copied (the bonus row p_k, or p_m and q_m at a
    rejection). Same output as ``verify`` on the same values and seed.

    p_rows: (k+1, V), q_rows: (k, V) floating tensors on one device; drafts (k,).
    """
    import torch

    for name, t in (("p_rows", p_rows), ("q_rows", q_rows)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.ndim != 2:
            raise ValueError(f"{name} must be a 2-D floating torch tensor (any device)")
    k = q_rows.shape[0]
    if p_rows.shape[0] != k + 1 or q_rows.shape[1] != p_rows.shape[1]:
        raise ValueError(
            f"p_rows has shape {tuple(p_rows.shape)} and q_rows {tuple(q_rows.shape)}; "
            "expected (k+1, V) and (k, V)"
        )
    d = drafts if isinstance(drafts, torch.Tensor) else torch.as_tensor(drafts)
    if d.shape != (k,) or d.is_floating_point() or d.dtype == torch.bool:
        raise ValueError(f"drafts must be {k} integer token ids; got {tuple(d.shape)} {d.dtype}")
    return verify_gathered(p_rows, q_rows, d, _checks.seed(seed), [])


def verify_gathered(
    p_rows: Any, q_rows: Any, drafts: Any, seed: int, flags: list[tuple[Any, str]]
) -> npt.NDArray[np.int64]:
    """`verify_device` for checked shapes, with `flags` (0-d bool tensors on
    the device, each with what it means) riding along in the one copy: any
    set flag is a ValueError before a token is emitted."""
    import torch

    k, v = q_rows.shape[0], p_rows.shape[1]
    device = p_rows.device
    d = drafts.to(device, torch.long)
    safe = d.clamp(0, v - 1)  # an out-of-range id must not index the device
    rows = torch.arange(k, device=device)
    parts = [p_rows[rows, safe].double(), q_rows[rows, safe].double(), d.double()]
    parts += [flag.reshape(1).double() for flag, _ in flags]
    summary = torch.cat(parts).cpu().numpy()
    for i, (_, what) in enumerate(flags):
        if summary[3 * k + i]:
            raise ValueError(what)
    ids = summary[2 * k : 3 * k].astype(np.int64)
    bad = np.flatnonzero((ids < 0) | (ids >= v))
    if len(bad):
        raise ValueError(f"drafts[{bad[0]}] = {ids[bad[0]]} is outside the vocabulary [0, {v})")
    m = _core.accept_gathered(summary[:k].copy(), summary[k : 2 * k].copy(), seed)
    p_row = _host_row(p_rows[m])
    q_row = _host_row(q_rows[m]) if m < k else p_row[:0]
    p_tol = _checks.torch_sum_tolerance(p_rows.dtype, v)
    q_tol = _checks.torch_sum_tolerance(q_rows.dtype, v)
    last = _core.finish_round(p_row, q_row, m, k, seed, p_tol, q_tol)
    return np.append(ids[:m], last).astype(np.int64)


def _host_row(t: Any) -> np.ndarray:
    """One row as a float32/float64 host array (half precisions widened)."""
    import torch

    if t.dtype not in (torch.float32, torch.float64):
        t = t.float()
    row: np.ndarray = t.contiguous().cpu().numpy()
    return row


def row_seed(seed: int, index: int) -> int:
    """The seed that row `index` of ``verify_batch(..., seed)`` uses: an int in [0, 2**64)."""
    return _core.row_seed(
        _checks.seed(seed), _checks.integer(index, "index", maximum=_checks.U64_MAX)
    )
