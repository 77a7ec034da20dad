"""The EAGLE head behind a confidence gate: drafting stops at a draft whose
probability is at most τ (`Eagle(confidence=τ)`), against the ungated head
and target-only, in one process, prompt by prompt (drift hits all alike).
p = target, q = draft, k = γ.

For each workload and temperature: target-only, then the head at each k
and τ, on the same held-out prompts (`prompts.workloads`, never trained on).
Columns: tokens per target pass, drafts per round, first-draft acceptance,
tokens/s (new tokens over decode time, prefill excluded) and speedup over
target-only.

Run: python benchmarks/bench_confidence.py [--prompts 4] [--max-new-tokens 64]
     [--ks 1 3] [--gates 0 0.3 0.4 0.5] [--settings chat:0 code:0 chat:0.7]
"""

from __future__ import annotations

import argparse
import time

import specdec_rs as sd
import torch
from specdec_rs import models
from specdec_rs.measure import Method, Run, Totals
from specdec_rs.measure.bench import TARGET_ONLY
from specdec_rs.prompts import workloads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--ks", nargs="+", type=int, default=[1, 3])
    ap.add_argument("--gates", nargs="+", type=float, default=[0.0, 0.3, 0.4, 0.5])
    ap.add_argument("--settings", nargs="+", default=["chat:0", "code:0", "chat:0.7"])
    args = ap.parse_args()
    start = time.time()
    target, tokenizer = models.load_smollm2()
    plain = sd.drafters.from_spec("eagle", target, tokenizer)
    print(
        f"SmolLM2-135M-Instruct, float32, torch {torch.get_num_threads()} threads; "
        f"{args.prompts} prompts per workload, {args.max_new_tokens} new tokens, seed 0\n"
    )
    for setting in args.settings:
        workload, temperature = setting.split(":")
        t = float(temperature)
        methods = [("target-only", None, 0)] + [
            (f"k={k}, τ={g:g}", g, k) for k in args.ks for g in args.gates
        ]
        runs: dict[str, list[Run]] = {name: [] for name, _, _ in methods}
        drafted = dict.fromkeys(runs, 0)  # drafts proposed (Run counts the checked ones)
        for i, ids in enumerate(workloads.prompt_set(tokenizer, workload, args.prompts)):
            for name, gate, k in methods:
                out = sd.generate(
                    target,
                    None if gate is None else plain.with_confidence(gate),
                    ids,
                    max_new_tokens=args.max_new_tokens,
                    k=max(k, 1),
                    temperature=t,
                    seed=i,
                )
                method = TARGET_ONLY if gate is None else Method("specdec", "fixed", k)
                runs[name].append(Run.of(out, workload, name, method, i))
                drafted[name] += out.drafted
        base = Totals.of(runs["target-only"])
        print(f"### {workload}, temperature {t:g}\n")
        print("| method | tokens/pass | drafts/round | first-draft α | tokens/s | speedup |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, _, _ in methods:
            tot = Totals.of(runs[name])
            first = tot.alpha_by_position[:1]
            alpha = f"{first[0]:.2f}" if first and first[0] == first[0] else "-"
            decode = tot.tokens / (tot.seconds - (tot.prefill or 0.0))
            print(
                f"| {name} | {tot.tokens_per_pass:.2f} | {drafted[name] / tot.passes:.2f} "
                f"| {alpha} | {decode:.1f} | {tot.decode_speedup_vs(base):.2f}x |"
            )
        print()
    print(f"{time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
