"""verify() time per round against a vectorized NumPy round, same inputs, same run.

k = 4, float32, V = 49,152 and 151,936. Calls cycle through 48 different
rounds (about 85 MB of rows at V = 49,152), so each call reads its rows from
memory, as fresh logits would be, and the rounds' outcomes vary (accepted
drafts, rejection position) as in real use.

Columns: the default call (check="read": everything the round reads), the
full check (every row, in one pass), the NumPy reference round, their
ratios, the time to sum one p and one q row with NumPy (a memory floor for
a round that samples a residual), and the full check's bytes read and GB/s.
Prints a Markdown table. Run: python benchmarks/bench_verify.py [--calls N]
"""

from __future__ import annotations

import argparse

import numpy as np
import specdec_rs as sd
from specdec_rs.reference import verify_numpy
from specdec_rs.stats import softmax
from specdec_rs.timing import median_seconds

K = 4


def make_rounds(v: int, n: int, rng: np.random.Generator) -> list[tuple[np.ndarray, ...]]:
    """n rounds: correlated p, q logits (α about 0.5), drafts sampled from q."""
    out = []
    for _ in range(n):
        base = rng.normal(size=(K + 1, v)) * 2
        p = softmax(base + rng.normal(size=(K + 1, v)))
        q = softmax(base[:K] + rng.normal(size=(K, v)))
        drafts = np.array([rng.choice(v, p=row) for row in q], dtype=np.int64)
        out.append((p.astype(np.float32), q.astype(np.float32), drafts))
    return out


def measure(v: int, rounds: list[tuple[np.ndarray, ...]], calls: int) -> str:
    """One table row: every timing cycles through the same rounds."""
    it = iter(range(10**12))

    def pick() -> tuple[np.ndarray, ...]:
        return rounds[next(it) % len(rounds)]

    us = 1e6
    default = median_seconds(lambda: sd.verify(*pick(), seed=7), calls) * us
    full = median_seconds(lambda: sd.verify(*pick(), seed=7, check="full"), calls) * us
    np_rng = np.random.default_rng(1)
    ref = median_seconds(lambda: verify_numpy(*pick(), np_rng), calls) * us
    read = median_seconds(lambda: (pick()[0][0].sum(), pick()[1][0].sum()), calls) * us
    mean_len = np.mean([len(sd.verify(*rounds[i % len(rounds)], seed=i)) for i in range(2000)])
    full_bytes = (2 * K + 1) * v * 4
    return (
        f"| {v:,} | {default:.1f} | {full:.1f} | {ref:.1f} | {ref / default:.1f}x "
        f"| {ref / full:.1f}x | {read:.1f} | {full_bytes / 1e6:.2f} MB "
        f"| {full_bytes / full / 1e3:.1f} | {mean_len:.2f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(
        "| V | verify µs (default) | verify µs (check=full) | NumPy µs "
        "| NumPy / default | NumPy / full | NumPy: sum 1 p + 1 q row µs "
        "| full check reads | full check GB/s | mean tokens |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for v in (49_152, 151_936):
        print(measure(v, make_rounds(v, 48, rng), args.calls))


if __name__ == "__main__":
    main()
