"""Exact speculation against target-only and llama.cpp, end to end: the
figures issue 34's targets name.

On SmolLM2-135M-Instruct (its GGUF file), greedy, the first `--prompts`
evaluation prompts of each workload, interleaved prompt by prompt (every
method runs on a prompt before the next prompt starts; 10 ms between
methods so spinning threads settle), `--rounds` passes:

- llama.cpp target-only (llama-cpp-python, 2 threads);
- ours target-only with float32 and with q8 activations;
- every shipped drafter at the default γ (`MeasuredK`, the hybrid's per
  source), in each activation mode: the "never slower" figure;
- the fixed-γ rows: prompt lookup k = 8, lookahead at its shapes;

tokens/s (prefill included, as `specdec generate` reports it: total tokens
over total seconds), and the ratios: each generation's tokens/s over the
geometric mean of the target-only runs just before and just after it (the
same prompt and mode: target-only runs between every two methods, so a host
whose speed drifts within a prompt's methods moves both sides of a pair; or
over llama.cpp's run on that prompt in that round), their median over
prompts and rounds; and whether the greedy text equals
target-only's (it must) and llama.cpp's (where it first differs where
not). Every generation gets a drafter built afresh (a suffix index would
otherwise learn the prompts the next round repeats).

    python benchmarks/bench_targets.py --out benchmarks/results/bench-targets
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import specdec_rs as sd
from specdec_rs import drafters, models
from specdec_rs.measure.tables import markdown_table
from specdec_rs.policy import measured_policy
from specdec_rs.prompts import workloads

SETTLE = 0.01
DEFAULT_DRAFTERS = (
    "prompt-lookup",
    "suffix",
    "lookahead",
    "early-exit:8",
    "eagle",
    "medusa",
    "hybrid",
)
FIXED = (
    ("prompt-lookup", 8),
    ("lookahead:1,3,1", 2),
    ("lookahead:1,2,1", 1),
    ("lookahead:2,3,2", 2),
)


def llama_cpp() -> Any:
    from llama_cpp import Llama

    return Llama(str(models.smollm2_gguf()), n_threads=2, n_ctx=4096, verbose=False)


def run_llama(llm: Any, ids: list[int], new: int) -> tuple[str, int, float]:
    llm.reset()
    start = time.perf_counter()
    out = llm.create_completion(
        prompt=ids, max_tokens=new, temperature=0.0, top_k=1, repeat_penalty=1.0, seed=0
    )
    seconds = time.perf_counter() - start
    return out["choices"][0]["text"], int(out["usage"]["completion_tokens"]), seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--activations", default="f32,q8")
    ap.add_argument("--drafters", default=",".join(DEFAULT_DRAFTERS))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from bench_forward import host  # the same host report

    machine = host()
    print(json.dumps(machine, indent=1))
    modes = args.activations.split(",")
    targets = {a: models.load_smollm2(activations=a)[0] for a in modes}
    tokenizer = models.load_smollm2()[1]
    llm = llama_cpp()
    specs = drafters.split_specs(args.drafters)
    prompts = [(w, i) for i in range(args.prompts) for w in ("code", "chat")]
    times: dict[tuple[str, str], list[tuple[int, float]]] = {}
    paired: dict[
        tuple[str, str], list[float]
    ] = {}  # tokens/s over the reference's, same prompt and round
    texts: dict[tuple[str, str, int], str] = {}
    last: dict[str, float] = {}  # this prompt's llama.cpp tokens/s

    def ours(name: str, workload: str, i: int, mode: str, drafter: Any, **kw: Any) -> float:
        """One generation: its tokens/s (recorded, with its text)."""
        ids = workloads.encode(tokenizer, workloads.prompts(workload)[i])
        out = sd.generate(
            targets[mode], drafter, ids, max_new_tokens=args.max_new_tokens, temperature=0, **kw
        )
        times.setdefault((workload, name), []).append((out.new_tokens, out.time_total))
        speed = out.new_tokens / out.time_total
        paired.setdefault((workload, name + " /llama.cpp"), []).append(speed / last["llama.cpp"])
        text = tokenizer.decode(out.tokens, skip_special_tokens=True)
        if texts.setdefault((workload, name, i), text) != text:
            unstable.add((workload, name, i))  # greedy text that moved between rounds
        time.sleep(SETTLE)
        return speed

    unstable: set[tuple[str, str, int]] = set()
    started = time.perf_counter()
    for _ in range(args.rounds):
        for workload, i in prompts:
            ids = workloads.encode(tokenizer, workloads.prompts(workload)[i]).tolist()
            text, n, seconds = run_llama(llm, ids, args.max_new_tokens)
            times.setdefault((workload, "llama.cpp"), []).append((n, seconds))
            last["llama.cpp"] = n / seconds
            texts[(workload, "llama.cpp", i)] = text
            time.sleep(SETTLE)
            for mode in modes:
                reference = f"{mode} target-only"
                methods: list[tuple[str, str, int | None]] = [
                    (f"{mode} {spec} (default γ)", spec, None) for spec in specs
                ]
                methods += [(f"{mode} {spec} k={k}", spec, k) for spec, k in FIXED]
                before = ours(reference, workload, i, mode, None)
                paired.setdefault((workload, reference), []).append(1.0)
                for name, spec, k in methods:
                    d = drafters.from_spec(spec, targets[mode], tokenizer)
                    policy = measured_policy(d) if k is None else k
                    speed = ours(name, workload, i, mode, d, k=policy)
                    after = ours(reference, workload, i, mode, None)
                    # against target-only just before and just after it (geometric mean)
                    paired.setdefault((workload, name), []).append(speed / (before * after) ** 0.5)
                    before = after
    elapsed = time.perf_counter() - started
    rate = {key: sum(n for n, _ in v) / sum(s for _, s in v) for key, v in times.items()}
    report: dict[str, Any] = {"host": machine, "seconds": elapsed, "rows": {}}
    for workload in ("code", "chat"):
        print(f"\n### {workload}, greedy, {args.prompts} prompts x {args.rounds} rounds")
        rows = []
        llama = rate[(workload, "llama.cpp")]
        for (w, name), r in rate.items():
            if w != workload:
                continue
            mode = name.split(" ")[0]
            base = rate.get((workload, f"{mode} target-only"), r)
            same = (
                [
                    texts[(workload, name, i)] == texts[(workload, f"{mode} target-only", i)]
                    for i in range(args.prompts)
                ]
                if name != "llama.cpp"
                else []
            )
            vs_base = statistics.median(paired[(workload, name)]) if name != "llama.cpp" else 1.0
            vs_llama = (
                statistics.median(paired[(workload, name + " /llama.cpp")])
                if name != "llama.cpp"
                else 1.0
            )
            rows.append(
                [
                    name,
                    f"{r:.1f}",
                    f"{r / base:.2f}x" if name != "llama.cpp" else "-",
                    f"{vs_base:.2f}x" if name != "llama.cpp" else "-",
                    f"{r / llama:.2f}x",
                    f"{vs_llama:.2f}x",
                    "-" if not same else f"{sum(same)}/{len(same)}",
                ]
            )
            report["rows"][f"{workload} {name}"] = {
                "tokens/s": r,
                "vs target-only": r / base,
                "vs target-only, median of pairs": vs_base,
                "vs llama.cpp": r / llama,
                "vs llama.cpp, median of pairs": vs_llama,
            }
        print(
            markdown_table(
                [
                    "method",
                    "tokens/s",
                    "vs target-only",
                    "(median of pairs)",
                    "vs llama.cpp",
                    "(median of pairs)",
                    "text = target-only",
                ],
                rows,
            )
        )
        for mode in modes:
            agree = []
            for i in range(args.prompts):
                a = texts[(workload, f"{mode} target-only", i)]
                b = texts[(workload, "llama.cpp", i)]
                first = next(
                    (j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None
                )
                agree.append(
                    "same"
                    if a == b
                    else f"differs at char {first if first is not None else min(len(a), len(b))}"
                )
            print(f"{mode} target-only greedy text vs llama.cpp's: {agree}")
            report[f"{workload} {mode} vs llama.cpp text"] = agree
    worst = {}
    for mode in modes:
        ratios = [
            statistics.median(paired[(w, f"{mode} {s} (default γ)")])
            for w in ("code", "chat")
            for s in specs
        ]
        worst[mode] = min(ratios)
        print(f"worst default-γ ratio to target-only (median of pairs), {mode}: {worst[mode]:.2f}x")
    report["worst default"] = worst
    report["greedy text that changed between rounds"] = sorted(map(list, unstable))
    print(f"greedy text that changed between rounds: {sorted(unstable) or 'none'}")
    print(f"({elapsed:.0f} s)")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
