"""The greedy verifier against the one-hot rows it replaces, on SmolLM2.

At temperature 0 `Decoder.finish` verifies a chain by the target rows'
argmaxes (`Sampler.greedy_tokens`, `verify_greedy`); before, it built the
one-hot rows (`Sampler.probs`) and ran `verify` on them. Both paths run
here in one process (the old one by switching `Decoder.greedy_chain` off),
interleaved prompt by prompt with their order swapped each round: tokens
per second of each generation, the seconds the rounds spent outside the
target forward and the drafter (verification, cache crop, drafter update:
`Round.verify_s`) per round, and whether the two gave the same tokens
(they must: the same rule).

    python benchmarks/bench_greedy_verify.py --drafters none,prompt-lookup,suffix \\
        --rounds 3 --out results/bench-greedy-verify
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import specdec_rs as sd
from bench_forward import host
from specdec_rs import drafters, models
from specdec_rs.generation.decoder import Decoder
from specdec_rs.measure.report import write_results
from specdec_rs.measure.tables import markdown_table
from specdec_rs.prompts import workloads

# seconds between timed runs: past the kernel workers' 2 ms spin (`rust/pool.rs`), so
# one run's spinning worker never shares the two cores with the next run's, and
# short: after 10-50 ms idle on the Intel host, products ran 1.5-2x slower for a
# while (the weights evicted from the shared L3, the idle vCPU parked: wake-ups of
# 10-30 ms), which a 10 ms settle put into random cells (BENCHMARKS.md)
SETTLE = 0.003
PATHS = ("one-hot rows", "argmaxes")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--drafters", default="none,prompt-lookup,suffix")
    ap.add_argument("--workloads", default="chat,code")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--activations", default="f32", choices=("f32", "q8"))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    machine = host()
    print(machine, flush=True)
    target, tokenizer = models.load_smollm2(activations=args.activations)
    specs = drafters.split_specs(args.drafters)
    fast = Decoder.greedy_chain
    speed: dict[tuple[str, str, str], list[float]] = {}
    glue: dict[tuple[str, str, str], list[float]] = {}
    same = True

    def run(ids: Any, spec: str, path: str) -> tuple[float, float, list[int]]:
        Decoder.greedy_chain = fast if path == PATHS[1] else lambda self, proposal: False  # type: ignore[method-assign]
        d = None if spec == "none" else drafters.from_spec(spec, target, tokenizer)
        rounds: list[sd.Round] = []
        out = sd.generate(
            target, d, ids, max_new_tokens=args.max_new_tokens, temperature=0,
            k=args.k, on_round=rounds.append,
        )  # fmt: skip
        Decoder.greedy_chain = fast  # type: ignore[method-assign]
        time.sleep(SETTLE)
        per_round = statistics.mean(r.verify_s for r in rounds)
        return out.new_tokens / out.time_total, per_round, list(out.tokens)

    for r in range(args.rounds):
        order = PATHS if r % 2 == 0 else PATHS[::-1]
        for workload in workloads.check_names(args.workloads.split(",")):
            for i in range(args.prompts):
                ids = workloads.encode(tokenizer, workloads.prompts(workload)[i])
                for spec in specs:
                    got = {path: run(ids, spec, path) for path in order}
                    same &= got[PATHS[0]][2] == got[PATHS[1]][2]
                    for path, (tps, verify_s, _) in got.items():
                        speed.setdefault((workload, spec, path), []).append(tps)
                        glue.setdefault((workload, spec, path), []).append(verify_s)
                    print(workload, i, spec, {p: round(v[0], 1) for p, v in got.items()})
    rows = []
    for (workload, spec, path), v in speed.items():
        if path != PATHS[1]:
            continue
        old = speed[(workload, spec, PATHS[0])]
        ratios = [a / b for a, b in zip(v, old, strict=True)]
        rows.append(
            [
                workload,
                spec,
                f"{statistics.median(old):.1f}",
                f"{statistics.median(v):.1f}",
                f"{statistics.median(ratios):.3f}",
                f"{statistics.median(glue[(workload, spec, PATHS[0])]) * 1e3:.3f}",
                f"{statistics.median(glue[(workload, spec, path)]) * 1e3:.3f}",
            ]
        )
    table = markdown_table(
        [
            "workload",
            "drafter",
            "one-hot rows tokens/s",
            "argmaxes tokens/s",
            "ratio (median of pairs)",
            "one-hot rows: verify ms a round",
            "argmaxes: verify ms a round",
        ],
        rows,
    )
    print(table)
    print("same tokens on both paths:", same)
    if args.out is not None:
        record = {
            "host": machine,
            "args": {k: str(v) for k, v in vars(args).items()},
            "speed": {" ".join(key): v for key, v in speed.items()},
            "verify_s": {" ".join(key): v for key, v in glue.items()},
            "same_tokens": same,
            "argv": sys.argv,
        }
        write_results(args.out, record, table)
    if not same:
        raise SystemExit("the two paths gave different tokens")


if __name__ == "__main__":
    main()
