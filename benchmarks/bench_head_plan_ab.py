"""Two builds' masked LM heads on the forwards a constrained generation makes.

Constrained speculation (forced drafts + prompt lookup, k = 4, greedy) runs
on bench_structured's 20 schemas and records every target forward whose
rows carry a grammar's masks: the block's length and its `allowed` rows.
Those forwards are then replayed after one chat context on SmolLM2's stack
built twice, on the current extension and on another build's (`--before`),
the builds alternated forward by forward (order swapped every repeat), the
cache cut back after each; the sums of the medians by block length, and
whether the logits the masks read were the same bits. The rest of the
forward is the same work on both, so the difference is the head's passes
(`llama::head_plan` against a pass per listed row).

    python benchmarks/bench_head_plan_ab.py --before /tmp/base/python/specdec_rs/_core.abi3.so
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from typing import Any

import numpy as np
import specdec_rs as sd
import specdec_rs.runner.stack as stack_module
import torch
from bench_forward_ab import load_build, stacks_of
from bench_structured import SCHEMAS, drafter_for, workload
from specdec_rs import models, runner
from specdec_rs.prompts import workloads


def recorded_forwards(target: Any, tokenizer: Any, max_new: int) -> list[tuple[int, np.ndarray]]:
    """(block length, allowed rows) of every masked single-block target forward."""
    grammars, prompts = workload(tokenizer)
    calls: list[tuple[int, np.ndarray]] = []
    original = stack_module.Stack.forward

    def record(self: Any, blocks: Any, caches: Any, **kw: Any) -> Any:
        allowed = kw.get("allowed")
        if len(blocks) == 1 and allowed is not None and allowed[0] is not None:
            calls.append((len(blocks[0].reshape(-1)), np.array(allowed[0], copy=True)))
        return original(self, blocks, caches, **kw)

    stack_module.Stack.forward = record  # type: ignore[method-assign]
    try:
        for name, _, _ in SCHEMAS:
            sd.generate(
                target,
                drafter_for("prompt-lookup"),
                prompts[name],
                max_new_tokens=max_new,
                grammar=grammars[name],
                tokenizer=tokenizer,
                temperature=0,
                k=4,
            )
    finally:
        stack_module.Stack.forward = original  # type: ignore[method-assign]
    return calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="the other build's _core extension file")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    args = ap.parse_args()
    before = load_build(args.before)
    target, tokenizer = models.load_smollm2()
    calls = recorded_forwards(target, tokenizer, args.max_new_tokens)
    stacks = stacks_of(target, before)
    context = workloads.encode(tokenizer, workloads.prompts("chat")[0])
    times: dict[tuple[str, int], list[float]] = defaultdict(list)
    same = True
    with torch.inference_mode():
        caches = {}
        for name, stack in stacks.items():
            caches[name] = runner.new_cache(target)
            stack.forward([context], [caches[name]])
        for rep in range(args.repeats):
            for i, (n, allowed) in enumerate(calls):
                block = torch.randint(0, 1000, (n,), generator=torch.Generator().manual_seed(i))
                out = {}
                for name in ("before", "after") if (rep + i) % 2 else ("after", "before"):
                    start = time.perf_counter()
                    logits, _ = stacks[name].forward([block], [caches[name]], allowed=[allowed])
                    times[(name, i)].append(time.perf_counter() - start)
                    runner.crop(caches[name], len(context))
                    out[name] = logits[: len(allowed)][torch.from_numpy(allowed)]
                same = same and torch.equal(out["before"], out["after"])
    by_n: dict[int, dict[str, float]] = defaultdict(lambda: {"before": 0.0, "after": 0.0})
    for i, (n, _) in enumerate(calls):
        for name in ("before", "after"):
            by_n[n][name] += statistics.median(times[(name, i)])
    print(f"{len(calls)} masked forwards recorded; {args.repeats} repeats")
    print("| block length | forwards | before ms | after ms | before / after |")
    print("|---:|---:|---:|---:|---:|")
    total = {"before": 0.0, "after": 0.0}
    for n in sorted(by_n):
        count = sum(1 for m, _ in calls if m == n)
        b, a = by_n[n]["before"], by_n[n]["after"]
        total["before"] += b
        total["after"] += a
        print(f"| {n} | {count} | {b * 1e3:.1f} | {a * 1e3:.1f} | {b / a:.3f} |")
    b, a = total["before"], total["after"]
    print(f"| all | {len(calls)} | {b * 1e3:.1f} | {a * 1e3:.1f} | {b / a:.3f} |")
    print(f"the logits the masks read: {'the same bits' if same else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
