"""The masked LM head against the whole one, on SmolLM2 under JSON schemas.

Under a grammar a lone round's GGUF head computes only the vocabulary
panels (16 ids each) that hold an id its masks allow (`Decoder.masked_head`,
`runner.stack.head_panels`): a forced token's row reads one panel, a number's
a few, a free string's the whole head. Both paths run here in one process
(the whole head by switching `Decoder.masked_head` off) on bench_structured's
20 schemas and prompts, for constrained target-only and constrained
speculation (forced drafts + prompt lookup or the suffix drafter, k = 4),
schema by schema with the two paths' order swapped each schema: tokens per
second of each path, the median of the per-schema ratios, whether the two
gave the same tokens (they must: the logits read are the same bits), each
speculative method's ratio to constrained target-only on the same path (issue
38's figure), and the share of the head's panels the masked rows read.

    python benchmarks/bench_masked_head.py --out benchmarks/results/bench-masked-head
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import specdec_rs as sd
from bench_forward import host
from bench_structured import SCHEMAS, workload
from specdec_rs import models
from specdec_rs.generation.decoder import Decoder
from specdec_rs.measure.report import write_results
from specdec_rs.measure.tables import markdown_table
from specdec_rs.runner import stack as stack_module

SETTLE = 0.003  # seconds between timed runs (see bench_greedy_verify.py)
METHODS = ("none", "prompt-lookup", "suffix")
PATHS = ("whole head", "masked head")


class PanelShare:
    """The share of the head's panels each masked row reads (`head_panels`, recorded)."""

    def __init__(self) -> None:
        self.shares: list[float] = []
        self.original = stack_module.head_panels

    def __enter__(self) -> PanelShare:
        def recorded(allowed: np.ndarray, head_rows: int) -> list[list[int] | None]:
            out = self.original(allowed, head_rows)
            count = -(-head_rows // sd._core.panel_rows())
            self.shares += [1.0 if p is None else len(p) / count for p in out]
            return out

        stack_module.head_panels = recorded
        return self

    def __exit__(self, *exc: Any) -> None:
        stack_module.head_panels = self.original


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--temperatures", default="0,0.7")
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--activations", default="f32", choices=("f32", "q8"))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    machine = host()
    print(machine, flush=True)
    target, tokenizer = models.load_smollm2(activations=args.activations)
    grammars, prompts = workload(tokenizer)
    # one drafter per method and path: both paths' drafters learn the same outputs
    made = {(m, p): sd.drafters.from_spec(m, None, None) for m in METHODS[1:] for p in PATHS}
    first = SCHEMAS[0][0]  # warm-up: the grammar's tokenizer, the first forwards
    sd.generate(
        target,
        None,
        prompts[first],
        max_new_tokens=8,
        grammar=grammars[first],
        tokenizer=tokenizer,
        temperature=0,
    )
    tokens: dict[tuple[float, str, str], int] = {}
    seconds: dict[tuple[float, str, str], float] = {}
    pairs: dict[tuple[float, str], list[float]] = {}
    same = {m: True for m in METHODS}
    share = PanelShare()
    started = time.perf_counter()
    for temperature in (float(t) for t in args.temperatures.split(",")):
        for i, (name, _, _) in enumerate(SCHEMAS):
            for method in METHODS:
                rate, out = {}, {}
                for path in PATHS if i % 2 == 0 else PATHS[::-1]:
                    Decoder.masked_head = path == "masked head"
                    drafter = None if method == "none" else made[(method, path)]
                    with share if Decoder.masked_head else contextlib.nullcontext():
                        r = sd.generate(
                            target,
                            drafter,
                            prompts[name],
                            max_new_tokens=args.max_new_tokens,
                            k=args.k,
                            temperature=temperature,
                            seed=i,
                            grammar=grammars[name],
                            tokenizer=tokenizer,
                        )
                    s = r.time_total - r.time_prefill
                    key = (temperature, method, path)
                    tokens[key] = tokens.get(key, 0) + r.new_tokens
                    seconds[key] = seconds.get(key, 0.0) + s
                    rate[path], out[path] = r.new_tokens / s, r.tokens
                    time.sleep(SETTLE)
                pairs.setdefault((temperature, method), []).append(
                    rate["masked head"] / rate["whole head"]
                )
                same[method] &= out["masked head"] == out["whole head"]
            print(temperature, name, flush=True)
    Decoder.masked_head = True
    rows, results = [], {}
    for temperature, method in pairs:
        speed = {
            p: tokens[(temperature, method, p)] / seconds[(temperature, method, p)] for p in PATHS
        }
        base = {
            p: tokens[(temperature, "none", p)] / seconds[(temperature, "none", p)] for p in PATHS
        }
        ratio = statistics.median(pairs[(temperature, method)])
        rows.append(
            [
                f"{temperature:g}",
                method,
                f"{speed['whole head']:.1f}",
                f"{speed['masked head']:.1f}",
                f"{ratio:.3f}",
                f"{speed['whole head'] / base['whole head']:.2f}x",
                f"{speed['masked head'] / base['masked head']:.2f}x",
            ]
        )
        results[f"T={temperature:g} {method}"] = {
            "tokens/s": speed,
            "masked / whole, median of schemas": ratio,
            "vs constrained target-only": {p: speed[p] / base[p] for p in PATHS},
        }
    table = markdown_table(
        [
            "T",
            "method",
            "whole head tokens/s",
            "masked head tokens/s",
            "masked / whole (median)",
            "vs target-only, whole",
            "vs target-only, masked",
        ],
        rows,
    )
    print(table)
    shares = np.array(share.shares)
    summary = {
        "rows masked": len(shares),
        "share of panels read: mean": float(shares.mean()),
        "rows reading at most a tenth": float((shares <= 0.1).mean()),
        "rows reading the whole head": float((shares == 1.0).mean()),
        "same tokens on both paths": same,
        "seconds": time.perf_counter() - started,
    }
    print(summary)
    if args.out:
        write_results(
            args.out,
            {
                "host": machine,
                "activations": args.activations,
                "k": args.k,
                "rows": results,
                **summary,
            },
            table,
        )


if __name__ == "__main__":
    main()
