"""The Monte Carlo engine: shapes, determinism over threads, the chain's joint
law, and agreement with the NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest
import specdec_rs as sd
from conftest import P_IID, P_TABLE, Q_IID, Q_TABLE, chi2_pvalue
from scipy import stats
from specdec_rs.reference import simulate_round_lengths_numpy

SIGNIFICANCE = 1e-6


def test_histogram_shape_and_total() -> None:
    h = sd.simulate(P_TABLE, Q_TABLE, k=3, runs=10_001, num_tokens=3, start=2, seed=5)
    assert h.shape == (3, 3, 3) and h.dtype == np.int64 and h.sum() == 10_001
    c = sd.simulate_round_lengths(P_TABLE, Q_TABLE, k=3, rounds=10_001, seed=5)
    assert c.shape == (5,) and c[0] == 0 and c.sum() == 10_001


@pytest.mark.parametrize("variant", sd.VARIANTS)
def test_same_seed_same_counts_for_any_thread_count(variant: str) -> None:
    kwargs = {"k": 2, "variant": variant, "seed": 42}
    hists = [
        sd.simulate(P_TABLE, Q_TABLE, runs=50_000, num_tokens=3, start=0, threads=t, **kwargs)
        for t in (1, 2, 4, None)
    ]
    lengths = [
        sd.simulate_round_lengths(P_TABLE, Q_TABLE, rounds=50_000, threads=t, **kwargs)
        for t in (1, 2, 4, None)
    ]
    for h in hists[1:]:
        assert np.array_equal(h, hists[0])
    for c in lengths[1:]:
        assert np.array_equal(c, lengths[0])
    other = sd.simulate(
        P_TABLE, Q_TABLE, runs=50_000, num_tokens=3, start=0, k=2, variant=variant, seed=43
    )
    assert variant == "greedy_check" or not np.array_equal(other, hists[0])


def test_three_token_joint_law_is_the_chain() -> None:
    """First three tokens after token 1, k = 3, 10^6 runs: chi-square on 27 cells."""
    h = sd.simulate(P_TABLE, Q_TABLE, k=3, runs=10**6, num_tokens=3, start=1, seed=3)
    exact = P_TABLE[1][:, None, None] * P_TABLE[:, :, None] * P_TABLE[None, :, :]
    assert chi2_pvalue(h.ravel(), exact.ravel()) > SIGNIFICANCE


def test_engine_agrees_with_the_numpy_reference() -> None:
    """Round-length counts on the chain, same block structure (chains of 4096
    rounds from token 0): two-sample chi-square at significance 1e-6."""
    rounds = 4096 * 64
    rust = sd.simulate_round_lengths(P_TABLE, Q_TABLE, k=3, rounds=rounds, seed=1)
    ref = simulate_round_lengths_numpy(
        P_TABLE, Q_TABLE, k=3, rounds=rounds, start=0, rng=np.random.default_rng(1), chains=64
    )
    _, pvalue, _, _ = stats.chi2_contingency(np.stack([rust[1:], ref[1:]]))
    assert pvalue > SIGNIFICANCE


def test_prefix_independent_tables_ignore_start() -> None:
    a = sd.simulate_round_lengths(P_IID[None], Q_IID[None], k=4, rounds=100_000, start=0, seed=2)
    b = sd.simulate_round_lengths(P_IID[None], Q_IID[None], k=4, rounds=100_000, start=2, seed=2)
    assert np.array_equal(a, b)
