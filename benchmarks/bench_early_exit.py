"""Early exit with the target's own cache against the same first L layers as a
separate draft model with its own cache (SmolLM2-135M-Instruct, CPU, greedy).

Both draft exactly the same tokens (same weights, same inputs), so acceptance
and output are identical; the difference is the cache: the separate model keeps
a second KV cache for its L layers and must run every accepted token through
them again (catch-up), which the shared cache never does.

Run: python benchmarks/bench_early_exit.py [--layers 8 24] [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse

import specdec_rs as sd
import torch
from specdec_rs import models
from specdec_rs.prompts import workloads


def cache_bytes(cache: object) -> int:
    layers = getattr(cache, "layers", [])
    return sum(
        layer.keys.numel() * layer.keys.element_size() * 2
        for layer in layers
        if getattr(layer, "keys", None) is not None and layer.keys.numel()
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, nargs="+", default=[8, 24])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    target, tokenizer = models.load_smollm2()
    ids = workloads.encode(tokenizer, workloads.prompts("code")[0])
    print(
        f"prompt {len(ids)} tokens, {args.max_new_tokens} new tokens, k = {args.k}, greedy; "
        f"best of {args.repeats}\n"
    )
    print("| L | drafter | draft s | total s | tokens/s | α | drafter cache at end |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for layers in args.layers:
        makers = {
            "early exit (shared cache)": lambda n=layers: sd.EarlyExit(target, n),
            "separate model (own cache)": lambda n=layers: sd.DraftModel(
                models.layer_view(target, n)
            ),
        }
        outputs = []
        for label, make in makers.items():
            best = None
            for _ in range(args.repeats):
                drafter = make()
                r = sd.generate(
                    target,
                    drafter,
                    ids,
                    max_new_tokens=args.max_new_tokens,
                    k=args.k,
                    temperature=0,
                )
                if best is None or r.time_total < best[0].time_total:
                    own = getattr(drafter, "_cache", None)  # early exit's is the target's
                    extra = 0 if label.startswith("early exit") else cache_bytes(own)
                    best = (r, extra)
            assert best is not None
            r, extra = best
            outputs.append(r.tokens)
            print(
                f"| {layers} | {label} | {r.time_draft:.2f} | {r.time_total:.2f} "
                f"| {r.tokens_per_second:.1f} | {r.alpha:.3f} | {extra / 2**20:.1f} MiB |"
            )
        assert outputs[0] == outputs[1], "both drafters must give the target's greedy text"
    print(f"\ntorch {torch.__version__}, {torch.get_num_threads()} threads")


if __name__ == "__main__":
    main()
