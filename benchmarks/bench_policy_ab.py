"""The default γ policy against an earlier version of it, on SmolLM2.

`policy/measured.py` as it was at git ref `--before` (loaded as a module
beside the installed package, so it runs against today's other modules)
and as it is now, each through `measured_policy(drafter)`, with the same
drafters on the same prompts, greedy, interleaved prompt by prompt:
target-only, the old policy and the new one (each first in turn, round by
round), target-only again. Each generation's tokens/s over the geometric
mean of the two target-only runs around it (a host whose speed drifts moves
both sides); the median and mean of those ratios per drafter and policy,
and how many rounds drafted.

    python benchmarks/bench_policy_ab.py --before HEAD~1 --workload chat \\
        --drafters eagle,lookahead,hybrid --rounds 2 --out results/bench-policy-ab-chat
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import specdec_rs as sd
from bench_forward import host
from bench_forward_ab import load_module
from specdec_rs import drafters, models
from specdec_rs.measure.report import write_results
from specdec_rs.measure.tables import markdown_table
from specdec_rs.policy import measured_policy
from specdec_rs.prompts import workloads

# seconds between timed runs: past the kernel workers' 2 ms spin (`rust/pool.rs`), so
# one run's spinning worker never shares the two cores with the next run's, and
# short: after 10-50 ms idle on the Intel host, products ran 1.5-2x slower for a
# while (the weights evicted from the shared L3, the idle vCPU parked: wake-ups of
# 10-30 ms), which a 10 ms settle put into random cells (BENCHMARKS.md)
SETTLE = 0.003


def policy_at(ref: str) -> ModuleType:
    """`specdec_rs.policy.measured` as it was at git ref `ref`."""
    root = Path(__file__).resolve().parent.parent
    source = subprocess.run(
        ["git", "show", f"{ref}:python/specdec_rs/policy/measured.py"],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "measured_before.py"
    path.write_text(source)
    return load_module(path, "measured_before")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, help="the git ref of the old policy")
    ap.add_argument("--workload", default="chat", choices=("chat", "code"))
    ap.add_argument("--drafters", default="eagle,lookahead,hybrid")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--activations", default="q8")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    old = policy_at(args.before)
    machine = host()
    print(machine, flush=True)
    target, tokenizer = models.load_smollm2(activations=args.activations)
    specs = drafters.split_specs(args.drafters)
    ratios: dict[tuple[str, str], list[float]] = {}
    drafting: dict[tuple[str, str], list[int]] = {}

    def run(ids: Any, spec: str | None, which: str) -> tuple[float, int]:
        d = None if spec is None else drafters.from_spec(spec, target, tokenizer)
        kw = {}
        if d is not None:
            kw["k"] = old.measured_policy(d) if which == "before" else measured_policy(d)
        out = sd.generate(target, d, ids, max_new_tokens=args.max_new_tokens, temperature=0, **kw)
        time.sleep(SETTLE)
        return out.new_tokens / out.time_total, out.drafting

    for r in range(args.rounds):
        order = ("before", "after") if r % 2 == 0 else ("after", "before")
        for i in range(args.prompts):
            ids = workloads.encode(tokenizer, workloads.prompts(args.workload)[i])
            for spec in specs:
                plain, _ = run(ids, None, "")
                got = {which: run(ids, spec, which) for which in order}
                base = (plain * run(ids, None, "")[0]) ** 0.5
                for which, (speed, drafted) in got.items():
                    ratios.setdefault((spec, which), []).append(speed / base)
                    drafting.setdefault((spec, which), []).append(drafted)
                print(args.workload, i, spec, {w: round(s / base, 3) for w, (s, _) in got.items()})
    rows = [
        [
            spec,
            which,
            f"{statistics.median(v):.3f}",
            f"{statistics.mean(v):.3f}",
            f"{statistics.mean(drafting[(spec, which)]):.1f}",
        ]
        for (spec, which), v in ratios.items()
    ]
    table = markdown_table(
        ["drafter", "policy", "vs target-only (median)", "(mean)", "drafting rounds"], rows
    )
    print(table)
    if args.out is not None:
        record = {
            "host": machine,
            "args": {k: str(v) for k, v in vars(args).items()},
            "ratios": {f"{s} {w}": v for (s, w), v in ratios.items()},
            "drafting": {f"{s} {w}": v for (s, w), v in drafting.items()},
            "argv": sys.argv,
        }
        write_results(args.out, record, table)


if __name__ == "__main__":
    main()
