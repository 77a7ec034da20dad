"""specdec predict | bench: what speed to expect, and what was measured.

specdec predict [--drafters prompt-lookup suffix lookahead eagle medusa hybrid early-exit:24
                             truncated:8]
                [--workloads code chat]
                [--temperatures 0 0.7] [--prompts 20] [--max-new-tokens 128] [--k-max 8]
                [--repeats 100] [--json]
specdec bench   [same options] [--out bench-results] [--no-transformers]
                [--transformers-ks 2 4 ...] [--ks 1 2 4] [--policies adaptive heuristic]
                [--trees 4 8]   writes report.md, results.json, speedup.png
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from specdec_rs import _checks, drafters
from specdec_rs.cli.flags import check_model_flags, load_target
from specdec_rs.cli.show import progress_bars, table
from specdec_rs.limits import MAX_NEW_TOKENS
from specdec_rs.measure import bench
from specdec_rs.measure.bench import MAX_TREE_SIZE
from specdec_rs.measure.job import DEFAULT_DRAFTERS, MAX_K_MAX, Job, check_drafter_specs
from specdec_rs.measure.methods import DEFAULT_POLICIES, POLICIES
from specdec_rs.measure.predict import PredictReport, predict
from specdec_rs.measure.report import bench_markdown, to_json, write_bench
from specdec_rs.policy import MAX_K
from specdec_rs.prompts import workloads

__all__ = ["add_parsers", "to_json"]


def add_parsers(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    for name, text in (
        ("predict", "teacher-forced α, measured c and v(n), predicted speedup per γ"),
        ("bench", "real generation per γ next to the prediction; Markdown, JSON and a plot"),
    ):
        p = sub.add_parser(name, parents=parents, help=text)
        p.add_argument(
            "--drafters",
            nargs="+",
            default=list(DEFAULT_DRAFTERS),
            help=drafters.spec_help(),
        )
        p.add_argument("--workloads", nargs="+", default=list(workloads.WORKLOADS))
        p.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 0.7])
        p.add_argument("--prompts", type=int, default=20 if name == "predict" else 3)
        p.add_argument("--max-new-tokens", type=int, default=128 if name == "predict" else 96)
        p.add_argument("--k-max", type=int, default=8)
        p.add_argument(
            "--repeats",
            type=int,
            default=100,
            help="timed repetitions per cost measurement (medians; v(n) uses 15%%)",
        )
        if name == "predict":
            p.set_defaults(run=run_predict, show=show_predict)
            continue
        p.add_argument(
            "--out", default="bench-results", help="folder for report.md, results.json, speedup.png"
        )
        p.add_argument(
            "--no-transformers", action="store_true", help="skip transformers' generate()"
        )
        p.add_argument(
            "--transformers-ks",
            nargs="*",
            type=int,
            default=[],
            help="also run transformers at each of these constant k",
        )
        p.add_argument(
            "--ks",
            nargs="*",
            type=int,
            default=None,
            help="fixed γ values to run (default: chosen by each drafter's measured cost)",
        )
        p.add_argument(
            "--policies",
            nargs="*",
            default=[x.value for x in DEFAULT_POLICIES],
            help=f"γ policies to run, of {', '.join(x.value for x in POLICIES)}",
        )
        p.add_argument(
            "--trees",
            nargs="*",
            type=int,
            default=[],
            help="tree sizes (nodes per round) to run, for drafters that draft trees, "
            "and an adaptive tree over them",
        )
        p.set_defaults(run=run_bench, show=show_bench)


def check_arguments(args: argparse.Namespace) -> None:
    """Every flag, checked before the model loads."""
    check_model_flags(args)
    for workload in args.workloads:
        _checks.choice(workload, "--workloads", workloads.WORKLOADS)
        available = len(workloads.prompts(workload))
        _checks.integer(args.prompts, "--prompts", minimum=1, maximum=available)
    for t in args.temperatures:
        _checks.real(t, "--temperatures", minimum=0.0)
    _checks.integer(args.max_new_tokens, "--max-new-tokens", minimum=1, maximum=MAX_NEW_TOKENS)
    _checks.integer(args.k_max, "--k-max", minimum=1, maximum=MAX_K_MAX)
    _checks.integer(args.repeats, "--repeats", minimum=1, maximum=100_000)
    check_drafter_specs(args.drafters)
    for k in getattr(args, "ks", None) or []:
        _checks.integer(k, "--ks", minimum=1, maximum=MAX_K)
    for k in getattr(args, "transformers_ks", None) or []:
        _checks.integer(k, "--transformers-ks", minimum=1, maximum=MAX_K)
    for policy in getattr(args, "policies", None) or []:
        _checks.choice(policy, "--policies", [x.value for x in POLICIES])
    for n in getattr(args, "trees", None) or []:
        _checks.integer(n, "--trees", minimum=1, maximum=MAX_TREE_SIZE)
    if getattr(args, "out", None) is not None:
        _checks.writable_dir(args.out, "--out")


def build_job(args: argparse.Namespace) -> Job:
    """The flags' job: the model loaded, the drafters built, the costs measured."""
    target, tokenizer = load_target(args)
    return Job.build(
        target,
        tokenizer,
        drafter_specs=args.drafters,
        workloads=args.workloads,
        temperatures=args.temperatures,
        prompts=args.prompts,
        max_new_tokens=args.max_new_tokens,
        k_max=args.k_max,
        seed=args.seed,
        repeats=args.repeats,
    )


def run_predict(args: argparse.Namespace, console: Console) -> PredictReport:
    check_arguments(args)
    job = build_job(args)
    with progress_bars(console) as progress:
        return predict(job, progress=progress)


def show_predict(r: PredictReport, console: Console) -> None:
    costs = r.costs
    v = ", ".join(f"{x:.2f}" for x in costs.verify_cost)
    console.print(
        f"target decode step {costs.target_step_s * 1e3:.1f} ms at {costs.context_tokens} "
        f"tokens of context; v(n) for n = 1..{len(costs.verify_cost)}: [{v}]"
    )
    header = [
        "γ",
        "α_γ",
        "tokens (handout)",
        "speedup (handout)",
        "tokens (per-position)",
        "speedup (per-position)",
        "tokens (replay)",
        "speedup (replay)",
    ]
    for res in r.results:
        fc = res.forecast
        rows = [
            [
                str(k),
                f"{res.position_alpha[i]:.3f}",
                f"{fc.tokens_handout[i]:.2f}",
                f"{fc.speedup_handout[i]:.2f}x",
                f"{fc.tokens_refined[i]:.2f}",
                f"{fc.speedup_refined[i]:.2f}x",
                f"{fc.tokens_replay[i]:.2f}",
                f"{fc.speedup_replay[i]:.2f}x",
            ]
            for i, k in enumerate(fc.k)
        ]
        title = (
            f"{res.drafter} on {res.workload}, temperature {res.temperature:g}: "
            f"α = {res.alpha:.3f}, c = {res.cost_ratio:.3f}"
        )
        console.print(table(title, header, rows))
        console.print(
            f"best γ: {fc.best_k_handout} (handout), {fc.best_k_refined} (per-position), "
            f"{fc.best_k_replay} (replay; 0 = do not speculate)"
        )
        if res.near_break_even:
            console.print(
                f"[yellow]warning[/]: c = {res.cost_ratio:.2f} is near or past the break-even "
                f"{res.break_even_cost:.2f} at this α: at batch 1 in eager PyTorch small "
                "models are limited by per-layer overhead, not bandwidth, so a smaller "
                "drafter is not much cheaper"
            )


def run_bench(args: argparse.Namespace, console: Console) -> bench.BenchReport:
    check_arguments(args)
    job = build_job(args)
    with progress_bars(console) as progress:
        report = bench.run_bench(
            job,
            transformers=not args.no_transformers,
            transformers_ks=args.transformers_ks,
            ks=args.ks,
            policies=args.policies,
            trees=args.trees,
            progress=progress,
        )
    write_bench(report, args.out)
    return report


def show_bench(r: bench.BenchReport, console: Console) -> None:
    console.out(bench_markdown(r), highlight=False)
