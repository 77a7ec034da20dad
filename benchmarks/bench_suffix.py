"""The suffix drafter against prompt lookup, on traffic that repeats and on
single requests.

Workloads (SmolLM2-135M-Instruct, greedy, `--max-new-tokens` each, γ by
each drafter's default policy, `MeasuredK` at most 8, as `specdec generate`):
- repeated (`measure.repeated`): `--code` training code tasks each asked
  twice (the second with a small edit) and `--chat` two-turn conversations
  whose second turn quotes the first answer, in order, through one drafter
  object (the suffix drafter's global index learns across the requests);
- re-asked: the same `--code` code tasks each asked twice word for word
  (a retried or re-run request: its greedy answer repeats), through one
  drafter object;
- single: the evaluation code prompts (`--single` of them), each with a
  fresh drafter (no global index to learn from).
Per drafter (none, prompt-lookup, suffix) and workload: tokens/s (new
tokens / generation seconds), tokens per pass, α, the speedup over
target-only and suffix / prompt lookup, all from the same run; with
--repeats R the drafters' runs interleave and each figure is the median
of R.

    python benchmarks/bench_suffix.py --out benchmarks/results/bench-suffix
"""

from __future__ import annotations

import argparse
import functools
import statistics
from pathlib import Path
from typing import Any

import specdec_rs as sd
from specdec_rs import drafters, models
from specdec_rs.measure import repeated
from specdec_rs.measure.report import write_results
from specdec_rs.measure.tables import fmt, markdown_table
from specdec_rs.policy import measured_policy
from specdec_rs.prompts import workloads

DRAFTERS = ("none", "prompt-lookup", "suffix")


def generator(target: Any, tokenizer: Any, drafter: Any, max_new: int) -> Any:
    def run(messages: Any) -> tuple[str, Any]:
        ids = workloads.encode(tokenizer, messages)
        out = sd.generate(
            target,
            drafter,
            ids,
            max_new_tokens=max_new,
            k=measured_policy(drafter) if drafter is not None else 1,
            temperature=0,
            seed=0,
            vocab_size=len(tokenizer) if drafter is not None else None,
        )
        return tokenizer.decode(out.tokens, skip_special_tokens=True), out

    return run


def repeated_run(
    target: Any, tokenizer: Any, spec: str, args: argparse.Namespace, *, edit: bool = True
) -> dict:
    """The repeated workload through one drafter; edit=False: the re-asked
    one (the code tasks asked again word for word, no chats)."""
    drafter = drafters.from_spec(spec, target, tokenizer)
    asked = repeated.run_repeated(
        generator(target, tokenizer, drafter, args.max_new_tokens),
        code=args.code,
        chat=args.chat if edit else 0,
        edit=edit,
    )
    return {
        "all": repeated.totals(asked),
        "repeats": repeated.totals(asked, lambda a: a.repeat),
        "tokens": [a.result.tokens for a in asked],
    }


def single_run(target: Any, tokenizer: Any, spec: str, args: argparse.Namespace) -> dict:
    asked = []
    for prompt in workloads.prompts("code")[: args.single]:
        drafter = drafters.from_spec(spec, target, tokenizer)  # fresh: nothing learned before
        messages = [{"role": "user", "content": prompt}]
        result = generator(target, tokenizer, drafter, args.max_new_tokens)(messages)[1]
        asked.append(repeated.Asked("code", False, messages, result))
    return {"all": repeated.totals(asked), "tokens": [a.result.tokens for a in asked]}


def median_of(runs: list[dict], key: str) -> dict[str, Any]:
    out = dict(runs[0][key])
    for field in ("tokens_per_second", "seconds"):
        out[field] = statistics.median(r[key][field] for r in runs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--code", type=int, default=6)
    ap.add_argument("--chat", type=int, default=6)
    ap.add_argument("--single", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    target, tokenizer = models.load_smollm2()
    runs: dict[tuple[str, str], list[dict]] = {}
    for _ in range(args.repeats):
        for workload, run in (
            ("repeated", repeated_run),
            ("re-asked", functools.partial(repeated_run, edit=False)),
            ("single", single_run),
        ):
            for spec in DRAFTERS:
                runs.setdefault((workload, spec), []).append(run(target, tokenizer, spec, args))
                print(workload, spec, runs[(workload, spec)][-1]["all"], flush=True)
    for workload in ("repeated", "re-asked", "single"):  # greedy: each text is target-only's
        plain = runs[(workload, "none")][0]["tokens"]
        for spec in DRAFTERS:
            assert all(r["tokens"] == plain for r in runs[(workload, spec)]), (workload, spec)
    rows = []
    record: dict[str, Any] = {"args": vars(args) | {"out": str(args.out)}, "results": {}}
    shown = (
        ("repeated", "all"),
        ("repeated", "repeats"),
        ("re-asked", "all"),
        ("re-asked", "repeats"),
        ("single", "all"),
    )
    for workload, key in shown:
        base = median_of(runs[(workload, "none")], key)["tokens_per_second"]
        lookup = median_of(runs[(workload, "prompt-lookup")], key)["tokens_per_second"]
        for spec in DRAFTERS:
            t = median_of(runs[(workload, spec)], key)
            record["results"][f"{workload}/{key}/{spec}"] = t
            rows.append(
                [
                    workload if key == "all" else f"{workload} (second asks)",
                    spec,
                    str(t["requests"]),
                    f"{t['tokens_per_second']:.1f}",
                    fmt(t["tokens_per_pass"], ".2f"),
                    fmt(t["alpha"], ".3f"),
                    f"{t['tokens_per_second'] / base:.2f}x",
                    f"{t['tokens_per_second'] / lookup:.2f}x",
                ]
            )
    header = ["workload", "drafter", "requests", "tokens/s", "tokens/pass", "α"]
    text = markdown_table([*header, "vs none", "vs prompt-lookup"], rows)
    print(text)
    if args.out is not None:
        write_results(args.out, record, text)


if __name__ == "__main__":
    main()
