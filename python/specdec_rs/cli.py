"""The `specdec` command. Subcommands mirror the Python keyword arguments;
`--json` prints one machine-readable object.

  specdec simulate [--k 2] [--runs 1000000] [--variant exact] [--seed 0] [--json]
  specdec theory --alpha 0.6 0.8 --cost 0.05 [--k-max 10] [--json]
  specdec generate "PROMPT" [--drafter prompt-lookup] [--k 4] ... [--json]
  specdec demo [--max-new-tokens 64] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any, NoReturn

import numpy as np
from rich.console import Console
from rich.table import Table

import specdec_rs as sd
from specdec_rs import _checks, cli_generate, cli_measure, plotting
from specdec_rs.experiments import CHAIN_P, CHAIN_Q, EXACT_PAIRS

# The handout's i.i.d. pair (α = 0.8); its 3-token chain lives in experiments.py.
IID_P = np.array([[0.5, 0.3, 0.2]])
IID_Q = np.array([[0.3, 0.3, 0.4]])


def run_simulate(
    *, k: int, runs: int, variant: str, seed: int, threads: int | None
) -> dict[str, Any]:
    """Two-token law on the chain vs p(a|0)p(b|a), and round lengths vs theory."""
    t0 = time.perf_counter()
    hist = sd.simulate(
        CHAIN_P,
        CHAIN_Q,
        k=k,
        runs=runs,
        num_tokens=2,
        start=0,
        variant=variant,
        seed=seed,
        threads=threads,
    )
    t_pairs = time.perf_counter() - t0
    exact = EXACT_PAIRS
    empirical = hist / hist.sum()
    tv = float(np.abs(empirical - exact).sum() / 2)
    # sampling noise of TV for `runs` exact runs: sqrt(Σ p(1-p)/n) * sqrt(2/π) / 2 per cell, summed
    noise = float(np.sqrt(exact * (1 - exact) / runs).sum() * np.sqrt(2 / np.pi) / 2)
    t0 = time.perf_counter()
    lengths = sd.simulate_round_lengths(
        IID_P, IID_Q, k=k, rounds=runs, variant=variant, seed=seed, threads=threads
    )
    t_rounds = time.perf_counter() - t0
    alpha = sd.acceptance_rate(IID_P[0], IID_Q[0])
    mean = float((lengths * np.arange(k + 2)).sum() / lengths.sum())
    return {
        "k": k,
        "runs": runs,
        "variant": variant,
        "seed": seed,
        "pairs": {
            "empirical": empirical.tolist(),
            "exact": exact.tolist(),
            "tv": tv,
            "tv_expected_noise": noise,
        },
        "round_lengths": {
            "alpha": alpha,
            "counts": lengths.tolist(),
            "mean": mean,
            "theory": sd.expected_tokens(alpha, k),
            "speedup_at_c_0.05": sd.expected_speedup(alpha, k, 0.05),
        },
        "rounds_per_second": runs / t_rounds,
        "seconds": {"pairs": t_pairs, "round_lengths": t_rounds},
    }


def show_simulate(r: dict[str, Any], console: Console) -> None:
    pairs = r["pairs"]
    t = Table(
        title=f"First two tokens after token 0 (k = {r['k']}, {r['runs']:,} runs, "
        f"variant {r['variant']}, seed {r['seed']})"
    )
    for col in ("pair (a, b)", "empirical", "exact p(a|0)p(b|a)", "difference"):
        t.add_column(col, justify="right")
    for a in range(3):
        for b in range(3):
            e, x = pairs["empirical"][a][b], pairs["exact"][a][b]
            t.add_row(f"({a}, {b})", f"{e:.4f}", f"{x:.4f}", f"{e - x:+.4f}")
    console.print(t)
    console.print(
        f"TV distance {pairs['tv']:.4f} (sampling noise of an exact sampler at this "
        f"size: about {pairs['tv_expected_noise']:.4f})"
    )
    rl = r["round_lengths"]
    t = Table(title=f"Tokens per round, prefix-independent p, q with α = {rl['alpha']:.2f}")
    for col in ("tokens", "rounds", "share", "theory"):
        t.add_column(col, justify="right")
    a, k, n = rl["alpha"], r["k"], sum(rl["counts"])
    for m in range(1, k + 2):
        theory = a ** (m - 1) * (1 - a) if m <= k else a**k
        t.add_row(str(m), f"{rl['counts'][m]:,}", f"{rl['counts'][m] / n:.4f}", f"{theory:.4f}")
    console.print(t)
    console.print(
        f"mean {rl['mean']:.4f} tokens per target pass; theory (1 − α^(k+1))/(1 − α) = "
        f"{rl['theory']:.4f}; predicted speedup at c = 0.05: "
        f"{rl['speedup_at_c_0.05']:.2f}x"
    )
    console.print(f"engine: {r['rounds_per_second'] / 1e6:.1f} million rounds/s")


THEORY_MAX_ROWS = 1000  # the table prints one row per γ


def run_theory(*, alphas: Sequence[float], cost: float, k_max: int) -> dict[str, Any]:
    k_max = _checks.integer(
        k_max, "--k-max", minimum=1, maximum=THEORY_MAX_ROWS
    )  # one table row per γ
    if not alphas:
        raise ValueError("--alpha needs at least one acceptance rate")
    rows = [
        {
            "k": k,
            **{
                f"{a:g}": {
                    "tokens": sd.expected_tokens(a, k),
                    "speedup": sd.expected_speedup(a, k, cost),
                }
                for a in alphas
            },
        }
        for k in range(1, k_max + 1)
    ]
    best = {}
    for a in alphas:
        k = sd.best_k(a, cost, k_max)
        # break-even at the best γ; at γ = 1 when no γ pays (best_k = 0)
        best[f"{a:g}"] = {"k": k, "break_even_cost_at_best_k": sd.break_even_cost(a, max(k, 1))}
    return {"cost_ratio": cost, "table": rows, "best": best}


def show_theory(r: dict[str, Any], console: Console) -> None:
    t = Table(title=f"Tokens per target pass and speedup, c = {r['cost_ratio']:g}")
    t.add_column("γ", justify="right")
    for a in r["best"]:
        t.add_column(f"α = {a}: tokens", justify="right")
        t.add_column("speedup", justify="right")
    for row in r["table"]:
        cells = [str(row["k"])]
        for a in r["best"]:
            cells += [f"{row[a]['tokens']:.2f}", f"{row[a]['speedup']:.2f}x"]
        t.add_row(*cells)
    console.print(t)
    for a, b in r["best"].items():
        console.print(
            f"α = {a}: best γ = {b['k']}" + (" (speculation does not pay)" if b["k"] == 0 else "")
        )


def run_experiments(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    from rich.progress import Progress

    from specdec_rs import experiments

    out = _checks.writable_dir(args.out, "--out")

    command = (
        "specdec experiments " + " ".join(sys.argv[2:])
        if sys.argv[1:2] == ["experiments"]
        else (f"specdec experiments --out {args.out} --seed {args.seed}")
    )
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("experiments", total=len(experiments.EXPERIMENTS))
        result = experiments.run_all(
            out, _checks.seed(args.seed, "--seed"), command, lambda: progress.advance(task)
        )
    return {"out": args.out, "seed": args.seed, **result}


def show_experiments(r: dict[str, Any], console: Console) -> None:
    from pathlib import Path

    console.out((Path(r["out"]) / "report.md").read_text(), highlight=False)
    console.print(f"figures and report written to {r['out']}/")


def plot_theory(r: dict[str, Any], path: str) -> None:
    plt = plotting.pyplot()

    fig, ax = plt.subplots(figsize=(6, 4))
    ks = [row["k"] for row in r["table"]]
    for a in r["best"]:
        ax.plot(ks, [row[a]["speedup"] for row in r["table"]], "o-", label=f"α = {a}")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xlabel("γ (drafts per round)")
    ax.set_ylabel("expected speedup (×)")
    ax.set_title(f"(1 − α^(γ+1)) / ((1 − α)(γc + 1)), c = {r['cost_ratio']:g}")
    ax.legend()
    plotting.save(fig, path)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (the subcommands inherit it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(prog="specdec", description="Exact speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("simulate", help="Monte Carlo check of exactness and tokens per round")
    s.add_argument("--k", type=int, default=2)
    s.add_argument("--runs", type=int, default=1_000_000)
    s.add_argument("--variant", default="exact", choices=sd.VARIANTS)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--threads", type=int, default=None)
    s.add_argument("--json", action="store_true")
    t = sub.add_parser("theory", help="tokens per pass and speedup for γ = 1..k_max")
    t.add_argument("--alpha", type=float, nargs="+", default=[0.6, 0.8])
    t.add_argument("--cost", type=float, default=0.05)
    t.add_argument("--k-max", type=int, default=10)
    t.add_argument("--plot", default=None, help="write speedup against γ to this PNG")
    t.add_argument("--json", action="store_true")
    e = sub.add_parser("experiments", help="toy-chain experiments: PNGs and a Markdown report")
    e.add_argument("--out", default="experiments")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--json", action="store_true")
    cli_generate.add_parsers(sub)
    cli_measure.add_parsers(sub)
    args = parser.parse_args(argv)
    console = Console()
    try:
        return _run(args, console)
    except ValueError as e:
        print(f"specdec: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("specdec: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `specdec ... | head`: the reader left; stop quietly
        sys.stderr.close()
        return 141
    except OSError as e:  # a file could not be written after the checks passed
        print(f"specdec: error: {_one_line(e)}", file=sys.stderr)
        return 1


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _run(args: argparse.Namespace, console: Console) -> int:
    """Run the subcommand and print its result (ValueError on bad input)."""
    show: Any
    if args.command in ("generate", "demo"):
        result, show = cli_generate.run(args, console)
    elif args.command in ("predict", "bench"):
        result, show = cli_measure.run(args, console)
    elif args.command == "experiments":
        result, show = run_experiments(args, console), show_experiments
    elif args.command == "simulate":
        result = run_simulate(
            k=args.k, runs=args.runs, variant=args.variant, seed=args.seed, threads=args.threads
        )
        show = show_simulate
    else:
        plot_path = _checks.output_file(args.plot, "--plot") if args.plot else None  # before work
        result = run_theory(alphas=args.alpha, cost=args.cost, k_max=args.k_max)
        show = show_theory
        if plot_path is not None:
            plot_theory(result, str(plot_path))
    if args.json:
        print(json.dumps(result))
    else:
        show(result, console)
    return 0
