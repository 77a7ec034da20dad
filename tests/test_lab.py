"""The handout's three tests (names kept), on every path that samples:
the Rust engine, `speculative_step` over the Rust verifier, and the pure
Python reference.

Threshold of test (1): TV < 0.015 over 30,000 runs. The exact sampler's
histogram is multinomial, so its false-alarm rate is computed exactly by
sampling multinomials in `test_power.py`: 7e-6. Test (2): 2% of 3.3616 is
6 standard errors (false-alarm rate 2e-9).
"""

from __future__ import annotations

import numpy as np
import pytest
import specdec_rs as sd
from conftest import EXACT_PAIRS, P_IID, P_TABLE, Q_IID, Q_TABLE, TV_RUNS, TV_THRESHOLD, tv


def markov(table: np.ndarray):  # type: ignore[no-untyped-def]
    return lambda prefix: table[prefix[-1]]


def pair_counts_with_step(backend: str, seed: int, runs: int = TV_RUNS) -> np.ndarray:
    rng = np.random.default_rng(seed)
    p, q = markov(P_TABLE), markov(Q_TABLE)
    counts = np.zeros((3, 3))
    for _ in range(runs):
        seq: list[int] = []
        while len(seq) < 2:
            seq += sd.speculative_step(p, q, (0, *seq), k=2, rng=rng, backend=backend)
        counts[seq[0], seq[1]] += 1
    return counts


@pytest.mark.parametrize("path", ["engine", "rust", "python"])
def test_output_distribution_is_exactly_the_target(path: str) -> None:
    if path == "engine":
        counts = sd.simulate(P_TABLE, Q_TABLE, k=2, runs=TV_RUNS, num_tokens=2, start=0, seed=0)
    else:
        counts = pair_counts_with_step(path, seed=0)
    assert counts.sum() == TV_RUNS
    assert tv(counts, EXACT_PAIRS) < TV_THRESHOLD


@pytest.mark.parametrize("backend", ["rust", "python"])
def test_tokens_per_step_matches_theory(backend: str) -> None:
    rng = np.random.default_rng(1)
    alpha = sd.acceptance_rate(P_IID, Q_IID)
    assert alpha == pytest.approx(0.8)
    lengths = [
        len(sd.speculative_step(lambda _: P_IID, lambda _: Q_IID, (0,), 4, rng, backend=backend))
        for _ in range(20_000)
    ]
    assert np.mean(lengths) == pytest.approx(sd.expected_tokens(alpha, 4), rel=0.02)


def test_tokens_per_step_matches_theory_engine() -> None:
    counts = sd.simulate_round_lengths(P_IID[None], Q_IID[None], k=4, rounds=20_000, seed=1)
    mean = (counts * np.arange(6)).sum() / 20_000
    assert mean == pytest.approx(3.3616, rel=0.02)


def test_step_paths_agree_with_each_other() -> None:
    """Rust-backed and pure-Python `speculative_step` against each other:
    two-sample chi-square on the 9 pair counts (8 dof) at significance 1e-6,
    10,000 runs each (each path also meets the exact law above)."""
    from scipy import stats

    a = pair_counts_with_step("rust", seed=5, runs=10_000).ravel()
    b = pair_counts_with_step("python", seed=6, runs=10_000).ravel()
    _, pvalue, _, _ = stats.chi2_contingency(np.stack([a, b]))
    assert pvalue > 1e-6


def test_step_k0_is_one_target_sample() -> None:
    rng = np.random.default_rng(3)
    for backend in ("rust", "python"):
        out = sd.speculative_step(
            lambda _: [0.0, 1.0], lambda _: [1.0, 0.0], (0,), 0, rng, backend=backend
        )
        assert out == [1]


def test_step_rejects_a_bad_backend() -> None:
    with pytest.raises(ValueError, match="backend"):
        sd.speculative_step(
            lambda _: P_IID, lambda _: Q_IID, (0,), 2, np.random.default_rng(0), backend="cuda"
        )  # type: ignore[arg-type]
