"""`specdec predict` and `specdec bench`: what speed to expect before running,
and what was measured, next to each other. p = target, q = draft, k = γ.

  specdec predict [--drafters prompt-lookup early-exit:24 truncated:8] [--prompts 20]
                  [--max-new-tokens 128] [--temperatures 0 0.7] [--k-max 8] [--json]
  specdec bench   [same options] [--out bench-results]   writes report.md, results.json, speedup.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress

import specdec_rs as sd
from specdec_rs import _checks, measure, plotting, workloads
from specdec_rs.cli_generate import check_spec, load_target, make_drafter
from specdec_rs.generate import eos_set
from specdec_rs.policy import AdaptiveK, HeuristicK
from specdec_rs.processors import SamplingConfig

DEFAULT_DRAFTERS = ["prompt-lookup", "early-exit:24", "truncated:8"]


def add_parsers(sub: Any) -> None:
    for name, text in (
        ("predict", "teacher-forced α, measured c and v(n), predicted speedup per γ"),
        ("bench", "real generation per γ next to the prediction; Markdown, JSON and a plot"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--drafters", nargs="+", default=DEFAULT_DRAFTERS)
        p.add_argument("--workloads", nargs="+", default=list(workloads.WORKLOADS))
        p.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 0.7])
        p.add_argument("--prompts", type=int, default=20 if name == "predict" else 3)
        p.add_argument("--max-new-tokens", type=int, default=128 if name == "predict" else 96)
        p.add_argument("--k-max", type=int, default=8)
        p.add_argument(
            "--repeats",
            type=int,
            default=100,
            help="timed repetitions per cost measurement (medians; v(n) uses a sixth)",
        )
        p.add_argument("--seed", type=int, default=0)
        p.add_argument(
            "--model", default=None, help="local transformers model folder (default: SmolLM2)"
        )
        p.add_argument("--json", action="store_true")
        if name == "bench":
            p.add_argument(
                "--out",
                default="bench-results",
                help="folder for report.md, results.json, speedup.png",
            )
            p.add_argument(
                "--no-transformers",
                action="store_true",
                help="skip transformers' assisted generation",
            )


MAX_K = 64  # longest γ measured


def check_arguments(args: argparse.Namespace) -> None:
    """Every flag, checked before the model loads."""
    for workload in args.workloads:
        _checks.choice(workload, "--workloads", workloads.WORKLOADS)
        available = len(workloads.prompts(workload))
        _checks.integer(args.prompts, "--prompts", minimum=1, maximum=available)
    for t in args.temperatures:
        SamplingConfig(t)
    _checks.integer(args.max_new_tokens, "--max-new-tokens", minimum=1)
    _checks.integer(args.k_max, "--k-max", minimum=1, maximum=MAX_K)
    _checks.integer(args.repeats, "--repeats", minimum=1, maximum=100_000)
    _checks.seed(args.seed, "--seed")
    if not args.drafters:
        raise ValueError("--drafters needs at least one drafter")
    for spec in args.drafters:
        if check_spec(spec) == "none":
            raise ValueError(
                "--drafters none: target-only is always measured as the baseline; "
                "list only drafters"
            )
    if getattr(args, "out", None) is not None:
        _checks.writable_dir(args.out, "--out")


def measure_costs(
    target: Any, tokenizer: Any, specs: list[str], k_max: int, repeats: int = 100
) -> dict[str, Any]:
    """Target step time, v(1..k_max+1) and each drafter's c, at a real prompt's context."""
    context = workloads.encode(tokenizer, workloads.prompts("code")[0])
    step = measure.decode_step_time(target, context, repeats=repeats)
    v = measure.verify_cost_curve(
        target, context, max_n=k_max + 1, repeats=max(1, repeats * 3 // 20)
    )
    costs = {}
    for spec in specs:
        drafter = make_drafter(spec, target, tokenizer, greedy=False)
        c = measure.drafter_step_time(drafter, target, context, repeats=repeats) / step
        costs[spec] = c
    return {
        "context_tokens": len(context),
        "target_step_s": step,
        "verify_cost": v,
        "cost_ratio": costs,
    }


def run_predict(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    check_arguments(args)
    target, tokenizer = load_target(args.model)
    costs = measure_costs(target, tokenizer, args.drafters, args.k_max, args.repeats)
    return run_predict_with(target, tokenizer, args, costs, {}, console)


def run_predict_with(
    target: Any,
    tokenizer: Any,
    args: argparse.Namespace,
    costs: dict[str, Any],
    answers: dict[Any, list[int]],
    console: Console,
) -> dict[str, Any]:
    """Teacher-forced acceptance and predictions per (workload, temperature,
    drafter); target answers come from `answers` (workload, T, i) or are generated."""
    import torch

    results = []
    with Progress(console=console, transient=True) as progress:
        for workload in args.workloads:
            messages = workloads.prompts(workload)[: args.prompts]
            prompts = [workloads.encode(tokenizer, m) for m in messages]
            for temperature in args.temperatures:
                config = SamplingConfig(temperature)
                task = progress.add_task(
                    f"predict {workload} T={temperature:g}", total=len(prompts)
                )
                texts = []
                for i, ids in enumerate(prompts):
                    tokens = answers.get((workload, temperature, i))
                    if tokens is None:
                        tokens = sd.generate(
                            target,
                            None,
                            ids,
                            max_new_tokens=args.max_new_tokens,
                            temperature=temperature,
                            seed=args.seed + i,
                        ).tokens
                    texts.append((ids, torch.tensor(tokens, dtype=torch.long)))
                    progress.advance(task)
                for spec in args.drafters:
                    drafter = make_drafter(spec, target, tokenizer, greedy=False)
                    mats = [
                        measure.acceptance_matrix(target, drafter, ids, ans, config, args.k_max)
                        for ids, ans in texts
                        if len(ans) >= args.k_max
                    ]
                    results.append(prediction_row(workload, temperature, spec, mats, costs))
    return {
        "costs": costs,
        "results": results,
        "prompts": args.prompts,
        "max_new_tokens": args.max_new_tokens,
    }


def prediction_row(
    workload: str, temperature: float, spec: str, mats: list[Any], costs: dict[str, Any]
) -> dict[str, Any]:
    acc = measure.summarize(mats)
    c = costs["cost_ratio"][spec]
    pred = measure.predict(acc, c, costs["verify_cost"])
    return {
        "workload": workload,
        "temperature": temperature,
        "drafter": spec,
        "alpha": acc.alpha,
        "position_alpha": acc.position_alpha,
        "positions": acc.positions,
        "cost_ratio": c,
        "break_even_cost": pred.break_even_cost,
        "near_break_even": c > 0.8 * pred.break_even_cost,
        "prediction": pred.__dict__,
    }


def show_predict(r: dict[str, Any], console: Console) -> None:
    from rich.table import Table

    costs = r["costs"]
    v = ", ".join(f"{x:.2f}" for x in costs["verify_cost"])
    console.print(
        f"target decode step {costs['target_step_s'] * 1e3:.1f} ms at "
        f"{costs['context_tokens']} tokens of context; "
        f"v(n) for n = 1..{len(costs['verify_cost'])}: [{v}]"
    )
    for res in r["results"]:
        pred = res["prediction"]
        t = Table(
            title=f"{res['drafter']} on {res['workload']}, temperature {res['temperature']:g}: "
            f"α = {res['alpha']:.3f}, c = {res['cost_ratio']:.3f}"
        )
        for col in (
            "γ",
            "α_γ",
            "tokens (handout)",
            "speedup (handout)",
            "tokens (per-position)",
            "speedup (per-position)",
            "tokens (replay)",
            "speedup (replay)",
        ):
            t.add_column(col, justify="right")
        for i, k in enumerate(pred["k"]):
            t.add_row(
                str(k),
                f"{res['position_alpha'][i]:.3f}",
                f"{pred['tokens_handout'][i]:.2f}",
                f"{pred['speedup_handout'][i]:.2f}x",
                f"{pred['tokens_refined'][i]:.2f}",
                f"{pred['speedup_refined'][i]:.2f}x",
                f"{pred['tokens_replay'][i]:.2f}",
                f"{pred['speedup_replay'][i]:.2f}x",
            )
        console.print(t)
        console.print(
            f"best γ: {pred['best_k_handout']} (handout), "
            f"{pred['best_k_refined']} (per-position), {pred['best_k_replay']} (replay; "
            "0 = do not speculate)"
        )
        if res["near_break_even"]:
            console.print(
                f"[yellow]warning[/]: c = {res['cost_ratio']:.2f} is near or past the break-even "
                f"{res['break_even_cost']:.2f} at this α: at batch 1 in eager PyTorch small "
                "models are limited by per-layer overhead, not bandwidth, so a smaller "
                "drafter is not much cheaper"
            )


def ks_for(spec: str, k_max: int) -> list[int]:
    """γ values measured per drafter: model drafters cost c per draft, so short lists."""
    if spec == "prompt-lookup":
        return [k for k in (1, 2, 4, 6, 8) if k <= k_max]
    return [k for k in (1, 2, 3) if k <= k_max]


def hf_strategy(spec: str, drafter: Any) -> dict[str, Any]:
    """transformers' generate() keywords for the matching drafter, its defaults otherwise."""
    if spec == "prompt-lookup":
        return {"prompt_lookup_num_tokens": 10}
    if isinstance(drafter, sd.EarlyExit):
        return {"assistant_early_exit": drafter.num_layers}
    return {"assistant_model": drafter.model}


def run_bench(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    """Measured generation per drafter and γ, with the prediction for the same prompts."""
    from specdec_rs.hf import hf_generate

    check_arguments(args)
    target, tokenizer = load_target(args.model)
    costs = measure_costs(target, tokenizer, args.drafters, args.k_max, args.repeats)
    eos = sorted(eos_set(None, target))
    runs: list[dict[str, Any]] = []
    answers: dict[Any, Any] = {}
    with Progress(console=console, transient=True) as progress:
        for workload in args.workloads:
            prompts = [
                workloads.encode(tokenizer, m) for m in workloads.prompts(workload)[: args.prompts]
            ]
            for temperature in args.temperatures:
                config = SamplingConfig(temperature)
                jobs: list[tuple[str, str, Any]] = [("none", "target-only", 1)]
                for spec in args.drafters:
                    c = costs["cost_ratio"][spec]
                    jobs += [(spec, f"k={k}", k) for k in ks_for(spec, args.k_max)]
                    jobs += [
                        (spec, "adaptive", ("adaptive", c)),
                        (spec, "heuristic", ("heuristic", 0)),
                    ]
                    if not args.no_transformers:
                        jobs.append((spec, "transformers", None))
                task = progress.add_task(
                    f"bench {workload} T={temperature:g}", total=len(prompts) * len(jobs)
                )
                for i, ids in enumerate(prompts):
                    for spec, label, k in jobs:
                        drafter = make_drafter(spec, target, tokenizer, greedy=False)
                        row = {
                            "workload": workload,
                            "temperature": temperature,
                            "drafter": spec,
                            "method": label,
                            "prompt": i,
                        }
                        if k is None:
                            r = hf_generate(
                                target,
                                ids,
                                max_new_tokens=args.max_new_tokens,
                                config=config,
                                seed=args.seed + i,
                                eos_token_id=eos,
                                **hf_strategy(spec, drafter),
                            )
                            row |= {
                                "tokens": r.new_tokens,
                                "seconds": r.time_total,
                                "prefill": None,
                                "passes": 0,
                                "kept": 0,
                                "checked": 0,
                            }
                        else:
                            if isinstance(k, tuple):
                                k = (
                                    AdaptiveK(k[1], costs["verify_cost"], k_max=args.k_max)
                                    if k[0] == "adaptive"
                                    else HeuristicK()
                                )
                            out = sd.generate(
                                target,
                                drafter,
                                ids,
                                max_new_tokens=args.max_new_tokens,
                                k=k,
                                temperature=temperature,
                                seed=args.seed + i,
                            )
                            if spec == "none":
                                answers[(workload, temperature, i)] = out.tokens
                            row |= {
                                "tokens": out.new_tokens,
                                "seconds": out.time_total,
                                "prefill": out.time_prefill,
                                "passes": out.rounds,
                                "kept": sum(out.accepted),
                                "checked": sum(out.reached),
                            }
                        runs.append(row)
                        progress.advance(task)
    predicted = run_predict_with(target, tokenizer, args, costs, answers, console)
    table = aggregate(runs, predicted)
    result = {
        "costs": costs,
        "rows": table,
        "runs": runs,
        "predictions": predicted,
        "prompts": args.prompts,
        "max_new_tokens": args.max_new_tokens,
        "seed": args.seed,
    }
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(result, indent=1))
    (out_dir / "report.md").write_text(markdown_report(result))
    plot_speedups(result, out_dir / "speedup.png")
    return result


def aggregate(runs: list[dict[str, Any]], predicted: dict[str, Any]) -> list[dict[str, Any]]:
    """Totals per (workload, T, drafter, method) over prompts, with the speedup
    against target-only in the same setting (wall time, and decode only: the
    prefill excluded, which is what the predictions describe) and the
    prediction at that γ."""
    sums: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in runs:
        key = (r["workload"], r["temperature"], r["drafter"], r["method"])
        s = sums.setdefault(
            key, {"tokens": 0, "seconds": 0.0, "prefill": 0.0, "passes": 0, "kept": 0, "checked": 0}
        )
        for f in s:
            s[f] = None if s[f] is None or r[f] is None else s[f] + r[f]
    preds = {(p["workload"], p["temperature"], p["drafter"]): p for p in predicted["results"]}
    rows = []
    for (workload, temperature, spec, method), s in sums.items():
        base = sums[(workload, temperature, "none", "target-only")]
        tps = s["tokens"] / s["seconds"]
        decode = None
        if s["prefill"] is not None and base["prefill"] is not None:
            base_decode = base["tokens"] / (base["seconds"] - base["prefill"])
            decode = s["tokens"] / (s["seconds"] - s["prefill"]) / base_decode
        row: dict[str, Any] = {
            "workload": workload,
            "temperature": temperature,
            "drafter": spec,
            "method": method,
            "tokens_per_second": tps,
            "tokens_per_pass": s["tokens"] / s["passes"] if s["passes"] else None,
            "alpha": s["kept"] / s["checked"] if s["checked"] else None,
            "speedup": tps / (base["tokens"] / base["seconds"]),
            "decode_speedup": decode,
        }
        p = preds.get((workload, temperature, spec))
        if p is not None and method.startswith("k="):
            i = int(method[2:]) - 1
            pr = p["prediction"]
            row |= {
                f"predicted_{what}_{how}": pr[f"{what}_{how}"][i]
                for what in ("tokens", "speedup")
                for how in ("handout", "refined", "replay")
            }
        rows.append(row)
    return rows


def _f(x: Any, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def markdown_report(result: dict[str, Any]) -> str:
    costs = result["costs"]
    v = ", ".join(f"{x:.2f}" for x in costs["verify_cost"])
    cs = ", ".join(f"{k} {c:.3f}" for k, c in costs["cost_ratio"].items())
    lines = [
        f"Target decode step {costs['target_step_s'] * 1e3:.1f} ms at {costs['context_tokens']} "
        f"tokens of context; v(n), n = 1..{len(costs['verify_cost'])}: {v}; c: {cs}.",
        f"{result['prompts']} prompts per workload, {result['max_new_tokens']} new tokens, "
        f"seed {result['seed']}.",
    ]
    settings = dict.fromkeys((r["workload"], r["temperature"]) for r in result["rows"])
    for workload, temperature in settings:
        lines += [
            "",
            f"### {workload}, temperature {temperature:g}",
            "",
            "| drafter | γ | α | tokens/pass | predicted: handout / per-position / replay "
            "| tokens/s | speedup | decode speedup | predicted: handout / per-position / replay |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in result["rows"]:
            if (r["workload"], r["temperature"]) != (workload, temperature):
                continue
            pt, ps = (
                " / ".join(
                    format(r[f"predicted_{what}_{how}"], fmt)
                    for how in ("handout", "refined", "replay")
                )
                if "predicted_tokens_handout" in r
                else "-"
                for what, fmt in (("tokens", ".2f"), ("speedup", ".2f"))
            )
            lines.append(
                f"| {r['drafter']} | {r['method']} | {_f(r['alpha'], '.3f')} "
                f"| {_f(r['tokens_per_pass'], '.2f')} | {pt} | {r['tokens_per_second']:.1f} "
                f"| {r['speedup']:.2f}x | {_f(r['decode_speedup'], '.2f')} | {ps} |"
            )
    return "\n".join(lines) + "\n"


def plot_speedups(result: dict[str, Any], path: Path) -> None:
    """Predicted (handout, per-position, replay) and measured decode speedup
    against γ, one panel per setting."""
    plt = plotting.pyplot()

    settings = list(dict.fromkeys((r["workload"], r["temperature"]) for r in result["rows"]))
    fig, axes = plt.subplots(1, len(settings), figsize=(5 * len(settings), 4), squeeze=False)
    for ax, (workload, temperature) in zip(axes[0], settings, strict=True):
        for n, p in enumerate(result["predictions"]["results"]):
            if (p["workload"], p["temperature"]) != (workload, temperature):
                continue
            color = f"C{n % 10}"
            pr = p["prediction"]
            ax.plot(
                pr["k"], pr["speedup_handout"], ":", color=color, label=f"{p['drafter']} handout"
            )
            ax.plot(
                pr["k"],
                pr["speedup_refined"],
                "--",
                color=color,
                label=f"{p['drafter']} per-position",
            )
            ax.plot(
                pr["k"], pr["speedup_replay"], "-.", color=color, label=f"{p['drafter']} replay"
            )
            pts = [
                (int(r["method"][2:]), r["decode_speedup"])
                for r in result["rows"]
                if (r["workload"], r["temperature"], r["drafter"])
                == (workload, temperature, p["drafter"])
                and r["method"].startswith("k=")
            ]
            if pts:
                ax.plot(
                    *zip(*sorted(pts), strict=True),
                    "o-",
                    color=color,
                    label=f"{p['drafter']} measured (decode)",
                )
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_title(f"{workload}, temperature {temperature:g}")
        ax.set_xlabel("γ (drafts per round)")
        ax.set_ylabel("speedup over target-only (×)")
        ax.legend(fontsize=6)
    plotting.save(fig, path)


def show_bench(r: dict[str, Any], console: Console) -> None:
    console.out(markdown_report(r), highlight=False)


def run(args: argparse.Namespace, console: Console) -> tuple[dict[str, Any], Any]:
    if args.command == "predict":
        return run_predict(args, console), show_predict
    return run_bench(args, console), show_bench
