"""The engine on the handout's toy models: the first two tokens' law against
the exact one, and round lengths against the closed form. What `specdec
simulate` shows. p = target, q = draft, k = γ."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from specdec_rs import sim, theory
from specdec_rs.stats import tv
from specdec_rs.toy import CHAIN_P, CHAIN_Q, EXACT_PAIRS, IID_P, IID_Q


@dataclass(frozen=True)
class PairLaw:
    """Law of the first two tokens after token 0 on the chain (3 × 3)."""

    empirical: list[list[float]]
    exact: list[list[float]]
    tv: float
    tv_expected_noise: float


@dataclass(frozen=True)
class RoundLengths:
    """Tokens per round with prefix-independent p, q (i.i.d. acceptance α)."""

    alpha: float
    counts: list[int]
    mean: float
    theory: float
    speedup_at_c_005: float

    def law(self, k: int) -> list[float]:
        """P(round emits m tokens), m = 1..k+1: α^(m−1)(1 − α), and α^k for k + 1."""
        a = self.alpha
        return [a ** (m - 1) * (1 - a) if m <= k else a**k for m in range(1, k + 2)]


@dataclass(frozen=True)
class EngineCheck:
    k: int
    runs: int
    variant: str
    seed: int
    pairs: PairLaw
    round_lengths: RoundLengths
    rounds_per_second: float
    seconds_pairs: float
    seconds_round_lengths: float


def engine_check(
    *,
    k: int = 2,
    runs: int = 1_000_000,
    variant: str = "exact",
    seed: int = 0,
    threads: int | None = None,
) -> EngineCheck:
    """`runs` two-token runs on the chain and `runs` rounds on the i.i.d. pair."""
    t0 = time.perf_counter()
    hist = sim.simulate(
        CHAIN_P,
        CHAIN_Q,
        k=k,
        runs=runs,
        num_tokens=2,
        start=0,
        variant=variant,
        seed=seed,
        threads=threads,
    )
    t_pairs = time.perf_counter() - t0
    # an exact sampler's TV noise: Σ sqrt(p(1 − p)/n) · sqrt(2/π) / 2 (mean absolute deviation)
    noise = float(np.sqrt(EXACT_PAIRS * (1 - EXACT_PAIRS) / runs).sum() * np.sqrt(2 / np.pi) / 2)
    pairs = PairLaw(
        (hist / hist.sum()).tolist(), EXACT_PAIRS.tolist(), tv(hist, EXACT_PAIRS), noise
    )
    t0 = time.perf_counter()
    lengths = sim.simulate_round_lengths(
        IID_P, IID_Q, k=k, rounds=runs, variant=variant, seed=seed, threads=threads
    )
    t_rounds = time.perf_counter() - t0
    alpha = theory.acceptance_rate(IID_P[0], IID_Q[0])
    rl = RoundLengths(
        alpha,
        lengths.tolist(),
        float((lengths * np.arange(k + 2)).sum() / lengths.sum()),
        theory.expected_tokens(alpha, k),
        theory.expected_speedup(alpha, k, 0.05),
    )
    return EngineCheck(k, runs, variant, seed, pairs, rl, runs / t_rounds, t_pairs, t_rounds)
