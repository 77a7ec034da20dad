"""The lab API: models as plain functions from a prefix tuple to a NumPy
probability vector. p = target, q = draft, k = γ.

All randomness comes from the `numpy.random.Generator` passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np

from specdec_rs import _checks
from specdec_rs.verify import verify

ProbFn = Callable[[tuple[int, ...]], Sequence[float] | np.ndarray]

MAX_K = 10_000  # drafts per round: k + 1 calls of p_fn and k of q_fn


def _dist(fn: ProbFn, prefix: tuple[int, ...], name: str, vocab: int | None) -> np.ndarray:
    """fn(prefix) checked as a probability vector (float64), of length `vocab` when given."""
    v = _checks.distribution(fn(prefix), f"{name}({prefix})")
    if vocab is not None and len(v) != vocab:
        raise ValueError(
            f"{name}({prefix}) has {len(v)} entries but earlier rows had {vocab}; "
            "p_fn and q_fn must return vectors over the same vocabulary"
        )
    return v


def speculative_step(
    p_fn: ProbFn,
    q_fn: ProbFn,
    prefix: Sequence[int],
    k: int,
    rng: np.random.Generator,
    *,
    backend: Literal["rust", "python"] = "rust",
) -> list[int]:
    """One speculative round after `prefix`; returns 1..k+1 tokens.

    Draft i is sampled from q_fn(prefix + drafts[:i]) and verified against
    p_fn(prefix + drafts[:i]). backend="rust" verifies with `verify` (seeded
    from `rng`); backend="python" is the line-by-line reference of the rule.
    Every row p_fn and q_fn return is checked first (finite, >= 0, sums to 1
    within its precision's tolerance, one vocabulary size): ValueError otherwise.
    """
    p_fn = _checks.function(p_fn, "p_fn")
    q_fn = _checks.function(q_fn, "q_fn")
    k = _checks.integer(k, "k", maximum=MAX_K)
    prefix = tuple(_checks.integers(prefix, "prefix"))
    rng = _checks.rng(rng)
    use_rust = _checks.choice(backend, "backend", ("rust", "python")) == "rust"
    drafts: list[int] = []
    q_rows: list[np.ndarray] = []
    vocab: int | None = None
    for _ in range(k):
        qv = _dist(q_fn, prefix + tuple(drafts), "q_fn", vocab)
        vocab = len(qv)
        drafts.append(_draw(rng, qv))
        q_rows.append(qv)
    p_rows: list[np.ndarray] = []
    for i in range(k + 1):  # row i conditions on drafts[:i]
        p_rows.append(_dist(p_fn, prefix + tuple(drafts[:i]), "p_fn", vocab))
        vocab = len(p_rows[-1])
    if use_rust:
        q = np.stack(q_rows) if q_rows else np.zeros((0, len(p_rows[0])))
        seed = int(rng.integers(0, 2**63))
        return [int(t) for t in verify(np.stack(p_rows), q, np.array(drafts, np.int64), seed)]
    out: list[int] = []
    for i, x in enumerate(drafts):
        pv, qv = p_rows[i], q_rows[i]
        if rng.random() < min(1.0, pv[x] / qv[x]):
            out.append(x)
            continue
        residual = np.maximum(pv - qv, 0.0)
        out.append(_draw(rng, residual if residual.sum() > 0 else pv))
        return out
    out.append(_draw(rng, p_rows[k]))
    return out


def _draw(rng: np.random.Generator, weights: np.ndarray) -> int:
    """An index with probability weights[i] / Σ weights (inverse CDF); never
    one of zero weight."""
    cdf = np.cumsum(weights)
    i = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return min(i, int(np.flatnonzero(weights)[-1]))
