"""Real generation on SmolLM2-135M-Instruct (CPU): our loop with each drafter
against target-only and against transformers' own generate() with the matching
strategy, all in one process, prompt by prompt (so machine drift hits every
method alike). p = target, q = draft, k = γ.

Methods per (workload, temperature):
  target-only      ours (drafter=None, same loop)       and HF generate()
  prompt lookup    ours at k in KS_LOOKUP                and HF prompt_lookup_num_tokens=n
  early exit       ours EarlyExit(L) at k                 and HF assistant_early_exit=L, k constant
  draft model      ours DraftModel(first L' layers) at k  and HF assistant_model=same, k constant
tokens/s = all new tokens / all wall time (prefill included) over the prompts.

Run: python benchmarks/bench_generate.py [--prompts 3] [--max-new-tokens 96] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from typing import Any

import specdec_rs as sd
import torch
from rich.console import Console
from rich.progress import Progress
from specdec_rs import models, workloads
from specdec_rs.generate import eos_set
from specdec_rs.hf import hf_generate
from specdec_rs.processors import SamplingConfig

EARLY_EXIT_LAYER = 24
DRAFT_LAYERS = 8
KS_LOOKUP = (4, 8)
HF_LOOKUP_SWEEP = (2, 4, 6, 8, 10)
K_MODEL = 1  # α ≈ 0.1–0.2 for the untrained drafters: one draft is their best


def methods(target: Any, greedy_code: bool) -> list[tuple[str, str, Any]]:
    """(family, label, run(ids, config, seed) -> (tokens, seconds, passes, kept, checked))."""
    eos = sorted(eos_set(None, target))
    draft = models.layer_view(target, DRAFT_LAYERS)

    def ours(drafter_fn: Any, k: int) -> Any:
        def run(ids: Any, config: SamplingConfig, seed: int) -> tuple[Any, ...]:
            r = sd.generate(
                target,
                drafter_fn(),
                ids,
                max_new_tokens=ARGS.max_new_tokens,
                k=k,
                temperature=config.temperature,
                seed=seed,
            )
            return r.tokens, r.time_total, r.rounds, sum(r.accepted), sum(r.reached)

        return run

    def theirs(count_passes: bool = True, **strategy: Any) -> Any:
        def run(ids: Any, config: SamplingConfig, seed: int) -> tuple[Any, ...]:
            r = hf_generate(
                target,
                ids,
                max_new_tokens=ARGS.max_new_tokens,
                config=config,
                seed=seed,
                eos_token_id=eos,
                **strategy,
            )
            return r.tokens, r.time_total, (r.target_passes - 1) if count_passes else 0, 0, 0

        return run

    constant = {"num_assistant_tokens_schedule": "constant"}
    out: list[tuple[str, str, Any]] = [
        ("target-only", "ours", ours(lambda: None, 1)),
        ("target-only", "transformers", theirs()),
    ]
    for k in KS_LOOKUP:
        out.append(("prompt lookup", f"ours k={k}", ours(sd.PromptLookup, k)))
    for n in HF_LOOKUP_SWEEP if greedy_code else KS_LOOKUP:
        out.append(("prompt lookup", f"transformers n={n}", theirs(prompt_lookup_num_tokens=n)))
    ee = f"early exit L={EARLY_EXIT_LAYER}"
    out.append(
        (ee, f"ours k={K_MODEL}", ours(lambda: sd.EarlyExit(target, EARLY_EXIT_LAYER), K_MODEL))
    )
    out.append(
        (
            ee,
            f"transformers k={K_MODEL}",
            theirs(
                count_passes=False,
                assistant_early_exit=EARLY_EXIT_LAYER,
                num_assistant_tokens=K_MODEL,
                **constant,
            ),
        )
    )
    dm = f"draft model ({DRAFT_LAYERS} layers)"
    out.append((dm, f"ours k={K_MODEL}", ours(lambda: sd.DraftModel(draft), K_MODEL)))
    out.append(
        (
            dm,
            f"transformers k={K_MODEL}",
            theirs(assistant_model=draft, num_assistant_tokens=K_MODEL, **constant),
        )
    )
    return out


def run_setting(
    target: Any, tokenizer: Any, workload: str, temperature: float, progress: Progress
) -> list[dict[str, Any]]:
    config = SamplingConfig(temperature)
    greedy_code = workload == "code" and temperature == 0
    prompts = [workloads.encode(tokenizer, m) for m in workloads.prompts(workload)[: ARGS.prompts]]
    table = methods(target, greedy_code)
    totals: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0, 0, 0])
    task = progress.add_task(f"{workload} T={temperature:g}", total=len(prompts) * len(table))
    for i, ids in enumerate(prompts):
        for family, label, run in table:
            tokens, seconds, passes, kept, checked = run(ids, config, seed=i)
            t = totals[(family, label)]
            for j, v in enumerate((len(tokens), seconds, passes, kept, checked)):
                t[j] += v
            progress.advance(task)
    base = totals[("target-only", "ours")]
    base_tps = base[0] / base[1]
    rows = []
    for (family, label), (tokens, seconds, passes, kept, checked) in totals.items():
        tps = tokens / seconds
        rows.append(
            {
                "workload": workload,
                "temperature": temperature,
                "family": family,
                "method": label,
                "tokens": int(tokens),
                "tokens_per_second": tps,
                "tokens_per_pass": tokens / passes if passes else None,
                "alpha": kept / checked if checked else None,
                "speedup_vs_target_only": tps / base_tps,
            }
        )
    return rows


def show(rows: list[dict[str, Any]]) -> None:
    """One Markdown table per (workload, temperature)."""
    settings = dict.fromkeys((r["workload"], r["temperature"]) for r in rows)
    for workload, temperature in settings:
        print(
            f"\n{workload}, temperature {temperature:g}, {ARGS.prompts} prompts x "
            f"{ARGS.max_new_tokens} new tokens\n"
        )
        print("| drafter | method | tokens/s | tokens/pass | α | vs target-only |")
        print("|---|---|---:|---:|---:|---:|")
        for r in rows:
            if (r["workload"], r["temperature"]) != (workload, temperature):
                continue
            tpp = "-" if r["tokens_per_pass"] is None else f"{r['tokens_per_pass']:.2f}"
            a = "-" if r["alpha"] is None else f"{r['alpha']:.3f}"
            print(
                f"| {r['family']} | {r['method']} | {r['tokens_per_second']:.1f} | {tpp} | {a} "
                f"| {r['speedup_vs_target_only']:.2f}x |"
            )


def main() -> None:
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--workloads", nargs="+", default=list(workloads.WORKLOADS))
    parser.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 0.7])
    parser.add_argument("--json", default=None)
    ARGS = parser.parse_args()
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()
    console = Console()
    target, tokenizer = models.load_smollm2()
    warm = workloads.encode(tokenizer, "Hello")
    sd.generate(target, sd.PromptLookup(), warm, max_new_tokens=8, k=4, temperature=0)
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with Progress(console=console, transient=True) as progress:
        for workload in ARGS.workloads:
            for temperature in ARGS.temperatures:
                rows += run_setting(target, tokenizer, workload, temperature, progress)
    show(rows)
    elapsed = time.perf_counter() - start
    print(f"\ntorch {torch.__version__}, {torch.get_num_threads()} threads; {elapsed:.0f} s")
    if ARGS.json:
        with open(ARGS.json, "w") as f:
            json.dump(rows, f, indent=1)


ARGS = argparse.Namespace()

if __name__ == "__main__":
    main()
