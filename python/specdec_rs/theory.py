"""Closed-form speculative-decoding math. p = target, q = draft, k = γ, c = cost ratio.

α = Σ_x min(p(x), q(x)) = 1 − TV(p, q)
E[tokens per target pass] = Σ_{i=0..k} α^i = (1 − α^(k+1)) / (1 − α)
speedup = E[tokens] / (k·c + v), v = cost of verifying k+1 tokens / one target step
(v = 1 in the handout: verification is free)
break-even: speculation pays only when c < (E[tokens] − 1) / k   (with v = 1)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from specdec_rs import _checks


def _alpha(alpha: Any) -> float:
    a = float(alpha)
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"alpha = {alpha!r} is not an acceptance rate; expected 0 <= alpha <= 1")
    return a


def _cost(c: Any, name: str = "cost_ratio") -> float:
    x = float(c)
    if not (x >= 0.0 and np.isfinite(x)):
        raise ValueError(
            f"{name} = {c!r}; expected a finite number >= 0 (draft step / target step)"
        )
    return x


def acceptance_rate(p: Any, q: Any) -> float:
    """α = Σ_x min(p(x), q(x)) for two distributions of shape (V,)."""
    pa = _checks.as_numpy(p, "p").astype(np.float64)
    qa = _checks.as_numpy(q, "q").astype(np.float64)
    if pa.shape != qa.shape or pa.ndim != 1:
        raise ValueError(f"p has shape {pa.shape} and q {qa.shape}; expected two equal shapes (V,)")
    return float(np.minimum(pa, qa).sum())


def expected_tokens(alpha: float, k: int) -> float:
    """Σ_{i=0..k} α^i: exactly 1.0 at α = 0 and k + 1 at α = 1 (no 0/0)."""
    a, n = _alpha(alpha), _checks.integer(k, "k")
    total, term = 0.0, 1.0
    for _ in range(n + 1):
        total += term
        term *= a
    return total


def expected_tokens_per_position(alphas: Sequence[float]) -> float:
    """1 + Σ_i Π_{j<=i} α_j: tokens per pass when draft i passes with
    probability α_i given the ones before it passed (non-i.i.d. acceptance)."""
    total, survive = 1.0, 1.0
    for i, a in enumerate(alphas):
        if not 0.0 <= float(a) <= 1.0:
            raise ValueError(f"alphas[{i}] = {a!r} is not an acceptance rate; expected 0 <= a <= 1")
        survive *= float(a)
        total += survive
    return total


def expected_speedup(alpha: float, k: int, cost_ratio: float, *, verify_cost: float = 1.0) -> float:
    """E[tokens] / (k·c + v): wall-clock speedup over target-only decoding.

    verify_cost v: a target pass over k+1 new tokens relative to one token
    (1 when verification is free, as the handout assumes).
    """
    v = _cost(verify_cost, "verify_cost")
    if v <= 0:
        raise ValueError(f"verify_cost = {verify_cost!r}; expected a number > 0")
    return expected_tokens(alpha, k) / (_checks.integer(k, "k") * _cost(cost_ratio) + v)


def best_k(alpha: float, cost_ratio: float, k_max: int = 10) -> int:
    """The γ in 1..k_max with the largest expected speedup, or 0 when none
    beats target-only decoding (speedup <= 1: do not speculate)."""
    k_max = _checks.integer(k_max, "k_max", minimum=1)
    speedups = [expected_speedup(alpha, k, cost_ratio) for k in range(1, k_max + 1)]
    k = int(np.argmax(speedups)) + 1
    return k if speedups[k - 1] > 1.0 else 0


def break_even_cost(alpha: float, k: int) -> float:
    """(E[tokens] − 1) / k: speculation with γ = k pays only for c below this."""
    k = _checks.integer(k, "k", minimum=1)
    return (expected_tokens(alpha, k) - 1.0) / k
