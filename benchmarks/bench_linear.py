"""The linear layers' product over few positions on the CPU: torch's
(`F.linear`, MKL) against the Rust one (`_core.linear_f32`), in float32.

1. Bare products at SmolLM2-135M's shapes, x (n, in) · Wᵀ, each weight
   cycled over 30 copies so it comes from memory as in a forward.
2. SmolLM2 forwards over n new positions after a 200-token context: ms and
   v(n) = time(n) / time(1), with torch's linears and with Rust's.
3. Greedy generation (target-only, prompt lookup, hybrid, EAGLE) with each
   product, interleaved prompt by prompt: tokens/s, speedup over target-only
   with the same product, and whether the tokens equal target-only greedy.

Everything runs in one process, the two products interleaved, so drift hits
both alike. p = target, q = draft, k = γ.

Run: python benchmarks/bench_linear.py [--repeats 40] [--prompts 2] [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np
import torch
from specdec_rs import _core, drafters, generate, kernels, models, runner
from specdec_rs.prompts import workloads
from specdec_rs.timing import median_seconds

SHAPES = (  # (out, in): q and o, k and v, gate and up, down, the LM head
    (576, 576),
    (192, 576),
    (1536, 576),
    (576, 1536),
    (49152, 576),
)
ROWS = (1, 2, 3, 4, 6, 8)


def product_table(repeats: int) -> None:
    print("| W (out × in) | n | torch µs | Rust µs | torch / Rust |")
    print("|---|---|---|---|---|")
    g = torch.Generator().manual_seed(0)
    for out_f, in_f in SHAPES:
        copies = 30 if out_f * in_f < 10**7 else 2
        weights = [torch.randn(out_f, in_f, generator=g) for _ in range(copies)]
        arrays = [w.numpy() for w in weights]
        for n in ROWS:
            x = torch.randn(n, in_f, generator=g)
            xs = x.numpy()
            out = np.empty((n, out_f), np.float32)

            def with_torch() -> None:
                for w in weights:  # noqa: B023
                    torch.nn.functional.linear(x, w)  # noqa: B023

            def with_rust() -> None:
                for w in arrays:  # noqa: B023
                    _core.linear_f32(xs, w, out)  # noqa: B023

            a = median_seconds(with_torch, repeats) / copies * 1e6
            b = median_seconds(with_rust, repeats) / copies * 1e6
            print(f"| {out_f:,} × {in_f:,} | {n} | {a:.1f} | {b:.1f} | {a / b:.2f}x |")


def forward_table(target: Any, repeats: int) -> None:
    ns = (1, 2, 3, 4, 5, 6, 8, 9)
    context = torch.randint(
        0, models.vocab_of(target), (200,), generator=torch.Generator().manual_seed(0)
    )
    times: dict[tuple[str, int], list[float]] = {(c, n): [] for c in ("torch", "rust") for n in ns}
    with torch.inference_mode():
        cache = runner.new_cache(target)
        runner.forward(target, context, cache, keep=1)
        for rep in range(repeats + 2):
            for choice in ("torch", "rust"):
                kernels.apply_linear_choice(target, choice)
                for n in ns:
                    start = time.perf_counter()
                    runner.forward(target, context[:n], cache, keep=n)
                    elapsed = time.perf_counter() - start
                    runner.crop(cache, len(context))
                    if rep >= 2:  # warm-up
                        times[(choice, n)].append(elapsed)
    med = {key: statistics.median(v) * 1e3 for key, v in times.items()}
    print("| positions n | " + " | ".join(str(n) for n in ns) + " |")
    print("|---" * (len(ns) + 1) + "|")
    for choice in ("torch", "rust"):
        print(f"| {choice} ms | " + " | ".join(f"{med[(choice, n)]:.1f}" for n in ns) + " |")
        one = med[(choice, 1)]
        print(
            f"| {choice} v(n) | " + " | ".join(f"{med[(choice, n)] / one:.2f}" for n in ns) + " |"
        )
    print(
        "| torch / Rust | "
        + " | ".join(f"{med[('torch', n)] / med[('rust', n)]:.2f}x" for n in ns)
        + " |"
    )


def generation_table(target: Any, tokenizer: Any, prompts: int, max_new_tokens: int) -> None:
    methods = [  # (workload, drafter spec, k)
        ("code", None, 1),
        ("code", "prompt-lookup", 4),
        ("code", "hybrid", 3),
        ("chat", None, 1),
        ("chat", "prompt-lookup", 2),
        ("chat", "eagle", 1),
        ("chat", "eagle", 2),
        ("chat", "hybrid", 2),
    ]
    built = {
        spec: drafters.from_spec(spec, target, tokenizer, greedy=True)
        for _, spec, _ in methods
        if spec
    }
    tokens: dict[tuple[str, str, str | None, int], int] = {}
    seconds: dict[tuple[str, str, str | None, int], float] = {}
    same: dict[tuple[str, str, str | None, int], bool] = {}
    for workload in ("code", "chat"):
        for ids in workloads.prompt_set(tokenizer, workload, prompts):
            for choice in ("torch", "rust"):  # interleaved per prompt
                kernels.apply_linear_choice(target, choice)
                reference: list[int] | None = None
                for w, spec, k in methods:
                    if w != workload:
                        continue
                    start = time.perf_counter()
                    out = generate(
                        target,
                        built[spec] if spec else None,
                        ids,
                        max_new_tokens=max_new_tokens,
                        k=k,
                        temperature=0.0,
                        seed=0,
                    )
                    elapsed = time.perf_counter() - start
                    key = (choice, workload, spec, k)
                    tokens[key] = tokens.get(key, 0) + len(out.tokens)
                    seconds[key] = seconds.get(key, 0.0) + elapsed
                    if spec is None:
                        reference = out.tokens
                    same[key] = same.get(key, True) and out.tokens == reference
    print(
        "| workload | method | torch tok/s | torch speedup | Rust tok/s | Rust speedup "
        "| Rust / torch tok/s | greedy identical |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for w, spec, k in methods:
        cells = []
        for choice in ("torch", "rust"):
            rate = tokens[(choice, w, spec, k)] / seconds[(choice, w, spec, k)]
            base = tokens[(choice, w, None, 1)] / seconds[(choice, w, None, 1)]
            cells += [f"{rate:.2f}", f"{rate / base:.2f}x"]
        ratio = (tokens[("rust", w, spec, k)] / seconds[("rust", w, spec, k)]) / (
            tokens[("torch", w, spec, k)] / seconds[("torch", w, spec, k)]
        )
        ident = all(same[(c, w, spec, k)] for c in ("torch", "rust"))
        name = "target-only" if spec is None else f"{spec} k={k}"
        print(
            f"| {w} | {name} | "
            + " | ".join(cells)
            + f" | {ratio:.2f}x | {'yes' if ident else 'NO'} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--skip-products", action="store_true")
    parser.add_argument("--skip-generation", action="store_true")
    args = parser.parse_args()
    if not kernels.rust_available():
        raise SystemExit("this CPU has no AVX2 + FMA: the Rust product runs its slow portable path")
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()
    start = time.perf_counter()
    if not args.skip_products:
        product_table(args.repeats)
        print()
    target, tokenizer = models.load_smollm2(linear="torch", weights="float32")
    forward_table(target, args.repeats // 4)
    print()
    if not args.skip_generation:
        generation_table(target, tokenizer, args.prompts, args.max_new_tokens)
    elapsed = time.perf_counter() - start
    print(f"\ntorch {torch.__version__}, {torch.get_num_threads()} threads; {elapsed:.0f} s")


if __name__ == "__main__":
    main()
