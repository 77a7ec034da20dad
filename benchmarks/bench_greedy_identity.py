"""Greedy identity by precision: does speculative greedy text equal
target-only greedy text, and where it does not, how near a tie did the two
part? p = target, q = draft, k = γ.

For each dtype, workload and prompt: target-only greedy, then each drafter
at each k, all with `margins=True`; a difference is reported with the first
differing position and both runs' logit margins (top-1 minus top-2) there
(`generation.divergence`), beside the smallest margin target-only met on
that prompt. An exact verifier parts from target-only only where the two
forwards round differently, so its divergences sit at margins within the
dtype's rounding of the logits (bfloat16: 8 bits of mantissa).

Run: python benchmarks/bench_greedy_identity.py [--dtypes bfloat16 float32]
     [--drafters prompt-lookup] [--ks 3 8] [--prompts 8] [--max-new-tokens 128]
"""

from __future__ import annotations

import argparse
import time

import specdec_rs as sd
from specdec_rs import drafters, models
from specdec_rs.generation import divergence
from specdec_rs.prompts import workloads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    ap.add_argument("--drafters", nargs="+", default=["prompt-lookup"])
    ap.add_argument("--ks", nargs="+", type=int, default=[3, 8])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    start = time.perf_counter()
    print(
        "| dtype | workload | prompt | drafter | k | same text | first difference | "
        "margin there (target-only / speculative) | smallest target-only margin |"
    )
    print("|---|---|---:|---|---:|---|---:|---|---:|")
    for dtype in args.dtypes:
        target, tok = models.load_smollm2(dtype=dtype)
        same = total = 0
        for workload in workloads.WORKLOADS:
            for i, ids in enumerate(workloads.prompt_set(tok, workload, args.prompts)):
                plain = sd.generate(
                    target,
                    None,
                    ids,
                    max_new_tokens=args.max_new_tokens,
                    temperature=0,
                    margins=True,
                )
                for spec in args.drafters:
                    for k in args.ks:
                        drafter = drafters.from_spec(spec, target, tok)
                        out = sd.generate(
                            target,
                            drafter,
                            ids,
                            max_new_tokens=args.max_new_tokens,
                            k=k,
                            temperature=0,
                            vocab_size=len(tok),
                            margins=True,
                        )
                        d = divergence(plain, out)
                        total += 1
                        same += d is None and len(out.tokens) == len(plain.tokens)
                        where = "-" if d is None else str(d.index)
                        margin = "-" if d is None else f"{d.margins[0]:.4f} / {d.margins[1]:.4f}"
                        print(
                            f"| {dtype} | {workload} | {i} | {spec} | {k} | {d is None} | "
                            f"{where} | {margin} | {min(plain.margins):.4f} |",
                            flush=True,
                        )
        print(f"\n{dtype}: {same} of {total} texts identical\n")
    print(f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
