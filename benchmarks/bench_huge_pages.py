"""SmolLM2's forward with its weights on 2 MiB pages (`gguf.arena`) against
the same weights where they were loaded (4 KiB pages), in one process.

The model is loaded twice, once with `SPECDEC_HUGE_PAGES=0`; each copy has
its own stack (`runner.stack.Stack`) and cache after the same chat prompt.
Per repeat and n, each copy runs `--run` forwards of n new positions back to
back (as decoding runs one shape; the first is left out), cropped back after
each, the copies' order swapped every repeat. Prints the medians, the
median of the runs' ratios, whether the logits were the same bits, and the
huge pages the process holds.

    python benchmarks/bench_huge_pages.py --activations q8 --ns 1,5,9 --repeats 15
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any

import specdec_rs.runner.stack as stack_module
import torch
from bench_forward_ab import alternated
from specdec_rs import models, runner
from specdec_rs.prompts import workloads


def huge_pages_kib() -> int:
    """This process's anonymous memory on transparent huge pages, KiB."""
    with open("/proc/self/smaps_rollup", encoding="utf-8") as f:
        for line in f:
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    return 0


def load(activations: str, huge: bool) -> tuple[Any, Any]:
    """(model, tokenizer) with the weights gathered on huge pages or left apart."""
    os.environ["SPECDEC_HUGE_PAGES"] = "1" if huge else "0"
    try:
        return models.load_smollm2(activations=activations)
    finally:
        del os.environ["SPECDEC_HUGE_PAGES"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--activations", choices=("f32", "q8"), default="q8")
    ap.add_argument("--ns", default="1,5,9")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--run", type=int, default=10, help="forwards of one n back to back")
    args = ap.parse_args()
    ns = [int(n) for n in args.ns.split(",")]
    before_kib = huge_pages_kib()
    apart, tokenizer = load(args.activations, huge=False)
    gathered, _ = load(args.activations, huge=True)
    held = huge_pages_kib() - before_kib
    context = workloads.encode(tokenizer, workloads.prompts("chat")[0])
    stacks = {"4k": stack_module.Stack(apart), "2m": stack_module.Stack(gathered)}
    blocks = {
        n: torch.randint(0, 1000, (n,), generator=torch.Generator().manual_seed(n)) for n in ns
    }
    with torch.inference_mode():
        caches = {name: runner.new_cache(m) for name, m in (("4k", apart), ("2m", gathered))}
        for name, stack in stacks.items():
            stack.forward([context], [caches[name]])
        times, logits = alternated(
            stacks, caches, blocks, len(context), ("4k", "2m"), args.repeats, args.run
        )
    print(
        f"activations {args.activations}; context {len(context)} tokens; {args.repeats} repeats "
        f"of {args.run} forwards; huge pages held: {held // 1024} MiB"
    )
    print("| n | 4 KiB pages ms | 2 MiB pages ms | 2 MiB / 4 KiB (median of runs) | same logits |")
    print("|---:|---:|---:|---:|---|")
    for n in ns:
        pairs = [b / a for a, b in zip(times[("4k", n)], times[("2m", n)], strict=True)]
        same = torch.equal(logits[("4k", n)], logits[("2m", n)])
        print(
            f"| {n} | {statistics.median(times[('4k', n)]) * 1e3:.2f} "
            f"| {statistics.median(times[('2m', n)]) * 1e3:.2f} "
            f"| {statistics.median(pairs):.3f} | {same} |"
        )


if __name__ == "__main__":
    main()
