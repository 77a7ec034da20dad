"""specdec simulate | theory | experiments: the toy-model subcommands.

specdec simulate [--k 2] [--runs 1000000] [--variant exact] [--seed 0] [--threads N] [--json]
specdec theory --alpha 0.6 0.8 --cost 0.05 [--k-max 10] [--plot speedup.png] [--json]
specdec experiments [--out experiments] [--seed 0]
specdec audit [chain block tree transformers] [--runs 20000] [--seed 0] [--json]
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rich.console import Console

from specdec_rs import _checks, testing, theory
from specdec_rs._core import VARIANTS
from specdec_rs.cli.show import table
from specdec_rs.measure.toychain import EngineCheck, engine_check


def add_parsers(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    s = sub.add_parser(
        "simulate", parents=parents, help="Monte Carlo check of exactness and tokens per round"
    )
    s.add_argument("--k", type=int, default=2)
    s.add_argument("--runs", type=int, default=1_000_000)
    s.add_argument("--variant", default="exact", choices=VARIANTS)
    s.add_argument("--threads", type=int, default=None)
    s.set_defaults(run=run_simulate, show=show_simulate)
    t = sub.add_parser("theory", parents=parents, help="tokens per pass and speedup per γ")
    t.add_argument("--alpha", type=float, nargs="+", default=[0.6, 0.8])
    t.add_argument("--cost", type=float, default=0.05)
    t.add_argument("--k-max", type=int, default=10)
    t.add_argument("--plot", default=None, help="write speedup against γ to this PNG")
    t.set_defaults(run=run_theory, show=show_theory)
    e = sub.add_parser(
        "experiments", parents=parents, help="toy-chain experiments: PNGs and a Markdown report"
    )
    e.add_argument("--out", default="experiments")
    e.set_defaults(run=run_experiments, show=show_experiments)
    a = sub.add_parser(
        "audit",
        parents=parents,
        help="statistical exactness audit of speculative verifiers (exit 1 if one fails)",
    )
    # a `type=` check, not `choices=`: argparse checks a nargs="*" default
    # against the choices as one value, and so refused the default "all"
    a.add_argument(
        "verifiers",
        nargs="*",
        type=audit_name,
        default=[],
        metavar="VERIFIER",
        help=f"which verifiers, of {', '.join(testing.AUDITS)} (default: all)",
    )
    a.add_argument(
        "--runs",
        type=int,
        default=testing.RUNS,
        help=f"generations per case ({testing.MIN_RUNS}..{testing.MAX_RUNS:,})",
    )
    a.set_defaults(run=run_audit, show=show_audit)


def audit_name(name: str) -> str:
    """One verifier name of `specdec audit` (argparse's `type=`)."""
    if name not in testing.AUDITS:
        raise argparse.ArgumentTypeError(
            f"invalid verifier {name!r} (choose from {', '.join(testing.AUDITS)})"
        )
    return name


def run_audit(args: argparse.Namespace, console: Console) -> testing.AuditReport:
    if not args.json:
        print("auditing (about 15 s per verifier)", file=sys.stderr, flush=True)
    return testing.run_audits(args.verifiers or testing.AUDITS, runs=args.runs, seed=args.seed)


def show_audit(r: testing.AuditReport, console: Console) -> None:
    rows = []
    for a in r.audits:
        for c in a.results:
            rows.append(
                [
                    a.verifier,
                    c.case,
                    f"{c.chi2_pvalue:.3g}",
                    f"{c.tv:.4f}",
                    f"{c.tv_threshold:.4f}",
                    c.note or ("ok" if c.passed else "FAIL"),
                ]
            )
        for name in a.skipped:
            rows.append([a.verifier, name, "", "", "", "skipped (cannot draw these children)"])
    header = ["verifier", "case", "chi² p", "TV", "threshold", "verdict"]
    console.print(table("Exactness audit", header, rows))
    for a in r.audits:
        console.print(f"{a.verifier}: [bold]{'PASS' if a.passed else 'FAIL'}[/bold]")
    fa = max((a.false_alarm for a in r.audits), default=0.0)
    console.print(
        f"{r.runs:,} generations per case; an exact verifier fails an audit with "
        f"probability <= {fa:.0e} (each test at significance {testing.SIGNIFICANCE:.0e})"
    )


LONG_RUN = 10**8  # runs that take seconds: say so before starting


def run_simulate(args: argparse.Namespace, console: Console) -> EngineCheck:
    if not args.json and isinstance(args.runs, int) and args.runs >= LONG_RUN:
        print(f"simulating {args.runs:,} runs (Ctrl-C stops)", file=sys.stderr, flush=True)
    return engine_check(
        k=args.k, runs=args.runs, variant=args.variant, seed=args.seed, threads=args.threads
    )


def show_simulate(r: EngineCheck, console: Console) -> None:
    pairs = r.pairs
    rows = [
        [f"({a}, {b})", f"{e:.4f}", f"{x:.4f}", f"{e - x:+.4f}"]
        for a in range(3)
        for b in range(3)
        for e, x in [(pairs.empirical[a][b], pairs.exact[a][b])]
    ]
    console.print(
        table(
            f"First two tokens after token 0 (k = {r.k}, {r.runs:,} runs, variant {r.variant}, "
            f"seed {r.seed})",
            ["pair (a, b)", "empirical", "exact p(a|0)p(b|a)", "difference"],
            rows,
        )
    )
    console.print(
        f"TV distance {pairs.tv:.4f} (sampling noise of an exact sampler at this size: "
        f"about {pairs.tv_expected_noise:.4f})"
    )
    rl = r.round_lengths
    n = sum(rl.counts)
    rows = [
        [str(m), f"{rl.counts[m]:,}", f"{rl.counts[m] / n:.4f}", f"{law:.4f}"]
        for m, law in zip(range(1, r.k + 2), rl.law(r.k), strict=True)
    ]
    console.print(
        table(
            f"Tokens per round, prefix-independent p, q with α = {rl.alpha:.2f}",
            ["tokens", "rounds", "share", "theory"],
            rows,
        )
    )
    console.print(
        f"mean {rl.mean:.4f} tokens per target pass; theory (1 − α^(k+1))/(1 − α) = "
        f"{rl.theory:.4f}; predicted speedup at c = 0.05: {rl.speedup_at_c_005:.2f}x"
    )
    console.print(f"engine: {r.rounds_per_second / 1e6:.1f} million rounds/s")


def run_theory(args: argparse.Namespace, console: Console) -> theory.TheoryTable:
    plot = _checks.output_file(args.plot, "--plot") if args.plot else None  # before any work
    if args.k_max > theory.TABLE_MAX_ROWS:
        raise ValueError(
            f"--k-max = {args.k_max} is out of range; expected <= {theory.TABLE_MAX_ROWS} "
            "(one table row per γ)"
        )
    result = theory.table(args.alpha, args.cost, args.k_max)
    if plot is not None:
        plot_theory(result, str(plot))
    return result


def show_theory(r: theory.TheoryTable, console: Console) -> None:
    header = ["γ"]
    for a in r.alphas:
        header += [f"α = {a:g}: tokens", "speedup"]
    rows = []
    for row in r.rows:
        cells = [str(row.k)]
        for tokens, speedup in zip(row.tokens, row.speedup, strict=True):
            cells += [f"{tokens:.2f}", f"{speedup:.2f}x"]
        rows.append(cells)
    console.print(table(f"Tokens per target pass and speedup, c = {r.cost_ratio:g}", header, rows))
    for a, k in zip(r.alphas, r.best_k, strict=True):
        console.print(
            f"α = {a:g}: best γ = {k}" + (" (speculation does not pay)" if k == 0 else "")
        )


def plot_theory(r: theory.TheoryTable, path: str) -> None:
    from specdec_rs.measure import plotting

    plt = plotting.pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    ks = [row.k for row in r.rows]
    for i, a in enumerate(r.alphas):
        ax.plot(ks, [row.speedup[i] for row in r.rows], "o-", label=f"α = {a:g}")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xlabel("γ (drafts per round)")
    ax.set_ylabel("expected speedup (×)")
    ax.set_title(f"(1 − α^(γ+1)) / ((1 − α)(γc + 1)), c = {r.cost_ratio:g}")
    ax.legend()
    plotting.save(fig, path)


def run_experiments(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    from specdec_rs.cli.show import progress_bars
    from specdec_rs.measure import experiments

    out = _checks.writable_dir(args.out, "--out")
    seed = _checks.seed(args.seed, "--seed")
    command = (
        "specdec experiments " + " ".join(sys.argv[2:])
        if sys.argv[1:2] == ["experiments"]
        else f"specdec experiments --out {args.out} --seed {seed}"
    )
    with progress_bars(console) as progress:
        advance = progress("experiments", len(experiments.EXPERIMENTS))
        result = experiments.run_all(out, seed, command, advance)
    return {"out": str(out), "seed": seed, **result}


def show_experiments(r: dict[str, Any], console: Console) -> None:
    from pathlib import Path

    console.out((Path(r["out"]) / "report.md").read_text(), highlight=False)
    console.print(f"figures and report written to {r['out']}/")
