"""Closed-form speculative-decoding math. p = target, q = draft, k = γ, c = cost ratio.

α = Σ_x min(p(x), q(x)) = 1 − TV(p, q)
E[tokens per target pass] = Σ_{i=0..k} α^i = (1 − α^(k+1)) / (1 − α)
speedup = E[tokens] / (k·c + v), v = cost of verifying k+1 tokens / one target step
(v = 1 in the handout: verification is free)
break-even: speculation pays only when c < (E[tokens] − 1) / k   (with v = 1)

Every function is O(1) in k (best_k is O(log k_max)). k is capped at 2**53,
the largest integer a float holds exactly, so that k + 1 and k·c are exact.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specdec_rs import _checks

MAX_K = 2**53


def _alpha(alpha: Any) -> float:
    return _checks.real(alpha, "alpha", minimum=0.0, maximum=1.0, hint=" (an acceptance rate)")


def _k(k: Any, minimum: int = 0) -> int:
    return _checks.integer(k, "k", minimum=minimum, maximum=MAX_K)


def _cost(c: Any, name: str = "cost_ratio") -> float:
    return _checks.real(c, name, minimum=0.0, hint=" (draft step / target step)")


def acceptance_rate(p: Any, q: Any) -> float:
    """α = Σ_x min(p(x), q(x)) for two distributions of shape (V,).

    Each must be a probability vector (finite, >= 0, summing to 1 within its
    precision's tolerance); anything else is a ValueError, never a number.
    """
    pa = _checks.distribution(p, "p")
    qa = _checks.distribution(q, "q")
    if pa.shape != qa.shape:
        raise ValueError(f"p has shape {pa.shape} and q {qa.shape}; expected two equal shapes (V,)")
    return float(min(1.0, np.minimum(pa, qa).sum()))


def expected_tokens(alpha: float, k: int) -> float:
    """Σ_{i=0..k} α^i = (1 − α^(k+1)) / (1 − α): exactly 1.0 at α = 0 and k + 1
    at α = 1 (no 0/0); computed as −expm1((k+1)·ln α) / (1 − α), accurate near α = 1."""
    a, n = _alpha(alpha), _k(k)
    if a == 0.0 or n == 0:
        return 1.0
    if a == 1.0:
        return float(n + 1)
    value = -math.expm1((n + 1) * math.log(a)) / (1.0 - a)
    return min(float(n + 1), max(1.0, value))  # 1 <= E <= k + 1, also after rounding


def expected_tokens_per_position(alphas: Sequence[float]) -> float:
    """1 + Σ_i Π_{j<=i} α_j: tokens per pass when draft i passes with
    probability α_i given the ones before it passed (non-i.i.d. acceptance)."""
    total, survive = 1.0, 1.0
    for a in _checks.reals(alphas, "alphas", minimum=0.0, maximum=1.0):
        survive *= a
        total += survive
    return total


def expected_speedup(alpha: float, k: int, cost_ratio: float, *, verify_cost: float = 1.0) -> float:
    """E[tokens] / (k·c + v): wall-clock speedup over target-only decoding.

    verify_cost v: a target pass over k+1 new tokens relative to one token
    (1 when verification is free, as the handout assumes).
    """
    v = _checks.real(verify_cost, "verify_cost", above=0.0)
    speedup = expected_tokens(alpha, k) / (_k(k) * _cost(cost_ratio) + v)
    if not math.isfinite(speedup):
        raise ValueError(
            f"the speedup overflows (cost_ratio = {cost_ratio!r}, verify_cost = {verify_cost!r}); "
            "these are ratios of step times, near 0.01..1 and 1..3 in practice"
        )
    return speedup


def _grows(a: float, c: float, k: int) -> bool:
    """speedup(k + 1) > speedup(k) (with v = 1).

    With s = α^(k+1), speedup(k+1) > speedup(k) ⇔ s·((1 − α)(kc + 1) + c) > c.
    The left side falls strictly with k, so the γ where growth stops is unique
    and best_k can bisect for it. Compared in logs: no underflow at large k.
    """
    if c == 0.0:
        return a > 0.0
    if a == 1.0:
        return c < 1.0
    if a == 0.0:
        return False
    return (k + 1) * math.log(a) + math.log((1.0 - a) * (k * c + 1.0) + c) > math.log(c)


def best_k(alpha: float, cost_ratio: float, k_max: int = 10) -> int:
    """The γ in 1..k_max with the largest expected speedup, or 0 when none
    beats target-only decoding (speedup <= 1: do not speculate). O(log k_max):
    the speedup rises then falls in γ (see `_grows`), so a bisection finds it."""
    a, c = _alpha(alpha), _cost(cost_ratio)
    k_max = _checks.integer(k_max, "k_max", minimum=1, maximum=MAX_K)
    lo, hi = 1, k_max  # the first k in [lo, hi] where the speedup stops growing
    while lo < hi:
        mid = (lo + hi) // 2
        if _grows(a, c, mid):
            lo = mid + 1
        else:
            hi = mid
    return lo if expected_speedup(a, lo, c) > 1.0 else 0


def break_even_cost(alpha: float, k: int) -> float:
    """(E[tokens] − 1) / k: speculation with γ = k pays only for c below this."""
    k = _k(k, minimum=1)
    return (expected_tokens(alpha, k) - 1.0) / k


@dataclass(frozen=True)
class TheoryRow:
    """One γ: expected tokens per pass and speedup, one entry per α."""

    k: int
    tokens: list[float]
    speedup: list[float]


@dataclass(frozen=True)
class TheoryTable:
    """The handout's table for several α at one cost ratio, with the best γ per
    α (0: speculation does not pay) and the break-even c at that γ (at γ = 1
    when none pays)."""

    alphas: list[float]
    cost_ratio: float
    rows: list[TheoryRow]
    best_k: list[int]
    break_even_cost: list[float]


TABLE_MAX_ROWS = 1000  # one row per γ


def table(alphas: Sequence[float], cost_ratio: float, k_max: int = 10) -> TheoryTable:
    """Tokens per pass and speedup for γ = 1..k_max (at most 1000 rows)."""
    a = [_alpha(x) for x in _checks.reals(alphas, "alphas")]
    if not a:
        raise ValueError("alphas: give at least one acceptance rate")
    c = _cost(cost_ratio)
    k_max = _checks.integer(k_max, "k_max", minimum=1, maximum=TABLE_MAX_ROWS)
    rows = [
        TheoryRow(k, [expected_tokens(x, k) for x in a], [expected_speedup(x, k, c) for x in a])
        for k in range(1, k_max + 1)
    ]
    best = [best_k(x, c, k_max) for x in a]
    even = [break_even_cost(x, max(b, 1)) for x, b in zip(a, best, strict=True)]
    return TheoryTable(a, c, rows, best, even)


# ------------------------------------------------------------------ trees


def _parents(parents: Any) -> list[int]:
    out = _checks.integers(parents, "parents", minimum=-1)
    for i, par in enumerate(out):
        if par >= i:
            raise ValueError(
                f"parents[{i}] = {par} is not an earlier node; expected -1 (the root) or an "
                f"index below {i} (nodes in topological order)"
            )
    return out


def expected_tokens_tree(parents: Any, sibling_accept: Sequence[float]) -> float:
    """E[tokens per target pass] of a draft tree (the shape of `verify_tree`)
    when the j-th child of any reached node is accepted with probability
    a_j given that its j earlier siblings were rejected (a prefix-independent
    pair, so a_j does not depend on the node; see `sibling_acceptance`):

        E = 1 + Σ_nodes P(node accepted),
        P(node) = P(parent) · Π_{i<j} (1 − a_i) · a_j   (P(root) = 1).

    A chain of k nodes with a_0 = α gives `expected_tokens(α, k)`.
    """
    par = _parents(parents)
    a = _checks.reals(sibling_accept, "sibling_accept", minimum=0.0, maximum=1.0)
    reach = [1.0] * (len(par) + 1)  # by row: 0 the root, i + 1 node i
    tried: dict[int, int] = {}
    rejected_before: dict[int, float] = {}
    total = 1.0
    for i, p_row in enumerate(r + 1 for r in par):
        j = tried.get(p_row, 0)
        if j >= len(a):
            raise ValueError(
                f"node {i} is child number {j + 1} of its parent but sibling_accept has "
                f"{len(a)} entries; give one per sibling rank"
            )
        before = rejected_before.get(p_row, 1.0)
        reach[i + 1] = reach[p_row] * before * a[j]
        rejected_before[p_row] = before * (1.0 - a[j])
        tried[p_row] = j + 1
        total += reach[i + 1]
    return total


def sibling_acceptance(p: Any, q: Any, width: int, *, children: str = "iid") -> list[float]:
    """a_j, j < width: the probability that the j-th child of a node is
    accepted given its earlier siblings were rejected, for target p and
    draft q of shape (V,) under the rule of `verify_tree`:

    - "iid": a_j = Σ min(p_j, q), p_0 = p, p_{j+1} = norm(max(0, p_j − q)).
    - "without_replacement": exact expectation over the siblings drawn before
      (enumerated: V^width paths, for small V), with q renormalized over the
      tokens not yet drawn.
    - "fixed" (children = q's top `width` tokens): a_j = p(c_j) / (1 − Σ_{i<j} p(c_i)).
    """
    pa = _checks.distribution(p, "p").astype(np.float64)
    qa = _checks.distribution(q, "q").astype(np.float64)
    w = _checks.integer(width, "width", minimum=1, maximum=64)
    kind = _checks.choice(children, "children", ("iid", "without_replacement", "fixed"))
    if kind == "fixed":
        top = np.argsort(-qa, kind="stable")[:w]
        out, left = [], 1.0
        for c in top:
            out.append(float(pa[c] / left) if left > 0 else 0.0)
            left -= pa[c]
        return out
    if kind == "iid":
        out, cur = [], pa
        for _ in range(w):
            out.append(float(np.minimum(cur, qa).sum()))
            res = np.maximum(cur - qa, 0.0)
            cur = res / res.sum() if res.sum() > 0 else cur
        return out
    reach, accept = np.zeros(w), np.zeros(w)

    def visit(j: int, cur: np.ndarray, drawn: list[int], prob: float) -> None:
        if j == w or prob == 0.0:
            return
        qj = qa.copy()
        qj[drawn] = 0.0
        if qj.sum() <= 0:
            return
        qj /= qj.sum()
        reach[j] += prob
        for x in np.flatnonzero(qj > 0):
            accept[j] += prob * qj[x] * min(1.0, cur[x] / qj[x])
            reject = prob * qj[x] * max(0.0, 1.0 - cur[x] / qj[x])
            if reject > 0:
                res = np.maximum(cur - qj, 0.0)
                visit(j + 1, res / res.sum(), [*drawn, int(x)], reject)

    visit(0, pa, [], 1.0)
    return [float(accept[j] / reach[j]) if reach[j] > 0 else 0.0 for j in range(w)]
