"""Where a forward over n positions goes, phase by phase, in forwards run
back to back (as decoding runs them), not paused: SmolLM2's GGUF stack
after a chat prompt, R forwards of one n, cropped back after each, with the
Rust layer's phase clock on (`_core.layer_profile`: products per weight,
attention, the row-wise steps); "the rest" is the forward's wall time less
the layers' phases (the LM head, the embedding rows, the Python around the
call). Two threads unless SPECDEC_KERNEL_THREADS says otherwise; the ns
alternate, twice, so the host's drift falls on all of them.

    SPECDEC_KERNEL_THREADS=2 python benchmarks/bench_phases.py --activations q8 --ns 1,5,9
"""

from __future__ import annotations

import argparse
import time

import specdec_rs.runner.stack as stack_module
import torch
from specdec_rs import _core, models, runner
from specdec_rs.prompts import workloads


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--activations", choices=("f32", "q8"), default="q8")
    ap.add_argument("--ns", default="1,5,9")
    ap.add_argument("--runs", type=int, default=30, help="forwards back to back per figure")
    args = ap.parse_args()
    ns = [int(n) for n in args.ns.split(",")]
    target, tokenizer = models.load_smollm2(activations=args.activations)
    context = workloads.encode(tokenizer, workloads.prompts("chat")[0])
    stack = stack_module.Stack(target)
    cache = runner.new_cache(target)
    seeded = {n: torch.Generator().manual_seed(n) for n in ns}
    blocks = {n: torch.randint(0, 1000, (n,), generator=seeded[n]) for n in ns}
    rows: dict[int, list[tuple[float, list[tuple[str, float]]]]] = {n: [] for n in ns}
    with torch.inference_mode():
        stack.forward([context], [cache])
        for _ in range(2):
            for n in ns:
                for _ in range(3):  # settle: this shape's buffers
                    stack.forward([blocks[n]], [cache])
                    runner.crop(cache, len(context))
                _core.layer_profile(True)
                start = time.perf_counter()
                for _ in range(args.runs):
                    stack.forward([blocks[n]], [cache])
                    runner.crop(cache, len(context))
                total = (time.perf_counter() - start) / args.runs
                phases = [(k, v / args.runs) for k, v in _core.layer_profile_totals()]
                _core.layer_profile(False)
                rows[n].append((total, phases))
    names = [k for k, _ in rows[ns[0]][0][1]]
    print(f"{args.activations} activations, context {len(context)} tokens, ms a forward")
    print("| n | forward | " + " | ".join(names) + " | the rest |")
    print("|---:|---:|" + "---:|" * (len(names) + 1))
    for n in ns:
        for total, phases in rows[n]:
            cells = " | ".join(f"{v * 1e3:.2f}" for _, v in phases)
            rest = total - sum(v for _, v in phases)
            print(f"| {n} | {total * 1e3:.2f} | {cells} | {rest * 1e3:.2f} |")


if __name__ == "__main__":
    main()
