"""The step after a long context over the step after a short one (issue 34's
"step at 2,048 context vs 128" target), both measured in one process: one
SmolLM2 stack, one cache prefilled to each context (random tokens), a
forward of n new positions on each, R forwards back to back per figure (the
first left out), the two contexts alternated (order swapped every repeat),
cropped back after each. Reported per n: the median of each context's
figures and the median of the repeats' ratios, so the host's drift between
minutes falls on both contexts alike.

    SPECDEC_KERNEL_THREADS=2 python benchmarks/bench_long_step.py --activations q8 \\
        --cache-type q8_0 --contexts 128,2048 --ns 1,5 --repeats 15 --run 8
"""

from __future__ import annotations

import argparse
import statistics

import specdec_rs.runner.stack as stack_module
import torch
from bench_forward import context_ids
from bench_forward_ab import alternated
from specdec_rs import models, runner


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--activations", choices=("f32", "q8"), default="q8")
    ap.add_argument("--cache-type", choices=("f32", "f16", "q8_0"), default="q8_0")
    ap.add_argument("--contexts", default="128,2048", help="short,long")
    ap.add_argument("--ns", default="1,5")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--run", type=int, default=8, help="forwards back to back per figure")
    args = ap.parse_args()
    short, long = (int(c) for c in args.contexts.split(","))
    ns = [int(n) for n in args.ns.split(",")]
    target, _ = models.load_smollm2(activations=args.activations, cache_type=args.cache_type)
    vocab = int(target.config.vocab_size)
    stack = stack_module.Stack(target)
    names = (str(short), str(long))
    contexts = {str(c): c for c in (short, long)}
    with torch.inference_mode():
        caches = {name: runner.new_cache(target) for name in names}
        for name, c in contexts.items():
            stack.forward([context_ids(vocab, c)], [caches[name]])
        seeded = {n: torch.Generator().manual_seed(n) for n in ns}
        blocks = {n: torch.randint(0, 1000, (n,), generator=seeded[n]) for n in ns}
        times, _ = alternated(
            dict.fromkeys(names, stack), caches, blocks, contexts, names, args.repeats, args.run
        )
    print(
        f"{args.activations} activations, {args.cache_type} cache; {args.repeats} repeats of "
        f"{args.run} forwards back to back, contexts alternated"
    )
    print(f"| n | step after {short} ms | step after {long} ms | ratio (median of pairs) |")
    print("|---:|---:|---:|---:|")
    for n in ns:
        a, b = times[(names[0], n)], times[(names[1], n)]
        pairs = [y / x for x, y in zip(a, b, strict=True)]
        print(
            f"| {n} | {statistics.median(a) * 1e3:.2f} | {statistics.median(b) * 1e3:.2f} "
            f"| {statistics.median(pairs):.3f} |"
        )


if __name__ == "__main__":
    main()
