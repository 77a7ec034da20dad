"""The EAGLE head behind a confidence gate: drafting stops at a draft whose
probability is at most τ (`Eagle(confidence=τ)`), against the ungated head
and target-only, in one process, prompt by prompt (drift hits all alike).
p = target, q = draft, k = γ.

For each workload and temperature: target-only, then the head at each k
and τ, on the same held-out prompts (`measure.workloads`, never trained on).
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
from specdec_rs.drafters import Eagle
from specdec_rs.measure import workloads


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
        totals = {
            m[0]: [0.0, 0, 0, 0, 0.0, 0] for m in methods
        }  # time, tokens, rounds, drafted, kept1, reached1
        for i, ids in enumerate(workloads.prompt_set(tokenizer, workload, args.prompts)):
            for name, gate, k in methods:
                drafter = (
                    None if gate is None else Eagle(plain.head, plain.fingerprint, confidence=gate)
                )
                out = sd.generate(
                    target,
                    drafter,
                    ids,
                    max_new_tokens=args.max_new_tokens,
                    k=max(k, 1),
                    temperature=t,
                    seed=i,
                )
                tot = totals[name]
                tot[0] += out.time_total - out.time_prefill
                tot[1] += len(out.tokens)
                tot[2] += out.rounds
                tot[3] += out.drafted
                if gate is not None and out.reached:
                    tot[4] += out.accepted[0]
                    tot[5] += out.reached[0]
        base = totals["target-only"][1] / totals["target-only"][0]
        print(f"### {workload}, temperature {t:g}\n")
        print("| method | tokens/pass | drafts/round | first-draft α | tokens/s | speedup |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, *_ in methods:
            s, n, r, d, a1, r1 = totals[name]
            alpha = f"{a1 / r1:.2f}" if r1 else "-"
            print(
                f"| {name} | {n / r:.2f} | {d / r:.2f} | {alpha} | {n / s:.1f} "
                f"| {n / s / base:.2f}x |"
            )
        print()
    print(f"{time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
