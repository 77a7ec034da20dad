"""Monte Carlo rounds per second: the Rust engine against vectorized NumPy and
pure-Python `speculative_step`, same chain, same run.

The handout's 3-token chain, k = 2, exact rule, continuing generations.
Prints a Markdown table. Run: python benchmarks/bench_sim.py [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import specdec_rs as sd
from specdec_rs.reference import simulate_round_lengths_numpy
from specdec_rs.toy import CHAIN_P, CHAIN_Q

P, Q = CHAIN_P, CHAIN_Q
K = 2


def best_rate(fn, rounds: int, repeats: int = 3) -> float:  # type: ignore[no-untyped-def]
    """Rounds per second, best of `repeats` (the least disturbed run)."""
    best = 0.0
    for r in range(repeats):
        t = time.perf_counter()
        fn(r)
        best = max(best, rounds / (time.perf_counter() - t))
    return best


def python_rounds(rounds: int, backend: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    last = 0
    for _ in range(rounds):
        out = sd.speculative_step(
            lambda s: P[s[-1]], lambda s: Q[s[-1]], (last,), K, rng, backend=backend
        )
        last = out[-1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=50_000_000)
    args = parser.parse_args()
    n = args.rounds
    cores = os.cpu_count() or 1
    rows = [
        (
            "Rust engine, 1 thread",
            best_rate(
                lambda s: sd.simulate_round_lengths(P, Q, k=K, rounds=n, seed=s, threads=1), n
            ),
        ),
        (
            f"Rust engine, {cores} threads",
            best_rate(lambda s: sd.simulate_round_lengths(P, Q, k=K, rounds=n, seed=s), n),
        ),
        (
            "NumPy, vectorized over 4096 chains",
            best_rate(
                lambda s: simulate_round_lengths_numpy(
                    P, Q, k=K, rounds=n // 20, start=0, rng=np.random.default_rng(s)
                ),
                n // 20,
            ),
        ),
        (
            "speculative_step, Rust verify",
            best_rate(lambda s: python_rounds(20_000, "rust", s), 20_000, 1),
        ),
        (
            "speculative_step, pure Python",
            best_rate(lambda s: python_rounds(20_000, "python", s), 20_000, 1),
        ),
    ]
    numpy_rate = rows[2][1]
    print("| implementation | rounds/s | vs NumPy |")
    print("|---|---|---|")
    for name, rate in rows:
        print(f"| {name} | {rate:,.0f} | {rate / numpy_rate:.2f}x |")


if __name__ == "__main__":
    main()
