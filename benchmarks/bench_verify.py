"""verify() time per round against a vectorized NumPy round, same inputs, same run.

k = 4, float32, V = 49,152 and 151,936. Calls cycle through 48 different
rounds (about 85 MB of rows at V = 49,152), so each call reads its rows from
memory, as fresh logits would be, and the rounds' outcomes vary (accepted
drafts, rejection position) as in real use.
Prints a Markdown table. Run: python benchmarks/bench_verify.py [--calls N]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import specdec_rs as sd
from specdec_rs.reference import verify_numpy

K = 4


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


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


def median_us(fn: Callable[[int], object], calls: int) -> float:
    for i in range(20):
        fn(i)
    times = []
    for i in range(calls):
        t = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1e6)


def measure(v: int, rounds: list[tuple[np.ndarray, ...]], calls: int) -> str:
    """One table row: every timing cycles through the same rounds."""

    def pick(i: int) -> tuple[np.ndarray, ...]:
        return rounds[i % len(rounds)]

    full = median_us(lambda i: sd.verify(*pick(i), seed=i), calls)
    fast = median_us(lambda i: sd.verify(*pick(i), seed=i, validate=False), calls)
    np_rng = np.random.default_rng(1)
    ref = median_us(lambda i: verify_numpy(*pick(i), np_rng), calls)
    read = median_us(lambda i: (pick(i)[0][0].sum(), pick(i)[1][0].sum()), calls)
    mean_len = np.mean([len(sd.verify(*pick(i), seed=i)) for i in range(2000)])
    return (
        f"| {v:,} | {full:.1f} | {fast:.1f} | {ref:.1f} | {ref / fast:.1f}x "
        f"| {ref / full:.1f}x | {read:.1f} | {mean_len:.2f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(
        "| V | verify (validate) µs | verify (validate=False) µs | NumPy µs "
        "| NumPy / verify (validate=False) | NumPy / verify (validate) "
        "| read 1 p + 1 q row µs | mean tokens |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for v in (49_152, 151_936):
        print(measure(v, make_rounds(v, 48, rng), args.calls))


if __name__ == "__main__":
    main()
