"""The GGUF architectures against llama.cpp (issue 35): files written by the
project's writer, read by llama-cpp-python and by specdec_rs.

1. Per architecture (Llama with Llama 3's rope scaling, Qwen2, Qwen3,
   Phi-3, Gemma 1-3): a random 2-layer model of transformers' own class
   (6 layers for Gemma 3, whose sixth is its first global one; Gemma 2's
   and 3's windows of 8 positions, crossed by the text; hidden 256,
   SmolLM2's vocabulary and tokenizer) written in F32. llama.cpp must load
   it; its greedy text over 24 tokens (its own logits, argmax) is compared
   with ours (float32 activations: the reference function), and the file
   requantized to Q4_K_M by llama.cpp's quantizer is read natively (its
   tensor types) and compared again (q8 activations, llama.cpp's
   arithmetic).
2. Synthetic same-family pairs (`--pairs`): one in Qwen2.5-0.5B's shape (hidden 896, 24
   layers, 14 heads over 2 KV heads, MLP 4864, tied embedding; SmolLM2's
   49,152-token vocabulary, so not Qwen's 151,936) and a 2-layer draft of
   the same widths, and one in Gemma-3-1B's shape (`gemma3_pair`), written
   in F16 and quantized to Q4_K_M by llama.cpp
   (rows of 896 are not whole super-blocks: its quantizer falls back to
   Q5_0 / Q8_0 for those, as in the real file). Target-only step and v(5)
   against llama.cpp (`bench_formats.file_rows`), peak RSS, and the
   draft model's speculation: tokens/s, α and c. Random weights give a
   random α: the figures of interest are the costs (c, v(n)), not the speed-up.

    python benchmarks/bench_architectures.py --out benchmarks/results/bench-architectures
    python benchmarks/bench_architectures.py --architectures --pairs gemma3  # one pair alone
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

ARCHITECTURES = ("llama3", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "gemma3")


def llama_cpp_greedy(path: Path, ids: list[int], new: int) -> tuple[list[int], Any, list[float]]:
    """llama.cpp's greedy continuation of `ids` (argmax of its own logits),
    its logits over the prompt (len(ids), V), and its top-2 margin at each
    new token."""
    import numpy as np
    from llama_cpp import Llama

    llm = Llama(str(path), n_threads=2, n_ctx=512, logits_all=True, verbose=False)
    llm.eval(ids)
    prompt = np.array(llm.scores[: len(ids)])
    out, margins = [], []
    for _ in range(new):
        scores = np.array(llm.scores[llm.n_tokens - 1])
        token = int(np.argmax(scores))
        top = np.sort(scores)[-2:]
        out.append(token)
        margins.append(float(top[1] - top[0]))
        llm.eval([token])
    del llm
    return out, prompt, margins


def ours_greedy(path: Path, ids: list[int], new: int, activations: str) -> tuple[list[int], Any]:
    """Our greedy continuation and prompt logits, as `llama_cpp_greedy`."""
    import specdec_rs as sd
    import torch
    from specdec_rs.gguf import load_gguf

    model, _ = load_gguf(path, tokenizer=False, activations=activations)
    out = sd.generate(
        model, None, torch.tensor(ids), max_new_tokens=new, temperature=0, eos_token_id=[]
    )
    with torch.inference_mode():
        prompt = model(torch.tensor([ids])).logits[0].numpy()
    return list(out.tokens), prompt


def agreement(path: Path, ids: list[int], new: int, activations: str) -> str:
    """'yes' or where the greedy texts first differ, with the prompt logits'
    largest difference and llama.cpp's top-2 margin where they differ."""
    import numpy as np

    ours, a = ours_greedy(path, ids, new, activations)
    theirs, b, margins = llama_cpp_greedy(path, ids, new)
    gap = f"max |Δ logit| {np.abs(a - b).max():.3g} of {np.abs(b).max():.3g}"
    for i, (x, y) in enumerate(zip(ours, theirs, strict=True)):
        if x != y:
            margin = f", llama.cpp's own top-2 margin there {margins[i]:.3g}"
            return f"no: first divergence at token {i} ({gap}{margin})"
    return f"yes ({gap})"


def architecture_rows(work: Path, new: int, architectures: list[str]) -> list[dict[str, Any]]:
    from collections import Counter

    from bench_formats import llama_cpp_quantize
    from specdec_rs import models
    from specdec_rs.gguf.reader import read
    from specdec_rs.gguf.writer import write_gguf

    rows = []
    ids = [(i * 613 + 7) % 49152 for i in range(24)]
    for arch in architectures:
        layers = 6 if arch == "gemma3" else 2
        model = models.tiny_model(
            arch, vocab_size=49152, hidden_size=256, num_layers=layers, seed=11
        )
        f32 = work / f"{arch}-F32.gguf"
        write_gguf(model, f32, linear_type="F32", embed_type="F32", tokenizer=models.smollm2_gguf())
        k = work / f"{arch}-Q4_K_M.gguf"
        llama_cpp_quantize(f32, k)
        types = Counter(t.type_name for t in read(k).tensors.values() if len(t.shape) > 1)
        row = {
            "architecture": arch,
            "llama.cpp loads the F32 file": "yes",
            "F32, f32 activations: same greedy text as llama.cpp": agreement(f32, ids, new, "f32"),
            "Q4_K_M types (llama.cpp's quantizer)": " ".join(
                f"{t}×{c}" for t, c in sorted(types.items())
            ),
            "Q4_K_M, q8 activations: same greedy text as llama.cpp": agreement(k, ids, new, "q8"),
        }
        rows.append(row)
        print(row, flush=True)
    return rows


def qwen2_pair(work: Path) -> tuple[Path, Path]:
    """The synthetic Qwen2.5-0.5B-shaped target and its draft (the target's
    embedding, first 2 layers and final norm: a same-family pair that agrees
    on part of the text), both Q4_K_M by llama.cpp's quantizer."""
    return prefix_pair(
        work,
        "qwen2",
        "qwen2-0.5b",
        vocab_size=49152,
        hidden_size=896,
        num_layers=24,
        seed=24,
        logit_scale=1.0,
        intermediate_size=4864,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    )


def gemma3_pair(work: Path) -> tuple[Path, Path]:
    """A synthetic Gemma-3-1B-shaped target (hidden 1152, 26 layers, 4
    heads over 1 KV head of 256, MLP 6912, a window of 512 on all layers but
    every sixth, tied embedding) with SmolLM2's vocabulary (Gemma's is
    262,144), and its draft (the target's embedding, first 2 layers and final
    norm), both Q4_K_M by llama.cpp's quantizer."""
    return prefix_pair(
        work,
        "gemma3",
        "gemma3-1b",
        vocab_size=49152,
        hidden_size=1152,
        num_layers=26,
        seed=26,
        intermediate_size=6912,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=256,
        query_pre_attn_scalar=256,
        sliding_window=512,
        max_position_embeddings=32768,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    )


def prefix_pair(work: Path, family: str, name: str, **shape: Any) -> tuple[Path, Path]:
    """A random `models.tiny_model(family, **shape)` target, its tied
    embedding scaled to logits of a trained size, and its draft (the
    target's embedding, first 2 layers and final norm), both written in F16
    and quantized to Q4_K_M by llama.cpp (kept in `work` and reused)."""
    import copy

    import torch
    from bench_formats import write_q4_k_m
    from specdec_rs import models

    target_path, draft_path = work / f"{name}-Q4_K_M.gguf", work / f"{family}-draft-Q4_K_M.gguf"
    if target_path.exists() and draft_path.exists():
        return target_path, draft_path
    target = models.tiny_model(family, **shape)
    with torch.no_grad():  # the tied embedding's init is tiny: logits of a trained scale
        target.model.embed_tokens.weight.mul_(8.0)
    draft = copy.deepcopy(target)
    draft.model.layers = draft.model.layers[:2]
    draft.config.num_hidden_layers = 2
    if getattr(draft.config, "layer_types", None):
        draft.config.layer_types = draft.config.layer_types[:2]
    for model, path in ((target, target_path), (draft, draft_path)):
        write_q4_k_m(model, path)
    return target_path, draft_path


PAIRS = {"qwen2": qwen2_pair, "gemma3": gemma3_pair}


def speculation_rows(target_path: Path, draft_path: Path, rounds: int) -> list[dict[str, Any]]:
    """Target-only and the draft model (k = 4), greedy, interleaved: tokens/s, α, c."""
    import specdec_rs as sd
    import torch
    from specdec_rs.gguf import load_gguf

    rows = []
    for activations in ("f32", "q8"):
        target, _ = load_gguf(target_path, tokenizer=False, activations=activations)
        draft = sd.drafters.DraftModel.from_spec(str(draft_path), target, None, False)
        ids = torch.arange(64) * 37 % 49152
        times: dict[str, list[float]] = {"target-only": [], "draft model k=4": []}
        last: dict[str, Any] = {}
        for _ in range(rounds):
            for name, drafter in (("target-only", None), ("draft model k=4", draft)):
                kw = {"k": 4} if drafter is not None else {}
                start = time.perf_counter()
                out = sd.generate(
                    target, drafter, ids, max_new_tokens=64, temperature=0, eos_token_id=[], **kw
                )
                times[name].append(64 / (time.perf_counter() - start))
                last[name] = out
        plain, spec = last["target-only"], last["draft model k=4"]
        rows.append(
            {
                "activations": activations,
                "target-only tok/s": statistics.median(times["target-only"]),
                "draft model tok/s": statistics.median(times["draft model k=4"]),
                "ratio": statistics.median(times["draft model k=4"])
                / statistics.median(times["target-only"]),
                "α": spec.alpha,
                "tokens per pass": spec.tokens_per_pass,
                "same text": "yes" if spec.tokens == plain.tokens else "NO",
                "c (draft step / target step)": draft_cost(target, draft_path),
            }
        )
        print(rows[-1], flush=True)
    return rows


def draft_cost(target: Any, draft_path: Path) -> float:
    """c: one draft-model step over one target step (medians of 15, after 64 positions)."""
    import torch
    from specdec_rs.gguf import load_gguf
    from specdec_rs.runner import new_cache

    draft, _ = load_gguf(draft_path, tokenizer=False, activations=target.config.specdec_activations)

    def step(model: Any) -> float:
        cache = new_cache(model)
        with torch.inference_mode():
            model(torch.arange(64)[None], cache=cache, use_cache=True)
            samples = []
            for i in range(15):
                start = time.perf_counter()
                model(torch.tensor([[i + 5]]), cache=cache, use_cache=True)
                samples.append(time.perf_counter() - start)
        return statistics.median(samples)

    return step(draft) / step(target)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/specdec-bench-architectures"))
    ap.add_argument("--new", type=int, default=24, help="greedy tokens compared with llama.cpp")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pairs", nargs="*", choices=list(PAIRS), default=list(PAIRS))
    ap.add_argument("--architectures", nargs="*", choices=ARCHITECTURES, default=ARCHITECTURES)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    from bench_formats import file_rows, table
    from bench_forward import host

    report: dict[str, Any] = {"host": host()}
    print(report["host"], flush=True)
    report["architectures"] = architecture_rows(args.work, args.new, list(args.architectures))
    md = [
        f"Host: {report['host']}",
        "",
        table(report["architectures"]) if args.architectures else "",
        "",
    ]
    for family in args.pairs:
        target, draft = PAIRS[family](args.work)
        report[f"{family} files"] = file_rows([str(target), str(draft)], args.work, 9)
        report[f"{family} speculation"] = speculation_rows(target, draft, args.rounds)
        md += [table(report[f"{family} files"]), "", table(report[f"{family} speculation"]), ""]
    text = "\n".join(md)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "report.json").write_text(json.dumps(report, indent=2, default=str))
        (args.out / "report.md").write_text(text)


if __name__ == "__main__":
    main()
