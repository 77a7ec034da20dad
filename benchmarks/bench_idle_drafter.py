"""What a drafter costs while it does not draft: long greedy outputs on
SmolLM2 (its GGUF file, `--activations`), target-only against each drafter
attached under a policy that never asks for a draft, alternated generation by generation on one
prompt; tokens/s, the median of the per-pair ratios, and the seconds spent in
the drafter's `update` per generation (medians; on a host whose speed drifts
this is the steadier figure).

A default γ switches a losing drafter off (issue 34's "never slower"); what
is left is this: the hidden states it is handed, the features it keeps for
its next draft, the policy's bookkeeping. It must stay flat in the length of
the output (a drafter that copies what it kept at every round loses more the
longer the output).

    SPECDEC_KERNEL_THREADS=2 python benchmarks/bench_idle_drafter.py \\
        --out benchmarks/results/bench-idle-drafter
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import specdec_rs as sd
from bench_forward import host
from specdec_rs import drafters, models
from specdec_rs.measure.report import write_results
from specdec_rs.measure.tables import markdown_table
from specdec_rs.policy.base import ChainPolicy
from specdec_rs.prompts import workloads


def timed_update(drafter: Any) -> list[float]:
    """Wraps `drafter.update` (on the instance) to add its seconds to the
    returned one-element list (reset it before a generation)."""
    spent = [0.0]
    inner = drafter.update

    def update(*args: Any) -> None:
        start = time.perf_counter()
        inner(*args)
        spent[0] += time.perf_counter() - start

    drafter.update = update
    return spent


class NeverDraft(ChainPolicy):
    """γ = 0 every round (the drafter stays attached: handed its states, updated)."""

    name = "never"

    def reset(self) -> None:
        pass

    def observe(self, k: int, drafted: int, num_accepted: int) -> None:
        pass

    def next_k(self) -> int:
        return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--drafters", default="eagle,medusa,early-exit:8,suffix,prompt-lookup")
    ap.add_argument("--lengths", default="96,900")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--activations", default="q8")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    machine = host()
    print(machine)
    target, tokenizer = models.load_smollm2(activations=args.activations)
    ids = workloads.encode(tokenizer, workloads.prompts("chat")[0])
    specs = args.drafters.split(",")
    built = {s: drafters.from_spec(s, target, tokenizer) for s in specs}  # one each, as a server
    in_update = {s: timed_update(d) for s, d in built.items()}  # seconds in update(), per drafter
    rows, record = [], {"host": machine, "activations": args.activations, "rows": {}}
    for length in (int(x) for x in args.lengths.split(",")):
        speed: dict[str, list[float]] = {"target-only": []}
        updates: dict[str, list[float]] = {}
        for r in range(args.rounds + 1):  # the first pass warms up, not counted
            for spec in [None, *specs]:
                extra: dict[str, Any] = {}
                if spec is not None:
                    extra["k"] = NeverDraft()
                    in_update[spec][0] = 0.0
                out = sd.generate(
                    target,
                    None if spec is None else built[spec],
                    ids,
                    max_new_tokens=length,
                    temperature=0,
                    eos_token_id=[],
                    **extra,
                )
                assert spec is None or sum(out.k_per_round) == 0, "it drafted"
                if r == 0:
                    continue
                speed.setdefault(spec or "target-only", []).append(out.new_tokens / out.time_total)
                if spec is not None:
                    updates.setdefault(spec, []).append(in_update[spec][0])
        base = speed["target-only"]
        for name, values in speed.items():
            pairs = statistics.median(v / b for v, b in zip(values, base, strict=True))
            spent = statistics.median(updates[name]) * 1e3 if name in updates else 0.0
            rows.append(
                [
                    str(length),
                    name,
                    f"{statistics.median(values):.1f}",
                    f"{pairs:.3f}x",
                    f"{spent:.1f}",
                ]
            )
            record["rows"][f"{length} {name}"] = {
                "tokens/s": values,
                "pairs": pairs,
                "update seconds": updates.get(name, []),
            }
    columns = ["tokens", "drafter (never drafting)", "tokens/s", "vs target-only", "update() ms"]
    table = markdown_table(columns, rows)
    print(table)
    if args.out is not None:
        write_results(args.out, record, table)


if __name__ == "__main__":
    main()
