"""The lookahead drafter over a grid of (W, N, G), against target-only and
prompt lookup, with v(n) to say why it wins or loses.

SmolLM2-135M-Instruct, greedy, `--max-new-tokens` per prompt, the first
`--prompts` evaluation prompts of each workload (code, chat). Per shape
W,N,G: a chain round (the pool's most recent continuation, γ = N − 1) and a
tree round (every continuation in the pool, a trie of at most G·(N − 1)
nodes); both run the W·(N − 1) window nodes in the verification forward.
`window-only` rows keep the committed text out of the pool (only the
Jacobi window's n-grams draft). Per row: tokens/s (new tokens / generation
seconds), tokens per pass, the share of rounds that drafted (and so ran
the window), positions per forward (its window's nodes included), the measured cost of its
forward against target-only's (target seconds per round over target-only's
seconds per step), v(n) at that many positions (a chain forward, measured
alone), and the speedup over target-only, all from the same run; the
default shape also runs under the default γ policy (`MeasuredK`, which
prices its window and may turn drafting off); with
--repeats R the rows interleave and each figure is the median of R.
Every row's text is asserted to be target-only's.

    python benchmarks/bench_lookahead.py --out benchmarks/results/bench-lookahead
"""

from __future__ import annotations

import argparse
import functools
import statistics
from pathlib import Path
from typing import Any

import specdec_rs as sd
from specdec_rs import models
from specdec_rs.drafters.lookahead import parse_shape
from specdec_rs.measure import costs
from specdec_rs.measure.report import write_results
from specdec_rs.measure.tables import fmt, markdown_table
from specdec_rs.policy import measured_policy
from specdec_rs.prompts import workloads

SHAPES = ("1,2,1", "2,2,2", "4,2,4", "1,3,1", "2,3,2", "4,3,4", "2,4,2", "4,4,4")


def configs(shapes: list[str]) -> list[tuple[str, Any, dict[str, Any]]]:
    """(label, drafter factory or None, generate keywords) of each row."""
    rows: list[tuple[str, Any, dict[str, Any]]] = [
        ("none", None, {"k": 1}),
        ("prompt-lookup k=3", sd.PromptLookup, {"k": 3}),
        # the default shape under the default γ policy (as `specdec generate`)
        ("lookahead (default) measured γ", sd.Lookahead, {"k": "measured"}),
    ]
    for spec in shapes:
        w, n, g = parse_shape(spec)
        make = functools.partial(sd.Lookahead, w, n, g)
        rows.append((f"lookahead {spec} chain", make, {"k": n - 1}))
        rows.append((f"lookahead {spec} tree", make, {"tree": g * (n - 1)}))
    w, n, g = parse_shape(shapes[len(shapes) // 2])
    only = functools.partial(sd.Lookahead, w, n, g, prompt_pool=False)
    rows.append((f"lookahead {w},{n},{g} window-only", only, {"k": n - 1}))
    return rows


def run_rows(
    target: Any, prompts: list[Any], make: Any, options: dict[str, Any], max_new: int
) -> tuple[list[Any], list[int]]:
    """The generations of `prompts`, and the forward positions of all their rounds."""
    outs, positions = [], []
    for ids in prompts:
        drafter = None if make is None else make()
        shape = {"k": measured_policy(drafter)} if options.get("k") == "measured" else options
        outs.append(
            sd.generate(
                target,
                drafter,
                ids,
                max_new_tokens=max_new,
                temperature=0,
                seed=0,
                on_round=lambda r: positions.append(r.positions),
                **shape,
            )
        )
    return outs, positions


def summary(outs: list[Any]) -> dict[str, float]:
    tokens = sum(o.new_tokens for o in outs)
    seconds = sum(o.time_total for o in outs)
    rounds = sum(o.rounds for o in outs)
    drafting = sum(1 for o in outs for k in o.k_per_round if k > 0)
    return {
        "drafting_share": drafting / rounds,
        "tokens": tokens,
        "tokens_per_second": tokens / seconds,
        "tokens_per_pass": tokens / rounds,
        "target_per_round": sum(o.time_target for o in outs) / rounds,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", nargs="+", default=list(workloads.WORKLOADS))
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES))
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    target, tokenizer = models.load_smollm2()
    rows = configs(args.shapes)
    sets = {
        w: [workloads.encode(tokenizer, p) for p in workloads.prompts(w)[: args.prompts]]
        for w in args.workloads
    }
    # a trie's drafts and its window: 1 + (G + W)·(N − 1) positions at most
    most = max(1 + (g + w) * (n - 1) for w, n, g in map(parse_shape, args.shapes))
    v = costs.verify_cost_curve(target, sets[args.workloads[0]][0], max_n=most, repeats=7)
    print("v(n):", " ".join(f"{x:.2f}" for x in v), flush=True)
    runs: dict[tuple[str, str], list[dict]] = {}
    plain: dict[str, list[list[int]]] = {}
    for _ in range(args.repeats):
        for workload, prompts in sets.items():
            for label, make, options in rows:
                outs, positions = run_rows(target, prompts, make, options, args.max_new_tokens)
                tokens = [o.tokens for o in outs]
                assert plain.setdefault(workload, tokens) == tokens, (workload, label)
                rounds = sum(o.rounds for o in outs)
                s = summary(outs) | {
                    "drafted_per_round": sum(o.drafted for o in outs) / rounds,
                    "positions": sum(positions) / rounds,  # the window's nodes included
                }
                runs.setdefault((workload, label), []).append(s)
                print(workload, label, {k: round(x, 3) for k, x in s.items()}, flush=True)
    record: dict[str, Any] = {"args": vars(args) | {"out": str(args.out)}, "v": v, "results": {}}
    table = []
    for workload in sets:
        base = runs[(workload, "none")]
        base_tps = statistics.median(r["tokens_per_second"] for r in base)
        base_step = statistics.median(r["target_per_round"] for r in base)
        for label, _make, _ in rows:
            rs = runs[(workload, label)]
            med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            positions = med["positions"]
            n = round(positions)
            med |= {
                "forward_cost": med["target_per_round"] / base_step,
                "v": v[n - 1] if 1 <= n <= len(v) else None,
                "speedup": med["tokens_per_second"] / base_tps,
            }
            record["results"][f"{workload}/{label}"] = med
            table.append(
                [
                    workload,
                    label,
                    f"{med['tokens_per_second']:.1f}",
                    f"{med['tokens_per_pass']:.2f}",
                    f"{med['drafting_share']:.2f}",
                    f"{positions:.1f}",
                    f"{med['forward_cost']:.2f}",
                    fmt(med["v"], ".2f"),
                    f"{med['speedup']:.2f}x",
                ]
            )
    header = [
        "workload",
        "drafter",
        "tokens/s",
        "tokens/pass",
        "drafting rounds",
        "positions",
        "forward cost",
        "v(positions)",
        "vs none",
    ]
    text = markdown_table(header, table)
    text += "\n\nv(n), n = 1.." + str(len(v)) + ": " + " ".join(f"{x:.2f}" for x in v)
    print(text)
    if args.out is not None:
        write_results(args.out, record, text)


if __name__ == "__main__":
    main()
