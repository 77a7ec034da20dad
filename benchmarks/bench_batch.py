"""Why speculation helps less at a large batch: the measured answer.

For each workload (code, chat) and batch size B, the same prompts run
through `BatchEngine` (up to B rows at once, continuous batching) with
target-only rows, fixed γ and the goodput policy, for each drafter (prompt
lookup, the EAGLE head). Per setting: throughput (new tokens / wall clock,
prefills included) and decode goodput (tokens / seconds of the batch
rounds), the speedup over target-only at the same B (with --repeats R:
each setting's median of R runs, interleaved with the others'), tokens per pass,
acceptance by position, per-token latency of the rows (p50, p95 of each
row's seconds / tokens, its prefill included), the γ the policy chose; and
v(B, n) = T(B, n) / T(B, 1) from the engine's forward profile.

The cost model's prediction for fixed γ at batch B: speedup(B) ≈
τ · T(B, 1) / (T(B, γ + 1) + B · D), with τ the tokens per pass and D the
drafting seconds per row and round measured at B = 1, and T from the
profile; the batch where speculation stops paying is the first B whose best
predicted (measured) fixed-γ speedup is below 1.

    python benchmarks/bench_batch.py --out benchmarks/results/bench-batch
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import specdec_rs as sd
import torch
from specdec_rs import _files, drafters, models
from specdec_rs.engine import BatchEngine, BatchResult, Request
from specdec_rs.engine.build import engine_for
from specdec_rs.engine.profile import profile_forward
from specdec_rs.measure.plotting import pyplot, save
from specdec_rs.measure.tables import fmt, markdown_table
from specdec_rs.policy import ForwardProfile
from specdec_rs.prompts import workloads


@dataclass(frozen=True)
class Setting:
    workload: str
    batch: int
    drafter: str
    policy: str  # "none", "fixed", "goodput"
    k: int
    tokens: int
    wall_s: float
    tokens_per_second: float
    decode_goodput: float
    predicted_goodput: float | None
    tokens_per_pass: float
    acceptance: list[float]
    latency_p50_ms: float
    latency_p95_ms: float
    draft_s_per_round: float
    gammas: dict[int, int]

    @property
    def label(self) -> str:
        if self.policy == "none":
            return "target-only"
        k = f"γ={self.k}" if self.policy == "fixed" else "goodput"
        return f"{self.drafter} {k}"


def measure(
    workload: str, batch: int, drafter: str, policy: str, k: int, out: BatchResult
) -> Setting:
    results = [f.result for f in out.rows if f.result is not None]
    assert len(results) == len(out.rows), [f.error for f in out.rows if f.error]
    rounds = sum(r.rounds for r in results)
    reached = [0] * max((len(r.reached) for r in results), default=0)
    accepted = list(reached)
    for r in results:
        for i, (a, b) in enumerate(zip(r.accepted, r.reached, strict=True)):
            accepted[i] += a
            reached[i] += b
    per_token = sorted(r.time_total / max(1, r.new_tokens) * 1e3 for r in results)
    gammas: dict[int, int] = {}
    for s in out.steps:  # row rounds by the γ the policy gave them
        for k in s.ks or ():
            gammas[k] = gammas.get(k, 0) + 1
    return Setting(
        workload,
        batch,
        drafter,
        policy,
        k,
        out.new_tokens,
        out.time_total,
        out.tokens_per_second,
        out.measured_goodput,
        out.predicted_goodput,
        out.new_tokens / rounds if rounds else 0.0,
        [a / b if b else float("nan") for a, b in zip(accepted, reached, strict=True)],
        statistics.median(per_token),
        per_token[min(len(per_token) - 1, round(0.95 * (len(per_token) - 1)))],
        sum(r.time_draft for r in results) / rounds if rounds else 0.0,
        gammas,
    )


def run(
    target: Any,
    tokenizer: Any,
    built: dict[str, Any],
    spec: str,
    prompts: list[Any],
    batch: int,
    max_new: int,
    temperature: float,
    k: int,
    goodput: sd.Goodput | None,
) -> BatchResult:
    """The prompts through one engine of `batch` rows drafting by `spec`
    (its drafter from `built`) at γ `k`, or by `goodput`."""
    engine = engine_for(
        target, tokenizer, spec, k=k, goodput=goodput, built=built, max_batch=batch
    ).engine
    requests = [Request(p, max_new, temperature, seed=i) for i, p in enumerate(prompts)]
    return engine.run(requests)


def run_generate(
    target: Any, make: Any, prompts: list[Any], max_new: int, temperature: float, k: int
) -> float:
    """Today's `generate`, prompt after prompt (seed i, one drafter object):
    new tokens / wall clock, the B = 1 baseline of the batched path."""
    drafter = make() if make is not None else None
    started, tokens = time.perf_counter(), 0
    for i, p in enumerate(prompts):
        out = sd.generate(
            target, drafter, p, max_new_tokens=max_new, k=max(k, 1), temperature=temperature,
            seed=i,
        )  # fmt: skip
        tokens += out.new_tokens
    return tokens / (time.perf_counter() - started)


def predicted_speedups(
    settings: list[Setting],
    profile: ForwardProfile,
    batches: list[int],
    contexts: dict[str, float],
) -> dict[str, dict[int, float]]:
    """label -> B -> the cost model's speedup of each fixed-γ setting, from
    its B = 1 run, T at the workload's mean context."""
    out: dict[str, dict[int, float]] = {}
    for s in settings:
        if s.policy != "fixed" or s.batch != 1:
            continue
        at = contexts[s.workload]
        out[f"{s.workload}/{s.label}"] = {
            b: s.tokens_per_pass
            * profile.seconds(b, 1, at)
            / (profile.seconds(b, s.k + 1, at) + b * s.draft_s_per_round)
            for b in batches
        }
    return out


def stops_paying(speedups: dict[int, float]) -> int | None:
    """The first batch size whose speedup is below 1 (None: it always pays)."""
    return next((b for b, x in sorted(speedups.items()) if x < 1.0), None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--workloads", nargs="+", default=["code", "chat"])
    ap.add_argument("--drafters", nargs="+", default=["prompt-lookup", "eagle"])
    ap.add_argument("--ks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--k-max", type=int, default=6, help="the goodput policy's largest γ")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument(
        "--repeats", type=int, default=1, help="runs of each setting, interleaved (medians)"
    )
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/bench-batch"))
    args = ap.parse_args()

    target, tok = models.load_smollm2(weights="gguf")
    batches = sorted(set(args.batches))
    probe = BatchEngine(target, None, max_batch=max(batches))
    started = time.perf_counter()
    profile = profile_forward(
        probe, range(1, args.k_max + 2), batch_sizes=batches, context=128, long_context=512,
        repeats=5,
    )  # fmt: skip
    print(f"forward profile in {time.perf_counter() - started:.1f} s", flush=True)
    built = {name: drafters.from_spec(name, target, tok) for name in args.drafters}
    warm = workloads.encode(tok, workloads.prompts("chat")[0])
    for spec in ["none", *built]:  # warm every path once
        run(target, tok, built, spec, [warm, warm], 2, 8, args.temperature, 2, None)
    settings: list[Setting] = []
    versus: dict[tuple[str, str], tuple[float, float]] = {}  # (batched B = 1, generate) tok/s
    contexts: dict[str, float] = {}  # the mean context of a workload's rows
    for workload in args.workloads:
        messages = workloads.prompts(workload)
        texts = [messages[i % len(messages)] for i in range(args.prompts)]
        prompts = [workloads.encode(tok, m) for m in texts]
        contexts[workload] = sum(len(p) for p in prompts) / len(prompts) + args.max_new_tokens / 2
        for b in batches:
            todo: list[tuple[str, str, int, Any, sd.Goodput | None]] = [
                ("none", "none", 0, None, None)
            ]
            for name in args.drafters:
                todo += [(name, "fixed", k, drafters.copies(built[name]), None) for k in args.ks]
                goodput = sd.Goodput(k_max=args.k_max, profile=profile)
                todo.append((name, "goodput", args.k_max, drafters.copies(built[name]), goodput))
            runs: dict[int, list[Setting]] = {i: [] for i in range(len(todo))}
            alone: dict[int, list[float]] = {i: [] for i in range(len(todo))}
            for r in range(args.repeats):  # interleaved, each repeat in a rotated order
                for i in [*range(r % len(todo), len(todo)), *range(r % len(todo))]:
                    name, policy, k, make, goodput = todo[i]
                    out = run(
                        target, tok, built, name, prompts, b, args.max_new_tokens,
                        args.temperature, k, goodput,
                    )  # fmt: skip
                    s = measure(workload, b, name, policy, k, out)
                    runs[i].append(s)
                    print(
                        f"{workload} B={b} {s.label}: {s.tokens_per_second:.1f} tok/s, decode "
                        f"{s.decode_goodput:.1f}, tokens/pass {s.tokens_per_pass:.2f}, "
                        f"γ {s.gammas}",
                        flush=True,
                    )
                    if b == 1 and policy != "goodput":  # the same setting through generate
                        alone[i].append(
                            run_generate(
                                target, make, prompts, args.max_new_tokens, args.temperature, k
                            )
                        )
                        print(f"  generate: {alone[i][-1]:.1f} tok/s", flush=True)
            for i, done in runs.items():
                middle = sorted(done, key=lambda s: s.tokens_per_second)[(len(done) - 1) // 2]
                settings.append(middle)
                if alone[i]:
                    versus[(workload, middle.label)] = (
                        statistics.median(s.tokens_per_second for s in done),
                        statistics.median(alone[i]),
                    )
    write(args, settings, profile, batches, versus, contexts)


def write(
    args: argparse.Namespace,
    settings: list[Setting],
    profile: ForwardProfile,
    batches: list[int],
    versus: dict[tuple[str, str], tuple[float, float]],
    contexts: dict[str, float],
) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    base = {(s.workload, s.batch): s for s in settings if s.policy == "none"}
    speedup = {
        (s.workload, s.label, s.batch): s.tokens_per_second
        / base[(s.workload, s.batch)].tokens_per_second
        for s in settings
    }
    predicted = predicted_speedups(settings, profile, batches, contexts)
    rows = []
    for s in settings:
        rows.append(
            [
                s.workload,
                str(s.batch),
                s.label,
                fmt(s.tokens_per_second, ".1f"),
                fmt(speedup[(s.workload, s.label, s.batch)], ".2f"),
                fmt(s.decode_goodput, ".1f"),
                fmt(s.predicted_goodput, ".1f") if s.predicted_goodput else "",
                fmt(s.tokens_per_pass, ".2f"),
                "[" + ", ".join(fmt(a, ".2f") for a in s.acceptance[:4]) + "]",
                fmt(s.latency_p50_ms, ".1f"),
                fmt(s.latency_p95_ms, ".1f"),
                " ".join(f"{k}:{n}" for k, n in sorted(s.gammas.items())),
            ]
        )
    header = [
        "workload", "B", "setting", "tok/s", "× target-only", "decode tok/s",
        "predicted", "tokens/pass", "α by position", "p50 ms/tok", "p95 ms/tok", "γ chosen",
    ]  # fmt: skip
    v_rows = [[str(b), *(fmt(profile.v(b, n), ".2f") for n in profile.positions)] for b in batches]
    v_table = markdown_table(["B", *(f"v({n})" for n in profile.positions)], v_rows)
    stops = []
    for workload in args.workloads:
        for name in args.drafters:
            measured = {
                b: max(
                    speedup[(workload, s.label, b)]
                    for s in settings
                    if s.workload == workload
                    and s.drafter == name
                    and s.policy == "fixed"
                    and s.batch == b
                )
                for b in batches
            }
            mine = [v for key, v in predicted.items() if key.startswith(f"{workload}/{name} ")]
            # predictions start from a B = 1 run: none when --batches has no 1
            best_pred = {b: max(v[b] for v in mine) for b in batches} if mine else None
            stops.append(
                [
                    workload,
                    name,
                    str(stops_paying(best_pred)) if best_pred else "(needs B = 1)",
                    str(stops_paying(measured)),
                ]
            )
    goodput_rows = []
    for workload in args.workloads:
        for name in args.drafters:
            for b in batches:
                mine = [s for s in settings if s.workload == workload and s.batch == b]
                fixed = [s for s in mine if s.drafter == name and s.policy == "fixed"]
                good = next(s for s in mine if s.drafter == name and s.policy == "goodput")
                none = base[(workload, b)]
                best = max(fixed, key=lambda s: s.tokens_per_second)
                off = good.gammas.get(0, 0) / max(1, sum(good.gammas.values()))
                goodput_rows.append(
                    [
                        workload, name, str(b),
                        fmt(good.tokens_per_second / best.tokens_per_second, ".3f"),
                        best.label,
                        fmt(good.tokens_per_second / none.tokens_per_second, ".3f"),
                        fmt(off, ".2f"),
                    ]
                )  # fmt: skip
    versus_rows = [
        [w, label, fmt(a, ".1f"), fmt(g, ".1f"), fmt(a / g, ".3f")]
        for (w, label), (a, g) in versus.items()
    ]
    eight = []
    for workload in args.workloads:
        at = {
            b: max(s.tokens_per_second for s in settings if s.workload == workload and s.batch == b)
            for b in batches
        }
        if 1 in at and 8 in at:
            eight.append(
                [workload, fmt(at[1], ".1f"), fmt(at[8], ".1f"), fmt(at[8] / at[1], ".2f")]
            )
    text = "\n\n".join(
        [
            markdown_table(header, rows),
            markdown_table(
                [
                    "workload",
                    "drafter",
                    "B",
                    "goodput / best fixed",
                    "best fixed",
                    "goodput / target-only",
                    "rounds at γ = 0",
                ],
                goodput_rows,
            ),  # fmt: skip
            markdown_table(
                ["workload", "setting", "batched B = 1 tok/s", "generate tok/s", "ratio"],
                versus_rows,
            ),
            markdown_table(
                ["workload", "best at B = 1 tok/s", "best at B = 8 tok/s", "ratio"], eight
            ),
            v_table,
            markdown_table(
                ["workload", "drafter", "stops paying (predicted B)", "(measured B)"], stops
            ),
        ]
    )
    (args.out / "bench-batch.md").write_text(text + "\n", encoding="utf-8")
    _files.write_json(
        args.out / "bench-batch.json",
        _files.json_safe(
            {
                "settings": [asdict(s) | {"label": s.label} for s in settings],
                "profile": profile.to_json(),
                "predicted_speedups": predicted,
                "batched_vs_generate": [[w, label, a, g] for (w, label), (a, g) in versus.items()],
            }
        ),
        what="bench-batch results",
    )
    plt = pyplot()
    fig, axes = plt.subplots(1, len(args.workloads), figsize=(6 * len(args.workloads), 4))
    for ax, workload in zip(
        axes if len(args.workloads) > 1 else [axes], args.workloads, strict=True
    ):
        labels = sorted({s.label for s in settings if s.workload == workload})
        for label in labels:
            ys = [speedup[(workload, label, b)] for b in batches]
            ax.plot(batches, ys, marker="o", label=label)
        for key, v in predicted.items():
            if key.startswith(workload + "/"):
                ax.plot(batches, [v[b] for b in batches], ls=":", alpha=0.6)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size B")
        ax.set_ylabel("throughput / target-only at the same B")
        ax.set_title(f"{workload} (dotted: cost-model prediction)")
        ax.legend(fontsize=7)
    save(fig, args.out / "speedup-vs-batch.png")
    print(text)
    print(json.dumps({"out": str(args.out)}))


if __name__ == "__main__":
    with torch.inference_mode():
        main()
