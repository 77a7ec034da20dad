"""What the sampling processors cost beside the forward: greedy, top-k and
top-p rows of SmolLM2's 49,152 tokens, the project's processors against
their reference forms (torch.argmax, torch.topk, transformers' full sort
for top-p), alternated in one process.

1. Per row: `logits_to_probs` on 1 and 9 rows (a decode step and a k = 8
   verification block), one torch thread, medians of `--repeats`.
2. End to end: `sd.generate` on SmolLM2 (q8 activations, `--max-new-tokens`
   each) for a chat and a code prompt, target-only and prompt lookup, each
   sampling setting, the two forms alternated prompt by prompt with the same
   seeds; tokens/s (medians over `--rounds`) and whether both forms gave the
   same tokens (they must: the same masks, so the same probabilities).

    SPECDEC_KERNEL_THREADS=2 python benchmarks/bench_processors.py \\
        --out benchmarks/results/bench-processors
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from bench_forward import host
from specdec_rs import models, processors
from specdec_rs.drafters import PromptLookup
from specdec_rs.generation import generate
from specdec_rs.measure.report import write_results
from specdec_rs.measure.tables import markdown_table
from specdec_rs.processors import SamplingConfig, logits_to_probs

SETTINGS = {
    "greedy": SamplingConfig(0),
    "T 0.7": SamplingConfig(0.7),
    "T 0.7, top-k 50": SamplingConfig(0.7, top_k=50),
    "T 0.7, top-p 0.9": SamplingConfig(0.7, top_p=0.9),
    "T 0.7, top-k 50, top-p 0.95": SamplingConfig(0.7, top_k=50, top_p=0.95),
}
PROMPTS = {
    "chat": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "code": "Rewrite this function with a docstring and type hints:\n\n"
    "def merge(a, b):\n    out = []\n    i = j = 0\n"
    "    while i < len(a) and j < len(b):\n        if a[i] <= b[j]:\n"
    "            out.append(a[i]); i += 1\n        else:\n"
    "            out.append(b[j]); j += 1\n    out.extend(a[i:]); out.extend(b[j:])\n"
    "    return out\n",
}


def reference_kth(scores: torch.Tensor, k: int) -> torch.Tensor:
    return torch.topk(scores, k, dim=-1).values[..., -1:]


def reference_argmax(rows: torch.Tensor) -> torch.Tensor:
    return rows.argmax(dim=-1)


FORMS: dict[str, dict[str, Callable[..., Any]]] = {
    "project": {
        "argmax": processors.argmax,
        "_kth_largest": processors._kth_largest,
        "_top_p_drop": processors._top_p_drop,
    },
    "reference": {
        "argmax": reference_argmax,
        "_kth_largest": reference_kth,
        "_top_p_drop": processors._top_p_drop_sorted,
    },
}


@contextmanager
def form(name: str) -> Iterator[None]:
    """The processors module with the named form's helpers in place."""
    before = {k: getattr(processors, k) for k in FORMS["project"]}
    for k, f in FORMS[name].items():
        setattr(processors, k, f)
    try:
        yield
    finally:
        for k, f in before.items():
            setattr(processors, k, f)


def per_row(repeats: int) -> list[dict[str, Any]]:
    """Milliseconds per row of logits_to_probs, each form, 1 and 9 rows."""
    torch.set_num_threads(1)
    out = []
    g = torch.Generator().manual_seed(0)
    for rows in (1, 9):
        logits = torch.randn(rows, 49152, generator=g) * 4
        for setting, config in SETTINGS.items():
            times: dict[str, list[float]] = {"project": [], "reference": []}
            for _ in range(repeats):
                for name in times:
                    with form(name):
                        started = time.perf_counter()
                        logits_to_probs(logits, config)
                        times[name].append((time.perf_counter() - started) / rows)
            ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
            out.append({"rows": rows, "setting": setting, **{f"{k}_ms": v for k, v in ms.items()}})
    return out


def end_to_end(rounds: int, max_new_tokens: int) -> list[dict[str, Any]]:
    """tokens/s of generate with each form, alternated; same tokens checked."""
    model, tok = models.load_smollm2(activations="q8")
    ids = {
        name: torch.tensor(
            tok(
                tok.apply_chat_template(
                    [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
                )
            )["input_ids"]
        )
        for name, text in PROMPTS.items()
    }
    rates: dict[tuple[str, ...], list[float]] = {}
    same: dict[tuple[str, ...], bool] = {}
    for r in range(rounds):
        for prompt, prompt_ids in ids.items():
            for drafter in ("target-only", "prompt lookup"):
                for setting, config in SETTINGS.items():
                    tokens = {}
                    for name in ("reference", "project"):
                        with form(name):
                            started = time.perf_counter()
                            result = generate(
                                model,
                                PromptLookup() if drafter == "prompt lookup" else None,
                                prompt_ids,
                                max_new_tokens=max_new_tokens,
                                temperature=config.temperature,
                                top_k=config.top_k,
                                top_p=config.top_p,
                                eos_token_id=[],
                                seed=r,
                            )
                            seconds = time.perf_counter() - started
                        key = (prompt, drafter, setting, name)
                        rates.setdefault(key, []).append(len(result.tokens) / seconds)
                        tokens[name] = result.tokens
                    key = (prompt, drafter, setting)
                    same[key] = same.get(key, True) and tokens["project"] == tokens["reference"]
    out = []
    for (prompt, drafter, setting), equal in same.items():
        ours = statistics.median(rates[(prompt, drafter, setting, "project")])
        ref = statistics.median(rates[(prompt, drafter, setting, "reference")])
        out.append(
            {
                "prompt": prompt,
                "drafter": drafter,
                "setting": setting,
                "reference_tokens_per_s": ref,
                "project_tokens_per_s": ours,
                "ratio": ours / ref,
                "same_tokens": equal,
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    machine = host()  # the same host report as the other benchmarks
    rows = per_row(args.repeats)
    runs = end_to_end(args.rounds, args.max_new_tokens)
    flags = ", ".join(machine["flags"])
    table = f"Host: {machine['cpu']}; {flags}\n\n" + markdown_table(
        ["rows", "setting", "reference ms/row", "project ms/row", "ratio"],
        [
            [
                str(r["rows"]),
                r["setting"],
                f"{r['reference_ms']:.3f}",
                f"{r['project_ms']:.3f}",
                f"{r['reference_ms'] / r['project_ms']:.1f}x",
            ]
            for r in rows
        ],
    )
    table += "\n\n" + markdown_table(
        [
            "prompt",
            "drafter",
            "setting",
            "reference tok/s",
            "project tok/s",
            "ratio",
            "same tokens",
        ],
        [
            [
                r["prompt"],
                r["drafter"],
                r["setting"],
                f"{r['reference_tokens_per_s']:.1f}",
                f"{r['project_tokens_per_s']:.1f}",
                f"{r['ratio']:.2f}x",
                "yes" if r["same_tokens"] else "NO",
            ]
            for r in runs
        ],
        align="lllrrrl",
    )
    print(table)
    if args.out:
        write_results(args.out, {"host": machine, "per_row": rows, "generate": runs}, table)


if __name__ == "__main__":
    main()
