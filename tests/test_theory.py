"""The closed forms of the handout, and their agreement with simulation."""

from __future__ import annotations

import numpy as np
import pytest
import specdec_rs as sd
from conftest import P_IID, P_TABLE, Q_IID, Q_TABLE

# The handout's table at c = 0.05: γ -> (tokens, speedup) for α = 0.6 and α = 0.8.
HANDOUT_TABLE = {
    1: ((1.60, 1.52), (1.80, 1.71)),
    2: ((1.96, 1.78), (2.44, 2.22)),
    3: ((2.18, 1.89), (2.95, 2.57)),
    4: ((2.31, 1.92), (3.36, 2.80)),
    5: ((2.38, 1.91), (3.69, 2.95)),
    6: ((2.43, 1.87), (3.95, 3.04)),
    7: ((2.46, 1.82), (4.16, 3.08)),
    8: ((2.47, 1.77), (4.33, 3.09)),
    9: ((2.48, 1.71), (4.46, 3.08)),
    10: ((2.49, 1.66), (4.57, 3.05)),
}


def test_formulas() -> None:
    assert sd.expected_tokens(0.0, 5) == 1.0
    assert sd.expected_tokens(1.0, 5) == 6.0
    assert sd.expected_tokens(0.8, 4) == pytest.approx(3.3616, abs=1e-12)
    assert sd.expected_speedup(0.8, 4, 0.05) == pytest.approx(2.80, abs=0.005)
    for k, ((t6, s6), (t8, s8)) in HANDOUT_TABLE.items():
        assert sd.expected_tokens(0.6, k) == pytest.approx(t6, abs=0.005)
        assert sd.expected_speedup(0.6, k, 0.05) == pytest.approx(s6, abs=0.005)
        assert sd.expected_tokens(0.8, k) == pytest.approx(t8, abs=0.005)
        assert sd.expected_speedup(0.8, k, 0.05) == pytest.approx(s8, abs=0.005)
    # c = 0.32: best γ = 3 at 1.51x for α = 0.8, γ = 1 at 1.21x for α = 0.6
    assert sd.best_k(0.8, 0.32) == 3
    assert sd.expected_speedup(0.8, 3, 0.32) == pytest.approx(1.51, abs=0.005)
    assert sd.best_k(0.6, 0.32) == 1
    assert sd.expected_speedup(0.6, 1, 0.32) == pytest.approx(1.21, abs=0.005)


def test_best_k_of_the_c_005_table() -> None:
    # α = 0.6 peaks at γ = 4 (1.92x); α = 0.8 at γ = 8 (3.09x)
    assert sd.best_k(0.6, 0.05) == 4
    assert sd.best_k(0.8, 0.05) == 8


def test_break_even_cost() -> None:
    # handout: at γ = 4, c < 0.59 for α = 0.8 and c < 0.33 for α = 0.6
    assert sd.break_even_cost(0.8, 4) == pytest.approx(0.59, abs=0.005)
    assert sd.break_even_cost(0.6, 4) == pytest.approx(0.33, abs=0.005)
    c = sd.break_even_cost(0.7, 3)
    assert sd.expected_speedup(0.7, 3, c) == pytest.approx(1.0)
    assert sd.expected_speedup(0.7, 3, c * 1.01) < 1.0 < sd.expected_speedup(0.7, 3, c * 0.99)


def test_best_k_is_zero_when_speculation_never_pays() -> None:
    assert sd.best_k(0.3, 0.9) == 0
    assert sd.best_k(0.0, 0.0) == 0  # nothing accepted: speedup exactly 1


def test_acceptance_rate_is_one_minus_tv() -> None:
    assert sd.acceptance_rate(P_IID, Q_IID) == pytest.approx(0.8)
    for s, alpha in enumerate([0.6, 0.5, 0.5]):
        assert sd.acceptance_rate(P_TABLE[s], Q_TABLE[s]) == pytest.approx(alpha)
        tv = np.abs(P_TABLE[s] - Q_TABLE[s]).sum() / 2
        assert sd.acceptance_rate(P_TABLE[s], Q_TABLE[s]) == pytest.approx(1 - tv)


def test_per_position_formula_reduces_to_iid() -> None:
    assert sd.expected_tokens_per_position([0.8] * 4) == pytest.approx(sd.expected_tokens(0.8, 4))
    assert sd.expected_tokens_per_position([]) == 1.0
    assert sd.expected_tokens_per_position([1.0, 0.5, 0.0]) == 2.5


@pytest.mark.parametrize("k", [1, 2, 4, 6])
@pytest.mark.parametrize("alpha_q", [(0.8, Q_IID), (0.0, np.array([0.0, 0.0, 1.0]))])
def test_iid_round_length_matches_theory(k: int, alpha_q: tuple[float, np.ndarray]) -> None:
    """Mean round length for i.i.d. acceptance, 10^6 rounds: within 6 standard errors
    (false-alarm rate 2e-9; the round length is bounded by k + 1)."""
    alpha, q = alpha_q
    p = P_IID if alpha > 0 else np.array([0.5, 0.5, 0.0])
    assert sd.acceptance_rate(p, q) == pytest.approx(alpha)
    counts = sd.simulate_round_lengths(p[None], q[None], k=k, rounds=10**6, seed=k)
    lengths = np.arange(k + 2)
    mean = (counts * lengths).sum() / counts.sum()
    sd_len = np.sqrt((counts * (lengths - mean) ** 2).sum() / counts.sum())
    assert abs(mean - sd.expected_tokens(alpha, k)) < 6 * max(sd_len, 1e-3) / 1e3
    # and the whole distribution: P(len = n) = α^(n−1)(1 − α), P(len = k+1) = α^k
    exact = np.array([0.0] + [alpha ** (n - 1) * (1 - alpha) for n in range(1, k + 1)] + [alpha**k])
    assert np.abs(counts / 1e6 - exact).max() < 6 * 0.5 / 1e3


@pytest.mark.parametrize(
    "call",
    [
        lambda: sd.expected_tokens(1.2, 3),
        lambda: sd.expected_tokens(-0.1, 3),
        lambda: sd.expected_tokens(0.5, -1),
        lambda: sd.expected_tokens(0.5, 2.5),
        lambda: sd.expected_speedup(0.5, 2, -0.1),
        lambda: sd.expected_speedup(0.5, 2, float("nan")),
        lambda: sd.expected_speedup(0.5, 2, 0.1, verify_cost=0.0),
        lambda: sd.best_k(0.5, 0.1, 0),
        lambda: sd.break_even_cost(0.5, 0),
        lambda: sd.acceptance_rate([0.5, 0.5], [1.0]),
        lambda: sd.expected_tokens_per_position([0.5, 1.5]),
    ],
)
def test_bad_arguments_raise_value_error(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError):
        call()
