"""Generation after a long prompt: the float16 and q8_0 caches against the
float32 one and llama.cpp (whose default cache is float16), target-only
and with prompt lookup.

On SmolLM2-135M-Instruct (its GGUF file), q8 activations, greedy: each
prompt asks for a change to a standard-library module's source cut to
about `--context` tokens. Per prompt, interleaved (10 ms between methods):
llama.cpp target-only (llama-cpp-python, 2 threads), ours target-only with
each cache type, ours with prompt lookup (k = 8) with the f32 and f16 caches.
The decode rate excludes the prefill: ours (new tokens − 1) / (total −
prefill seconds), llama.cpp its own counters (`llama_perf_context`: tokens
evaluated after the prompt over their milliseconds); the prefill is
reported apart. Ratios are medians over prompts and rounds of each pair
(same prompt, same round). Ours' speculative text must equal ours'
target-only text in the same cache type.

    python benchmarks/bench_long_context.py --out benchmarks/results/bench-long-context
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import statistics
import time
from pathlib import Path
from typing import Any

import specdec_rs as sd
from specdec_rs import models
from specdec_rs.gguf.model import set_cache_type
from specdec_rs.measure.tables import markdown_table
from specdec_rs.prompts import workloads

SETTLE = 0.01
MODULES = ("textwrap", "shlex", "fnmatch", "heapq", "bisect", "calendar")
TASK = "Add a docstring to every function of this module that lacks one."


def long_prompt(tokenizer: Any, module: str, context: int) -> Any:
    """The prompt ids: TASK and the module's source cut to about `context` tokens."""
    source = inspect.getsource(importlib.import_module(module))
    ids = tokenizer(source).input_ids[:context]
    text = tokenizer.decode(ids)
    return workloads.encode(tokenizer, f"{TASK}\n\n```python\n{text}\n```")


def run_llama(llm: Any, ids: list[int], new: int) -> dict[str, Any]:
    import llama_cpp

    llm.reset()
    llama_cpp.llama_perf_context_reset(llm._ctx.ctx)
    out = llm.create_completion(
        prompt=ids, max_tokens=new, temperature=0.0, top_k=1, repeat_penalty=1.0, seed=0
    )
    p = llama_cpp.llama_perf_context(llm._ctx.ctx)
    return {
        "decode": p.n_eval / (p.t_eval_ms / 1e3),
        "prefill": p.t_p_eval_ms / 1e3,
        "text": out["choices"][0]["text"],
    }


def run_ours(target: Any, drafter: Any, ids: Any, new: int, **kw: Any) -> dict[str, Any]:
    out = sd.generate(target, drafter, ids, max_new_tokens=new, temperature=0, **kw)
    return {
        "decode": (out.new_tokens - 1) / (out.time_total - out.time_prefill),
        "prefill": out.time_prefill,
        "tokens": out.tokens,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--context", type=int, default=1900)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from bench_forward import host
    from llama_cpp import Llama

    machine = host()
    print(json.dumps(machine, indent=1))
    target, tokenizer = models.load_smollm2(activations="q8")
    llm = Llama(str(models.smollm2_gguf()), n_threads=2, n_ctx=4096, verbose=False)
    prompts = [long_prompt(tokenizer, m, args.context) for m in MODULES[: args.prompts]]
    methods = [
        ("f32 cache, target-only", "f32", False),
        ("f16 cache, target-only", "f16", False),
        ("q8_0 cache, target-only", "q8_0", False),
        ("f32 cache, prompt lookup k = 8", "f32", True),
        ("f16 cache, prompt lookup k = 8", "f16", True),
    ]
    samples: dict[str, list[dict[str, float]]] = {}
    same: dict[str, list[bool]] = {}
    for _ in range(args.rounds):
        for ids in prompts:
            theirs = run_llama(llm, ids.tolist(), args.max_new_tokens)
            samples.setdefault("llama.cpp target-only", []).append(
                {"decode": theirs["decode"], "prefill": theirs["prefill"], "vs llama.cpp": 1.0}
            )
            time.sleep(SETTLE)
            plain: dict[str, Any] = {}
            for name, cache_type, lookup in methods:
                set_cache_type(target, cache_type)
                drafter = sd.PromptLookup() if lookup else None
                kw = {"k": 8} if lookup else {}
                ours = run_ours(target, drafter, ids, args.max_new_tokens, **kw)
                if not lookup:
                    plain[cache_type] = ours
                else:
                    same.setdefault(name, []).append(ours["tokens"] == plain[cache_type]["tokens"])
                samples.setdefault(name, []).append(
                    {
                        "decode": ours["decode"],
                        "prefill": ours["prefill"],
                        "vs llama.cpp": ours["decode"] / theirs["decode"],
                        "vs f32 target-only": ours["decode"] / plain["f32"]["decode"],
                    }
                )
                time.sleep(SETTLE)
    lengths = [len(ids) for ids in prompts]
    print(
        f"\n### q8 activations, prompts of {min(lengths)}-{max(lengths)} tokens, "
        f"{args.max_new_tokens} new, greedy, {args.prompts} prompts x {args.rounds} rounds"
    )
    rows, report = [], {"host": machine, "prompt tokens": lengths, "rows": {}}
    for name, runs in samples.items():
        med = {k: statistics.median(r[k] for r in runs if k in r) for k in runs[-1]}
        rows.append(
            [
                name,
                f"{med['decode']:.1f}",
                f"{med['prefill']:.2f}",
                f"{med['vs llama.cpp']:.2f}x",
                f"{med['vs f32 target-only']:.2f}x" if "vs f32 target-only" in med else "-",
                f"{sum(same[name])}/{len(same[name])}" if name in same else "-",
            ]
        )
        report["rows"][name] = med
    print(
        markdown_table(
            [
                "method",
                "decode tokens/s",
                "prefill s",
                "vs llama.cpp",
                "vs ours f32 target-only",
                "text = target-only",
            ],
            rows,
        )
    )
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
