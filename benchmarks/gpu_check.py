"""The handout's scale-up pair, self-contained: random-weight models built from
the Qwen2.5-0.5B-Instruct (draft) and Qwen2.5-1.5B-Instruct (target) configs
in benchmarks/configs (no download), on any torch device.

Prints c (one draft step / one target step), the v(n) curve (to 33
positions: lookahead's windows), tokens/s target-only and speculative with
the 0.5B as drafter, with the suffix drafter and with lookahead (its
default W,N,G and `--lookahead` shapes, chains and tries), and whether each
greedy speculative output equals target-only greedy output. Random weights make the
acceptance meaningless (the two models do not agree); what this checks is
the loop on the device and the costs the device gives. Both models' final
norms are scaled so the random logits are peaked, not flat (fewer near-ties).

Run: bash benchmarks/gpu_check.sh [--device cuda|cpu] [--dtype bfloat16] [--new-tokens 64]
(defaults sized to finish in under 8 minutes: on the CPU 24 new tokens and 5 timing repeats)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import specdec_rs as sd
import torch
from specdec_rs import models
from specdec_rs.drafters.lookahead import parse_shape
from specdec_rs.measure import costs

CONFIGS = Path(__file__).parent / "configs"


def build(name: str, dtype: torch.dtype, device: torch.device, seed: int) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**json.loads((CONFIGS / f"{name}.json").read_text()))
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    with torch.no_grad():
        model.model.norm.weight.mul_(30.0)  # peaked logits from random weights
    return model.eval()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on GPU, float32 on CPU")
    parser.add_argument("--new-tokens", type=int, default=None, help="default: 64 GPU, 24 CPU")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=None, help="default: 20 GPU, 5 CPU")
    parser.add_argument(
        "--lookahead",
        nargs="*",
        default=["4,3,4", "8,4,8"],
        help="lookahead shapes W,N,G to run (chain γ = N - 1 and a trie of G·(N - 1) nodes)",
    )
    args = parser.parse_args()
    device = models.torch_device(args.device)
    on_gpu = device.type == "cuda"
    args.new_tokens = args.new_tokens or (64 if on_gpu else 24)
    args.repeats = args.repeats or (20 if on_gpu else 5)
    dtype = models.torch_dtype(args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    t0 = time.perf_counter()
    target = build("qwen2.5-1.5b-instruct", dtype, device, seed=0)
    draft = build("qwen2.5-0.5b-instruct", dtype, device, seed=1)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"device {device} ({name}), {dtype}; models built in {time.perf_counter() - t0:.1f} s")
    prompt = torch.randint(0, 150_000, (64,), generator=torch.Generator().manual_seed(0))
    drafter = sd.DraftModel(draft)
    step = costs.decode_step_time(target, prompt, repeats=args.repeats)
    c = costs.drafter_step_time(drafter, target, prompt, repeats=args.repeats) / step
    v = costs.verify_cost_curve(target, prompt, max_n=33, repeats=max(3, args.repeats // 2))
    print(f"target step {step * 1e3:.2f} ms; c (0.5B step / 1.5B step) = {c:.3f}")
    print("v(n), n = 1..33: " + ", ".join(f"{x:.2f}" for x in v))
    plans: list[tuple[str, object, float, dict]] = [
        ("target-only greedy", None, 0.0, {"k": 1}),
        (f"speculative greedy k={args.k}", drafter, 0.0, {"k": args.k}),
        ("target-only T=0.7", None, 0.7, {"k": 1}),
        (f"speculative T=0.7 k={args.k}", drafter, 0.7, {"k": args.k}),
        (f"suffix greedy k={args.k}", sd.SuffixDrafter(), 0.0, {"k": args.k}),
    ]
    for shape in args.lookahead:
        w, n, g = parse_shape(shape)
        plans.append((f"lookahead {shape} greedy", sd.Lookahead(w, n, g), 0.0, {"k": n - 1}))
        plans.append(
            (f"lookahead {shape} tree greedy", sd.Lookahead(w, n, g), 0.0, {"tree": g * (n - 1)})
        )
    runs = {}
    for label, d, temperature, shape_of_round in plans:
        out = sd.generate(
            target,
            d,
            prompt,
            max_new_tokens=args.new_tokens,
            temperature=temperature,
            seed=0,
            eos_token_id=[],
            **shape_of_round,
        )
        runs[label] = out
        print(
            f"{label:>30}: {out.tokens_per_second:7.1f} tokens/s, "
            f"{out.tokens_per_pass:.2f} tokens/pass, α = {out.alpha:.3f}"
        )
    plain = runs["target-only greedy"].tokens
    for label, out in runs.items():
        if "greedy" not in label or label == "target-only greedy":
            continue
        spec = out.tokens
        same = next((i for i, (a, b) in enumerate(zip(plain, spec, strict=True)) if a != b), None)
        if same is None:
            print(f"greedy identity, {label}: PASS ({len(plain)} of {len(plain)} tokens identical)")
        else:
            print(
                f"greedy identity, {label}: FAIL at token {same} of {len(plain)} (a near-tie "
                "between batched and one-token kernels flips an argmax; exact in float32 on "
                "the CPU)"
            )
    print(f"total {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
