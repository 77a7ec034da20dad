"""Bench reports as Markdown, JSON and a plot; one Markdown table helper."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from specdec_rs import _checks, _files
from specdec_rs._files import json_safe
from specdec_rs.measure import plotting
from specdec_rs.measure.bench import BenchReport, BenchRow
from specdec_rs.measure.tables import fmt, markdown_table


def to_json(report: Any, indent: int | None = None) -> str:
    """A report as JSON, NaN written as null: its `summary()` where it has
    one (a flat view, e.g. a generation's), else its dataclass fields, or a dict."""
    is_instance = dataclasses.is_dataclass(report) and not isinstance(report, type)
    summary = getattr(report, "summary", None)
    data = summary() if callable(summary) else dataclasses.asdict(report) if is_instance else report
    return json.dumps(json_safe(data), indent=indent)


def bench_row_cells(row: BenchRow) -> list[str]:
    t, p = row.totals, row.predicted
    tokens_pred = speed_pred = "-"
    if p is not None:
        tokens_pred = f"{p.tokens_handout:.2f} / {p.tokens_refined:.2f} / {p.tokens_replay:.2f}"
        speed_pred = f"{p.speedup_handout:.2f} / {p.speedup_refined:.2f} / {p.speedup_replay:.2f}"
    return [
        t.drafter,
        t.method.label,
        fmt(t.alpha, ".3f"),
        ", ".join(fmt(a, ".2f") for a in t.alpha_by_position[:4]) or "-",
        fmt(t.tokens_per_pass, ".2f"),
        tokens_pred,
        f"{t.tokens_per_second:.1f}",
        f"{row.speedup:.2f}x",
        fmt(row.decode_speedup, ".2f"),
        speed_pred,
    ]


BENCH_HEADER = [
    "drafter",
    "method",
    "α",
    "α by position (1-4)",
    "tokens/pass",
    "predicted: handout / per-position / replay",
    "tokens/s",
    "speedup",
    "decode speedup",
    "predicted: handout / per-position / replay",
]


def bench_markdown(report: BenchReport) -> str:
    costs = report.costs
    v = ", ".join(f"{x:.2f}" for x in costs.verify_cost)
    cs = ", ".join(
        f"{spec} {c:.3f}"
        + "".join(
            f", {spec} {part} {pc:.3f}" for part, pc in costs.part_cost_ratio.get(spec, {}).items()
        )
        for spec, c in costs.cost_ratio.items()
    )
    lines = [
        f"Target decode step {costs.target_step_s * 1e3:.1f} ms at {costs.context_tokens} "
        f"tokens of context; v(n), n = 1..{len(costs.verify_cost)}: {v}; c: {cs}.",
        f"{report.prompts} prompts per workload, {report.max_new_tokens} new tokens, "
        f"seed {report.seed}.",
    ]
    for workload, temperature in report.settings():
        rows = [
            bench_row_cells(r)
            for r in report.rows
            if (r.totals.workload, r.totals.temperature) == (workload, temperature)
        ]
        lines += ["", f"### {workload}, temperature {temperature:g}", ""]
        lines.append(markdown_table(BENCH_HEADER, rows, "ll" + "r" * 7))
    return "\n".join(lines) + "\n"


def plot_bench(report: BenchReport, path: Path) -> None:
    """Predicted (handout, per-position, replay) and measured decode speedup
    against γ, one panel per setting."""
    plt = plotting.pyplot()
    settings = report.settings()
    fig, axes = plt.subplots(1, len(settings), figsize=(5 * len(settings), 4), squeeze=False)
    for ax, (workload, temperature) in zip(axes[0], settings, strict=True):
        results = [
            r
            for r in report.predictions.results
            if (r.workload, r.temperature) == (workload, temperature)
        ]
        for n, res in enumerate(results):
            color, fc = f"C{n % 10}", res.forecast
            ax.plot(fc.k, fc.speedup_handout, ":", color=color, label=f"{res.drafter} handout")
            ax.plot(
                fc.k, fc.speedup_refined, "--", color=color, label=f"{res.drafter} per-position"
            )
            ax.plot(fc.k, fc.speedup_replay, "-.", color=color, label=f"{res.drafter} replay")
            points = sorted(
                (r.totals.method.k or 0, r.decode_speedup)
                for r in report.rows
                if (r.totals.workload, r.totals.temperature, r.totals.drafter)
                == (workload, temperature, res.drafter)
                and r.predicted is not None
                and r.decode_speedup is not None
            )
            if points:
                ax.plot(
                    *zip(*points, strict=True),
                    "o-",
                    color=color,
                    label=f"{res.drafter} measured (decode)",
                )
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_title(f"{workload}, temperature {temperature:g}")
        ax.set_xlabel("γ (drafts per round)")
        ax.set_ylabel("speedup over target-only (×)")
        ax.legend(fontsize=6)
    plotting.save(fig, path)


def write_bench(report: BenchReport, out: Any) -> Path:
    """results.json, report.md and speedup.png into the folder `out`."""
    folder = _checks.writable_dir(out, "out")
    _files.write_text(folder / "results.json", to_json(report, indent=1))
    _files.write_text(folder / "report.md", bench_markdown(report))
    plot_bench(report, folder / "speedup.png")
    return folder


def write_results(out: Any, record: Any, table: str) -> Path:
    """A benchmark script's results in folder `out`: results.json (`record`,
    non-finite numbers as null) and table.md (`table`, Markdown). Returns the folder."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(
        _files.to_json(json_safe(record), what="the results", indent=1) + "\n"
    )
    (folder / "table.md").write_text(table + "\n", encoding="utf-8")
    return folder
