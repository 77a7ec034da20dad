"""Shared constants of the handout's tests and small statistical helpers.

p = target, q = draft, k = γ.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the tests never download

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from scipy import stats

# The handout's 3-token chain: α = 0.6 after token 0, 0.5 after tokens 1 and 2.
P_TABLE = np.array([[0.6, 0.3, 0.1], [0.1, 0.2, 0.7], [0.3, 0.3, 0.4]])
Q_TABLE = np.array([[0.2, 0.5, 0.3], [0.4, 0.4, 0.2], [0.1, 0.8, 0.1]])
# Exact distribution of the first two tokens after token 0: p(a | 0) p(b | a).
EXACT_PAIRS = P_TABLE[0][:, None] * P_TABLE

# The handout's prefix-independent pair: α = 0.8.
P_IID = np.array([0.5, 0.3, 0.2])
Q_IID = np.array([0.3, 0.3, 0.4])

TV_RUNS = 30_000
TV_THRESHOLD = 0.015

# CI runs these on two cores; keep hypothesis deterministic and patient.
settings.register_profile(
    "ci", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "deep", derandomize=False, deadline=None, suppress_health_check=list(HealthCheck)
)
settings.load_profile("deep" if os.environ.get("SPECDEC_FUZZ_EXAMPLES") else "ci")


def tv(counts: np.ndarray, exact: np.ndarray) -> float:
    """Total-variation distance between empirical counts and exact probabilities."""
    c = np.asarray(counts, dtype=np.float64).ravel()
    return float(np.abs(c / c.sum() - np.asarray(exact).ravel()).sum() / 2)


def chi2_pvalue(observed: np.ndarray, probs: np.ndarray) -> float:
    """Goodness of fit of counts to probabilities; 0 if a zero-probability cell is hit."""
    observed = np.asarray(observed, dtype=np.float64)
    n = observed.sum()
    if n == 0:
        return 1.0
    support = probs > 0
    if observed[~support].sum() > 0:
        return 0.0
    expected = probs[support] * n
    stat = ((observed[support] - expected) ** 2 / expected).sum()
    return float(stats.chi2.sf(stat, max(int(support.sum()) - 1, 1)))


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)
