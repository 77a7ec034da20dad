"""Two builds' whole forwards in one process: SmolLM2's GGUF stack
(`runner.stack.Stack`: every layer, the final norm and the LM head in one
Rust call) built once on the current extension and once on another build's
(`--before`), each with its own cache after the same chat prompt; a forward
of n new positions, the builds alternated (order swapped every repeat),
cropped back after each; medians, the median of the pairs' ratios, and
whether the logits were the same bits. `--run R`: each build runs R
forwards of one n back to back (as decoding runs one shape) and each
repeat's figure is their median, the first left out.

    python benchmarks/bench_forward_ab.py --before /tmp/base/python/specdec_rs/_core.abi3.so \\
        --activations f32 --ns 1,5 --repeats 40 [--context 2048 --cache-type q8_0] [--run 10]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import specdec_rs.runner.stack as stack_module
import torch
from bench_forward import context_ids
from specdec_rs import models, runner
from specdec_rs.prompts import workloads


def load_module(path: str | Path, name: str) -> ModuleType:
    """The module in file `path`, loaded as `name` beside what is imported."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_build(path: str) -> ModuleType:
    """Another build's extension module, beside the current one."""
    return load_module(path, "specdec_rs._core")


def stacks_of(target: Any, before: ModuleType) -> dict[str, stack_module.Stack]:
    """`target`'s stack built on the current extension ("after") and on `before`."""
    stacks = {"after": stack_module.Stack(target)}
    current = stack_module._core
    stack_module._core = before  # type: ignore[assignment]
    try:
        stacks["before"] = stack_module.Stack(target)
    finally:
        stack_module._core = current
    return stacks


def alternated(
    stacks: dict[str, Any],
    caches: dict[str, Any],
    blocks: dict[int, torch.Tensor],
    context: int | dict[str, int],
    names: tuple[str, str],
    repeats: int,
    run: int,
) -> tuple[dict[tuple[str, int], list[float]], dict[tuple[str, int], torch.Tensor]]:
    """Two stacks' forwards of each block (n -> its n ids) after `context`
    cached positions (one count, or each name's own), cropped back after
    each: per repeat and n, each stack runs `run` forwards back to back (the
    pair's order swapped every repeat) and its figure is their median, the
    first left out. ((name, n) -> the repeats' seconds, (name, n) -> the
    last logits)."""
    past = context if isinstance(context, dict) else dict.fromkeys(names, context)
    times: dict[tuple[str, int], list[float]] = {(s, n): [] for s in names for n in blocks}
    logits: dict[tuple[str, int], torch.Tensor] = {}
    for rep in range(repeats):
        for n, block in blocks.items():
            for name in names if rep % 2 else names[::-1]:
                seconds = []
                for _ in range(run):
                    start = time.perf_counter()
                    out, _ = stacks[name].forward([block], [caches[name]])
                    seconds.append(time.perf_counter() - start)
                    runner.crop(caches[name], past[name])
                times[(name, n)].append(statistics.median(seconds[1:] or seconds))
                logits[(name, n)] = out
    return times, logits


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True, help="the other build's _core extension file")
    ap.add_argument("--activations", choices=("f32", "q8"), default="f32")
    ap.add_argument("--ns", default="1,5")
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument(
        "--context", type=int, default=0, help="random tokens before the forwards (0: chat prompt)"
    )
    ap.add_argument("--cache-type", choices=("f32", "f16", "q8_0"), default="f32")
    ap.add_argument("--run", type=int, default=1, help="forwards back to back per build")
    args = ap.parse_args()
    ns = [int(n) for n in args.ns.split(",")]
    before = load_build(args.before)
    target, tokenizer = models.load_smollm2(
        activations=args.activations, cache_type=args.cache_type
    )
    if args.context:
        context = context_ids(int(target.config.vocab_size), args.context)
    else:
        context = workloads.encode(tokenizer, workloads.prompts("chat")[0])
    stacks = stacks_of(target, before)
    with torch.inference_mode():
        caches = {}
        for name, stack in stacks.items():
            caches[name] = runner.new_cache(target)
            stack.forward([context], [caches[name]])
        blocks = {
            n: torch.randint(0, 1000, (n,), generator=torch.Generator().manual_seed(n)) for n in ns
        }
        times, logits = alternated(
            stacks, caches, blocks, len(context), ("before", "after"), args.repeats, args.run
        )
    print(
        f"activations {args.activations}; {args.cache_type} cache; context {len(context)} tokens; "
        f"{args.repeats} repeats"
        + (f" of {args.run} forwards back to back" if args.run > 1 else "")
    )
    print("| n | before ms | after ms | before / after (median of pairs) | same logits |")
    print("|---:|---:|---:|---:|---|")
    for n in ns:
        pairs = [a / b for a, b in zip(times[("before", n)], times[("after", n)], strict=True)]
        same = torch.equal(logits[("before", n)], logits[("after", n)])
        print(
            f"| {n} | {statistics.median(times[('before', n)]) * 1e3:.2f} "
            f"| {statistics.median(times[('after', n)]) * 1e3:.2f} "
            f"| {statistics.median(pairs):.3f} | {same} |"
        )


if __name__ == "__main__":
    main()
