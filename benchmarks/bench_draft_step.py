"""The EAGLE head's draft step on SmolLM2: the draft-vocabulary LM head
stored transposed (H, N), as the head keeps it, against the row layout
(N, H) read as `features @ rows.T`; the target's decode step in the same
process gives c = draft step / target step.

Also the bare products at N = 8,192 and 4,096, H = 576 (one token).

Run: python benchmarks/bench_draft_step.py [--repeats 200] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import torch
from specdec_rs import drafters, models
from specdec_rs.measure.costs import decode_step_time, drafter_step_time
from specdec_rs.prompts import workloads
from specdec_rs.timing import median_seconds


def product_table(repeats: int) -> None:
    print("| product (1 token, H = 576) | rows layout µs | transposed µs | rows / transposed |")
    print("|---|---|---|---|")
    with torch.inference_mode():
        for n in (8192, 4096):
            rows = torch.randn(n, 576)
            cols = rows.T.contiguous()
            f = torch.randn(1, 1, 576)
            a = median_seconds(lambda: f @ rows.T, repeats) * 1e6  # noqa: B023
            b = median_seconds(lambda: f @ cols, repeats) * 1e6  # noqa: B023
            print(f"| N = {n:,} | {a:.0f} | {b:.0f} | {a / b:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    product_table(args.repeats)
    # the float32 target: this compares the layouts of float rows
    target, tokenizer = models.load_smollm2(weights="float32")
    context = workloads.encode(tokenizer, workloads.prompts("chat")[0])
    drafter: Any = drafters.from_spec("eagle", target, tokenizer)
    head = drafter.head
    cols = head.vocab_rows.head_cols
    rows = cols.T.contiguous()

    def rows_logits(features: torch.Tensor) -> torch.Tensor:
        return features @ rows.to(features.dtype).T

    transposed_logits = head.logits
    results: dict[str, list[float]] = {"transposed": [], "rows": []}
    steps = []
    for _ in range(args.rounds):  # interleaved, so drift hits both alike
        steps.append(decode_step_time(target, context, repeats=20))
        for name, logits in (("transposed", transposed_logits), ("rows", rows_logits)):
            head.logits = logits
            results[name].append(drafter_step_time(drafter, target, context, args.repeats))
    head.logits = transposed_logits
    step = statistics.median(steps)
    print()
    print(f"target decode step (median of {args.rounds} medians): {step * 1e3:.1f} ms")
    print()
    print("| EAGLE draft step, LM head layout | ms (median of medians) | c | / transposed |")
    print("|---|---|---|---|")
    best = statistics.median(results["transposed"])
    for name, times in results.items():
        t = statistics.median(times)
        print(f"| {name} | {t * 1e3:.2f} | {t / step:.4f} | {t / best:.2f}x |")


if __name__ == "__main__":
    main()
