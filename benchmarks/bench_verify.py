"""verify() time per round against a vectorized NumPy round, same inputs, same run.

k = 4, float32, V = 49,152 and 151,936. Calls cycle through 48 different
rounds (about 85 MB of rows at V = 49,152), so each call reads its rows from
memory, as fresh logits would be, and the rounds' outcomes vary (accepted
drafts, rejection position) as in real use.

Columns: the default call (check="read": everything the round reads), the
full check (every row, in one pass), the NumPy reference round, their
ratios, the time to sum one p and one q row with NumPy (a memory floor for
a round that samples a residual), and the full check's bytes read and GB/s.
A second table times block verification (method="block", k = 4) and
`verify_tree` with 8 nodes (a binary tree of depth 3, 2 children per node,
drawn from q as each children kind says) against the default chain call in
the same run, on rounds built the same way.

Prints Markdown tables. Run: python benchmarks/bench_verify.py [--calls N]
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


TREE = np.array([-1, -1, 0, 0, 1, 1, 2, 2])  # 8 nodes, 2 children each, depth 3


def make_trees(v: int, n: int, rng: np.random.Generator) -> list[dict[str, tuple[np.ndarray, ...]]]:
    """n tree rounds over V: correlated p, q rows (α about 0.5) per row, and
    for each children kind the 8 node tokens drawn as it says."""
    out = []
    rows = len(TREE) + 1
    for _ in range(n):
        base = rng.normal(size=(rows, v)) * 2
        p = softmax(base + rng.normal(size=(rows, v))).astype(np.float32)
        q = softmax(base + rng.normal(size=(rows, v))).astype(np.float32)
        kinds = {}
        for kind in ("iid", "without_replacement", "fixed"):
            tokens = np.zeros(len(TREE), dtype=np.int64)
            for r in range(rows):
                kids = np.flatnonzero(TREE + 1 == r)
                if len(kids) == 0:
                    continue
                if kind == "fixed":
                    tokens[kids] = np.argsort(-q[r])[: len(kids)]
                else:
                    w = q[r].astype(np.float64)
                    tokens[kids] = rng.choice(
                        v, size=len(kids), p=w / w.sum(), replace=kind == "iid"
                    )
            kinds[kind] = (p, q, tokens)
        out.append(kinds)
    return out


def measure_beyond_chain(v: int, calls: int, rng: np.random.Generator) -> None:
    rounds = make_rounds(v, 48, rng)
    trees = make_trees(v, 48, rng)
    it = iter(range(10**12))
    us = 1e6

    def chain() -> tuple[np.ndarray, ...]:
        return rounds[next(it) % len(rounds)]

    def tree(kind: str) -> tuple[np.ndarray, ...]:
        return trees[next(it) % len(trees)][kind]

    chain_us = median_seconds(lambda: sd.verify(*chain(), seed=7), calls) * us
    rows = [
        (
            "verify, k = 4 (token)",
            chain_us,
            np.mean([len(sd.verify(*rounds[i % 48], seed=i)) for i in range(2000)]),
        )
    ]
    block_us = median_seconds(lambda: sd.verify(*chain(), seed=7, method="block"), calls) * us
    rows.append(
        (
            "verify, k = 4, method=block",
            block_us,
            np.mean([len(sd.verify(*rounds[i % 48], seed=i, method="block")) for i in range(2000)]),
        )
    )
    for kind in ("iid", "without_replacement", "fixed"):
        t = (
            median_seconds(
                lambda kind=kind: sd.verify_tree(*tree(kind), TREE, 7, children=kind), calls
            )
            * us
        )
        tokens = np.mean(
            [
                len(sd.verify_tree(*trees[i % 48][kind], TREE, i, children=kind)[0])
                for i in range(2000)
            ]
        )
        rows.append((f"verify_tree, 8 nodes, {kind}", t, tokens))
    print(f"\nV = {v:,}, float32; the same rounds cycle through every call\n")
    print("| call | µs | / verify k = 4 | mean tokens |")
    print("|---|---|---|---|")
    for name, t, tokens in rows:
        print(f"| {name} | {t:.1f} | {t / chain_us:.2f}x | {tokens:.2f} |")


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
    measure_beyond_chain(49_152, args.calls, rng)


if __name__ == "__main__":
    main()
