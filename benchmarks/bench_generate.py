"""Real generation on SmolLM2-135M-Instruct: this loop with each drafter at
each γ and policy, target-only through the same loop, and transformers' own
generate() with the matching strategy, all in one process, prompt by prompt
(so machine drift hits every method alike), next to the prediction.
p = target, q = draft, k = γ.

A thin script over `specdec_rs.measure.run_bench` (what `specdec bench`
runs), with the transformers sweep on: prompt lookup at several
`prompt_lookup_num_tokens`, the model drafters at constant k.

Run: python benchmarks/bench_generate.py [--dtype float32] [--prompts 2] [--max-new-tokens 64]
     [--drafters prompt-lookup early-exit:24 eagle medusa hybrid] [--transformers-ks 2 4 8]
     [--ks 1 2 3 4] [--policies adaptive heuristic adaptive-pooled] [--out DIR]
"""

from __future__ import annotations

import argparse
import time

import torch
from rich.console import Console
from specdec_rs import models
from specdec_rs.cli.show import progress_bars
from specdec_rs.measure import run_bench
from specdec_rs.measure.report import bench_markdown, write_bench


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--drafters", nargs="+", default=["prompt-lookup", "early-exit:24"])
    parser.add_argument("--workloads", nargs="+", default=["code", "chat"])
    parser.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 0.7])
    parser.add_argument("--transformers-ks", nargs="*", type=int, default=[])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument(
        "--ks", nargs="*", type=int, default=None, help="fixed γ values (default: by cost)"
    )
    parser.add_argument("--policies", nargs="*", default=["adaptive", "heuristic"])
    parser.add_argument(
        "--trees", nargs="*", type=int, default=[], help="tree sizes (nodes per round) to run"
    )
    parser.add_argument("--no-transformers", action="store_true", help="skip transformers' runs")
    parser.add_argument("--weights", default="auto", choices=("auto", "gguf", "float32"))
    parser.add_argument("--out", default=None, help="folder for report.md, results.json, plot")
    args = parser.parse_args()
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()
    target, tokenizer = models.load_smollm2(dtype=args.dtype, weights=args.weights)
    start = time.perf_counter()
    with progress_bars(Console()) as progress:
        report = run_bench(
            target,
            tokenizer,
            drafter_specs=args.drafters,
            workloads=args.workloads,
            temperatures=args.temperatures,
            prompts=args.prompts,
            max_new_tokens=args.max_new_tokens,
            repeats=args.repeats,
            transformers_ks=args.transformers_ks,
            ks=args.ks,
            policies=args.policies,
            trees=args.trees,
            transformers=not args.no_transformers,
            progress=progress,
        )
    print(f"SmolLM2-135M-Instruct, {args.dtype}\n")
    print(bench_markdown(report))
    elapsed = time.perf_counter() - start
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {elapsed:.0f} s")
    if args.out:
        write_bench(report, args.out)


if __name__ == "__main__":
    main()
