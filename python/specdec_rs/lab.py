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


def _dist(fn: ProbFn, prefix: tuple[int, ...], name: str) -> np.ndarray:
    v = np.asarray(fn(prefix), dtype=np.float64)
    if v.ndim != 1:
        raise ValueError(f"{name}{prefix} returned shape {v.shape}; expected a vector (V,)")
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
    """
    k = _checks.integer(k, "k")
    prefix = tuple(int(t) for t in prefix)
    drafts: list[int] = []
    q_rows: list[np.ndarray] = []
    for _ in range(k):
        qv = _dist(q_fn, prefix + tuple(drafts), "q_fn")
        drafts.append(int(rng.choice(len(qv), p=qv)))
        q_rows.append(qv)
    if backend == "rust":
        p_rows = [_dist(p_fn, prefix + tuple(drafts[:i]), "p_fn") for i in range(k + 1)]
        v = len(p_rows[0])
        q = np.stack(q_rows) if q_rows else np.zeros((0, v))
        seed = int(rng.integers(0, 2**63))
        return [int(t) for t in verify(np.stack(p_rows), q, np.array(drafts, np.int64), seed)]
    if backend != "python":
        raise ValueError(f"backend = {backend!r}; expected 'rust' or 'python'")
    out: list[int] = []
    for i, x in enumerate(drafts):
        pv, qv = _dist(p_fn, prefix + tuple(drafts[:i]), "p_fn"), q_rows[i]
        if rng.random() < min(1.0, pv[x] / qv[x]):
            out.append(x)
            continue
        residual = np.maximum(pv - qv, 0.0)
        mass = residual.sum()
        out.append(int(rng.choice(len(pv), p=residual / mass if mass > 0 else pv)))
        return out
    pv = _dist(p_fn, prefix + tuple(drafts), "p_fn")
    out.append(int(rng.choice(len(pv), p=pv)))
    return out
