"""Monte Carlo rounds per second: the Rust engine against vectorized NumPy and
pure-Python `speculative_step`, same chain, same run; then the time of one
small engine call (the statistical tests make thousands of them), against
the same runs done in one call.

The handout's 3-token chain, k = 2, exact rule, continuing generations.
Prints two Markdown tables. Run: python benchmarks/bench_sim.py [--rounds N]
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
    small_calls()


def small_calls(repeats: int = 10) -> None:
    """Many small `simulate` calls, as the statistical tests and `specdec
    experiments` make them: two-token runs, 1,000 to 100,000 runs a call (9
    sizes x `repeats` seeds), each threads setting. Reported: total time,
    the slowest call, and the total against the same runs in one call (the
    fixed cost of a call)."""
    sizes = np.unique(np.logspace(3, 5, 9).astype(int)).tolist()
    total_runs = sum(sizes) * repeats
    print()
    print(
        f"| {len(sizes) * repeats} calls of 1,000-100,000 runs | total s | slowest call ms "
        "| vs the same runs in one call |"
    )
    print("|---|---|---|---|")
    for threads in (1, None):
        t = time.perf_counter()
        sd.simulate(P, Q, k=K, runs=total_runs, num_tokens=2, start=0, threads=threads)
        one_call = time.perf_counter() - t
        times = []
        for n in sizes:
            for seed in range(repeats):
                t = time.perf_counter()
                sd.simulate(P, Q, k=K, runs=n, num_tokens=2, start=0, seed=seed, threads=threads)
                times.append(time.perf_counter() - t)
        name = "1 thread" if threads == 1 else f"{os.cpu_count() or 1} threads"
        print(
            f"| {name} | {sum(times):.3f} | {max(times) * 1e3:.1f} | {sum(times) / one_call:.2f}x |"
        )


if __name__ == "__main__":
    main()
