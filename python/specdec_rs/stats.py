"""Small statistics used by the experiments, the benchmarks and the tests,
defined once: softmax, total variation, chi-square goodness of fit, and the
TV threshold an exact sampler stays under."""

from __future__ import annotations

import math

import numpy as np


def softmax(x: np.ndarray) -> np.ndarray:
    """softmax over the last axis, in the input's float precision."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    out: np.ndarray = e / e.sum(axis=-1, keepdims=True)
    return out


def tv(counts: np.ndarray, exact: np.ndarray) -> float:
    """Total-variation distance between empirical counts and exact probabilities."""
    c = np.asarray(counts, dtype=np.float64).ravel()
    return float(np.abs(c / c.sum() - np.asarray(exact, dtype=np.float64).ravel()).sum() / 2)


def chi2_pvalue(observed: np.ndarray, probs: np.ndarray) -> float:
    """Goodness of fit of counts to probabilities (Pearson); 0 when a
    zero-probability cell is hit. Needs scipy."""
    from scipy import stats

    observed = np.asarray(observed, dtype=np.float64).ravel()
    probs = np.asarray(probs, dtype=np.float64).ravel()
    n = observed.sum()
    if n == 0:
        return 1.0
    support = probs > 0
    if observed[~support].sum() > 0:
        return 0.0
    expected = probs[support] * n
    stat = ((observed[support] - expected) ** 2 / expected).sum()
    return float(stats.chi2.sf(stat, max(int(support.sum()) - 1, 1)))


def tv_threshold(exact: np.ndarray, runs: int, false_alarm: float) -> float:
    """A TV threshold an exact sampler exceeds with probability <= false_alarm.

    TV(empirical, exact) moves by at most 1/N when one of N runs changes, so
    McDiarmid gives P(TV >= E[TV] + t) <= exp(-2 N t²), and
    E[TV] <= 1/2 Σ_i sqrt(p_i (1 − p_i) / N). With t = sqrt(ln(1/δ) / (2N)):
    threshold = 1/2 Σ sqrt(p(1 − p)/N) + sqrt(ln(1/δ) / (2N)).
    """
    p = np.asarray(exact, dtype=np.float64).ravel()
    noise = 0.5 * np.sqrt(p * (1 - p) / runs).sum()
    return float(noise + math.sqrt(math.log(1 / false_alarm) / (2 * runs)))
