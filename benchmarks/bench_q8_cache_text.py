"""Greedy tokens of q8 activations over a q8_0 cache against llama.cpp with a
q8_0 key and value cache (flash attention, whose scores are integer block
products of the query quantized as `quantize_row_q8_0`): how many of the
evaluation prompts give the same tokens, and where the others first part.

On SmolLM2-135M-Instruct (its GGUF file), the first `--prompts` prompts of
each workload, `--max-new-tokens` greedy tokens, target-only on both sides.
Run it once per build (another build's package on `PYTHONPATH`) to compare
two functions against the same llama.cpp tokens.

    python benchmarks/bench_q8_cache_text.py --out benchmarks/results/bench-q8-cache-text
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import specdec_rs as sd
from specdec_rs import models
from specdec_rs.prompts import workloads

GGML_TYPE_Q8_0 = 8  # ggml's type id, as llama-cpp-python's `type_k` / `type_v` take it


def llama_tokens(llm: Any, ids: list[int], new: int, eos: int) -> list[int]:
    """llama.cpp's greedy continuation of `ids` (up to `new` tokens, its EOS included)."""
    llm.reset()
    out: list[int] = []
    for token in llm.generate(ids, top_k=1, temp=0.0, repeat_penalty=1.0):
        out.append(int(token))
        if token == eos or len(out) == new:
            break
    return out


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where a and b differ (a shorter one ends there), None if equal."""
    if a == b:
        return None
    parted = (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    return next(parted, min(len(a), len(b)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from llama_cpp import Llama

    target, tokenizer = models.load_smollm2(activations="q8", cache_type="q8_0")
    llm = Llama(
        str(models.smollm2_gguf()),
        n_threads=2,
        n_ctx=4096,
        flash_attn=True,
        type_k=GGML_TYPE_Q8_0,
        type_v=GGML_TYPE_Q8_0,
        verbose=False,
    )
    eos = int(tokenizer.eos_token_id)
    rows = []
    for workload in ("code", "chat"):
        for i, ids in enumerate(workloads.prompt_set(tokenizer, workload, args.prompts)):
            ours = sd.generate(target, None, ids, max_new_tokens=args.max_new_tokens, temperature=0)
            theirs = llama_tokens(llm, ids.tolist(), args.max_new_tokens, eos)
            at = first_difference(list(ours.tokens), theirs)
            rows.append({"workload": workload, "prompt": i, "first difference": at})
            print(workload, i, "same" if at is None else f"parts at token {at}", flush=True)
    same = sum(r["first difference"] is None for r in rows)
    parted = sorted(r["first difference"] for r in rows if r["first difference"] is not None)
    print(f"same tokens: {same} of {len(rows)}; the others part at tokens {parted}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        summary = {"package": sd.__file__, "same": same, "prompts": len(rows), "rows": rows}
        (args.out / "results.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
