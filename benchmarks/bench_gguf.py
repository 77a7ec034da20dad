"""The target at its own precision, side by side with what a CPU user runs.

Everything in one process, interleaved prompt by prompt (so drift hits every
method alike), on the evaluation chat and code prompts at each temperature:

- transformers float32 target-only (`model.generate`),
- ours target-only: float32 (the dequantized reference) and gguf (the
  file's own precision, `specdec_rs.gguf`),
- llama.cpp target-only and its prompt lookup (llama-cpp-python, the
  `bench` extra; left out with a message when it is not installed),
- ours gguf with prompt lookup (k = 8, and the cost-model γ), the hybrid
  and the EAGLE head (cost-model γ).

It also reports a decode step's anatomy before and after, v(1..9) and each
drafter's c at the new step, the weights held, the peak RSS of `specdec
generate` and of llama.cpp (each in a fresh process), and whether the gguf
path's greedy text equals the float32 reference's (where not: the float32
logit margin at the first differing token).

    python benchmarks/bench_gguf.py --prompts 6 --max-new-tokens 128 \\
        --out benchmarks/results/bench-gguf
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import specdec_rs as sd
import torch
from lscpu import flags, lscpu
from specdec_rs import _core, drafters, models, runner
from specdec_rs.generation.inputs import eos_set
from specdec_rs.gguf.modules import QuantLinear
from specdec_rs.measure.costs import measure_costs
from specdec_rs.measure.hf import hf_generate
from specdec_rs.measure.methods import adaptive_policy
from specdec_rs.measure.tables import markdown_table
from specdec_rs.processors import SamplingConfig
from specdec_rs.prompts import workloads
from specdec_rs.timing import median_seconds


def llama_cpp(path: Path, lookup: int | None) -> Any:
    """A llama-cpp-python model on 2 threads (with its prompt lookup), or None."""
    try:
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    except ImportError:
        return None
    draft = LlamaPromptLookupDecoding(num_pred_tokens=lookup) if lookup else None
    # a draft model needs the logits of every position (llama-cpp-python's requirement)
    return Llama(
        str(path),
        n_threads=2,
        n_ctx=4096,
        verbose=False,
        draft_model=draft,
        logits_all=draft is not None,
    )


def run_llama(
    llm: Any, ids: list[int], new: int, temperature: float, seed: int
) -> tuple[list[int], float]:
    """(tokens, seconds) of one llama.cpp completion (temperature only: no top-k/p, no penalty)."""
    llm.reset()
    start = time.perf_counter()
    out = llm.create_completion(
        prompt=ids,
        max_tokens=new,
        temperature=temperature,
        top_k=0,
        top_p=1.0,
        min_p=0.0,
        repeat_penalty=1.0,
        seed=seed,
    )
    seconds = time.perf_counter() - start
    return [0] * int(out["usage"]["completion_tokens"]), seconds


def anatomy_float32(model: Any, context: torch.Tensor, steps: int = 8) -> dict[str, float]:
    """ms per decode step by kind of torch operation (profiler self time)."""
    from torch.profiler import ProfilerActivity, profile

    kinds = {
        "products": ("aten::mm", "aten::addmm", "aten::linear", "aten::matmul", "aten::bmm"),
        "cache": ("aten::cat", "aten::index_select"),
        "attention": (
            "aten::_scaled_dot_product_flash_attention_for_cpu",
            "aten::scaled_dot_product_attention",
        ),
    }
    with torch.inference_mode():
        cache = runner.new_cache(model)
        runner.forward(model, context[:-1], cache, keep=1)
        start = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                _step(model, context, cache)
        wall = (time.perf_counter() - start) / steps * 1e3
    out = {k: 0.0 for k in kinds}
    for e in prof.key_averages():
        for k, names in kinds.items():
            if e.key in names:
                out[k] += e.self_cpu_time_total / 1e3 / steps
    out["rest"] = wall - sum(out.values())
    out["step"] = wall
    return out


def anatomy_gguf(model: Any, context: torch.Tensor, steps: int = 20) -> dict[str, float]:
    """ms per decode step: the Rust layer calls (products, norms, RoPE,
    attention), the LM head, and the Python around them (embedding, rotary
    tables, masks, the final norm, the model's calls); and, for reference,
    every weight's product alone at one row (one call each)."""
    weights = [m for m in model.modules() if isinstance(m, QuantLinear) and m is not model.lm_head]
    weights = list({id(w.packed): w for w in weights}.values()) + [model.lm_head]
    xs = {w.in_features: torch.randn(1, w.in_features) for w in weights}
    layer_time = [0.0]
    real = _core.llama_layer

    def timed(*args: Any) -> None:
        start = time.perf_counter()
        real(*args)
        layer_time[0] += time.perf_counter() - start

    with torch.inference_mode():
        cache = runner.new_cache(model)
        runner.forward(model, context[:-1], cache, keep=1)
        step = median_seconds(lambda: _step(model, context, cache), steps, warmup=1)
        _core.llama_layer = timed  # type: ignore[attr-defined]
        try:
            layer_time[0] = 0.0
            for _ in range(steps):
                _step(model, context, cache)
            layers = layer_time[0] / steps
        finally:
            _core.llama_layer = real  # type: ignore[attr-defined]
        products = median_seconds(
            lambda: [w.product(xs[w.in_features]) for w in weights], steps, warmup=1
        )
        x = xs[model.lm_head.in_features]
        head = median_seconds(lambda: model.lm_head.product(x), steps, warmup=1)
    return {
        "Rust layers": layers * 1e3,
        "LM head": head * 1e3,
        "Python and torch": (step - layers - head) * 1e3,
        "step": step * 1e3,
        "products alone (reference)": products * 1e3,
    }


def _step(model: Any, context: torch.Tensor, cache: Any) -> None:
    runner.forward(model, context[-1:], cache, keep=1)
    runner.crop(cache, len(context) - 1)


def peak_rss(argv: list[str]) -> float:
    """Peak resident memory (MB) of a fresh process running `argv`, by GNU
    time (a child of this process would report this process's peak: the
    high-water mark survives the exec)."""
    out = subprocess.run(
        ["/usr/bin/time", "-f", "%M", *argv], capture_output=True, text=True, check=True
    )
    return int(out.stderr.strip().splitlines()[-1]) / 1024


def margin_at_first_difference(model: Any, ids: torch.Tensor, a: list[int], b: list[int]) -> Any:
    """(position, float32 top-1 minus top-2 logit there) where a and b first differ."""
    i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    if i is None:
        return None
    with torch.inference_mode():
        logits = model(torch.cat([ids, torch.tensor(a[:i])])[None]).logits[0, -1]
    top = logits.topk(2).values
    return {"position": i, "margin": float(top[0] - top[1])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=6, help="per workload")
    ap.add_argument("--workloads", nargs="+", default=["chat", "code"])
    ap.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 0.7])
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=40, help="timed repetitions of each cost")
    ap.add_argument("--out", default=None, help="folder for results.json and report.md")
    ap.add_argument("--skip-rss", action="store_true")
    args = ap.parse_args()
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()

    f32, tokenizer = models.load_smollm2(weights="float32")
    gg, _ = models.load_smollm2(weights="gguf")  # chooses the kernels' threads, torch to 1
    kernel_threads = gg.model.layers[0].o_proj.threads
    torch_threads_gguf = torch.get_num_threads()
    path = models.smollm2_gguf()
    llm, llm_lookup = llama_cpp(path, None), llama_cpp(path, 8)
    if llm is None:
        print("llama-cpp-python is not installed (pip install '.[bench]'): llama.cpp left out")
    eos = sorted(eos_set(None, gg))
    context = workloads.encode(tokenizer, workloads.prompts("chat")[0])

    # the step before and after, v(n) and c at the new step
    torch.set_num_threads(2)
    before = anatomy_float32(f32, context)
    torch.set_num_threads(torch_threads_gguf)
    after = anatomy_gguf(gg, context)
    specs = {"prompt-lookup": None, "hybrid": None, "eagle": None}
    made = {s: drafters.from_spec(s, gg, tokenizer) for s in specs}
    costs = measure_costs(gg, context, made, k_max=8, repeats=args.repeats)

    methods: dict[str, Any] = {
        "transformers float32": ("hf", None, None),
        "ours float32": ("ours-f32", None, None),
        "ours gguf": ("ours", None, None),
    }
    if llm is not None:
        methods["llama.cpp"] = ("llama", llm, None)
        methods["llama.cpp prompt lookup (8)"] = ("llama", llm_lookup, None)
    methods["ours gguf + prompt lookup (k=8)"] = ("ours", made["prompt-lookup"], 8)
    for spec in ("prompt-lookup", "hybrid", "eagle"):
        methods[f"ours gguf + {spec} (cost-model γ)"] = ("ours", made[spec], "adaptive")

    def policy(spec: str, drafter: Any) -> Any:
        return adaptive_policy(costs, spec, drafter, k_max=8)

    rows: dict[tuple[str, str, float], list[tuple[int, float]]] = {}
    greedy: dict[str, list[list[int]]] = {"ours float32": [], "ours gguf": []}
    prompts = [(w, i) for i in range(args.prompts) for w in args.workloads]
    started = time.perf_counter()
    for temperature in args.temperatures:
        config = SamplingConfig(temperature)
        for workload, i in prompts:
            ids = workloads.encode(tokenizer, workloads.prompts(workload)[i])
            for name, (engine, drafter, k) in methods.items():
                seed = 1000 + i
                if engine == "hf":
                    torch.set_num_threads(2)
                    r = hf_generate(
                        f32,
                        ids,
                        max_new_tokens=args.max_new_tokens,
                        config=config,
                        seed=seed,
                        eos_token_id=eos,
                    )
                    result = (r.new_tokens, r.time_total)
                elif engine == "llama":
                    tokens, seconds = run_llama(
                        drafter, ids.tolist(), args.max_new_tokens, temperature, seed
                    )
                    result = (len(tokens), seconds)
                else:
                    model = f32 if engine == "ours-f32" else gg
                    torch.set_num_threads(2 if engine == "ours-f32" else torch_threads_gguf)
                    spec = getattr(drafter, "name", "")
                    kk = policy(spec, drafter) if k == "adaptive" else (k or 1)
                    out = sd.generate(
                        model,
                        drafter,
                        ids,
                        max_new_tokens=args.max_new_tokens,
                        k=kk,
                        temperature=temperature,
                        seed=seed,
                    )
                    result = (out.new_tokens, out.time_total)
                    if temperature == 0 and name in greedy:
                        greedy[name].append(out.tokens)
                rows.setdefault((name, workload, temperature), []).append(result)
        torch.set_num_threads(torch_threads_gguf)
    seconds = time.perf_counter() - started

    # greedy identity with the float32 reference
    differences = []
    for j, (workload, i) in enumerate(prompts):
        a, b = greedy["ours float32"][j], greedy["ours gguf"][j]
        if a != b:
            ids = workloads.encode(tokenizer, workloads.prompts(workload)[i])
            differences.append(
                {
                    "workload": workload,
                    "prompt": i,
                    "first": margin_at_first_difference(f32, ids, a, b),
                }
            )

    weights_mb = sum(
        {id(m.packed): m.nbytes for m in gg.modules() if isinstance(m, QuantLinear)}.values()
    )
    weights_mb += sum(p.numel() * p.element_size() for p in gg.parameters())
    rss = {}
    if not args.skip_rss:
        prompt = workloads.prompts("chat")[0]
        cmd = [
            sys.executable,
            "-m",
            "specdec_rs",
            "generate",
            prompt,
            "--max-new-tokens",
            "64",
            "--temperature",
            "0",
            "--json",
        ]
        rss["specdec generate (gguf, prompt lookup)"] = peak_rss(cmd)
        rss["specdec generate (float32)"] = peak_rss([*cmd, "--weights", "float32"])
        if llm is not None:
            code = (
                "from llama_cpp import Llama; import sys; l = Llama(sys.argv[1], n_threads=2, "
                "n_ctx=4096, verbose=False); l.create_completion('Hello', max_tokens=64)"
            )
            rss["llama.cpp (llama-cpp-python)"] = peak_rss([sys.executable, "-c", code, str(path)])

    table = []
    for (name, workload, temperature), runs in rows.items():
        tokens, secs = sum(t for t, _ in runs), sum(s for _, s in runs)
        table.append(
            {
                "method": name,
                "workload": workload,
                "temperature": temperature,
                "tokens": tokens,
                "seconds": secs,
                "tokens_per_second": tokens / secs,
            }
        )
    base = {
        (r["workload"], r["temperature"]): r["tokens_per_second"]
        for r in table
        if r["method"] == "llama.cpp"
    }
    ours = {
        (r["workload"], r["temperature"]): r["tokens_per_second"]
        for r in table
        if r["method"] == "ours gguf"
    }
    for r in table:
        key = (r["workload"], r["temperature"])
        r["vs_llama_cpp"] = r["tokens_per_second"] / base[key] if key in base else None
        r["vs_ours_gguf"] = r["tokens_per_second"] / ours[key] if key in ours else None
    report = {
        "command": " ".join(sys.argv),
        "host": _host(),
        "seconds": seconds,
        "kernel_path": _core.qlinear_path(),
        "kernel_threads": kernel_threads,
        "torch_threads": torch_threads_gguf,
        "anatomy_ms": {"float32 (before)": before, "gguf (after)": after},
        "verify_cost": costs.verify_cost,
        "cost_ratio": costs.cost_ratio,
        "target_step_ms": costs.target_step_s * 1e3,
        "weights_mb": weights_mb / 1e6,
        "peak_rss_mb": rss,
        "greedy_differences": differences,
        "greedy_prompts": len(prompts),
        "rows": table,
    }
    text = _markdown(report)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(report, indent=1))
        (out / "report.md").write_text(text)


def _host() -> str:
    fields = lscpu()
    if not fields:
        return "unknown"
    have = flags(fields)
    isa = "AVX-512" if "avx512f" in have else "AVX2" if "avx2" in have else "no AVX2"
    return f"{fields.get('Model name', '?')}, {os.cpu_count()} cores, {isa}"


def _markdown(r: dict[str, Any]) -> str:
    lines = [
        f"Host: {r['host']}; kernels: {r['kernel_path']} on {r['kernel_threads']} threads, "
        f"torch on {r['torch_threads']}; {r['seconds']:.0f} s",
        "",
    ]
    header = ["method", "workload", "T", "tokens/s", "vs llama.cpp", "vs ours gguf"]
    cells = [
        [
            x["method"],
            x["workload"],
            f"{x['temperature']:g}",
            f"{x['tokens_per_second']:.1f}",
            "" if x["vs_llama_cpp"] is None else f"{x['vs_llama_cpp']:.2f}x",
            "" if x["vs_ours_gguf"] is None else f"{x['vs_ours_gguf']:.2f}x",
        ]
        for x in r["rows"]
    ]
    lines += [markdown_table(header, cells), ""]
    for name, parts in r["anatomy_ms"].items():
        lines.append(
            f"step anatomy, {name}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in parts.items())
        )
    lines.append("v(1..9) = " + ", ".join(f"{v:.2f}" for v in r["verify_cost"]))
    lines.append("c = " + ", ".join(f"{k} {v:.3f}" for k, v in r["cost_ratio"].items()))
    lines.append(
        f"weights held: {r['weights_mb']:.1f} MB; peak RSS: "
        + ", ".join(f"{k} {v:.0f} MB" for k, v in r["peak_rss_mb"].items())
    )
    same = r["greedy_prompts"] - len(r["greedy_differences"])
    lines.append(
        f"greedy text equal to the float32 reference on {same} of {r['greedy_prompts']} "
        f"prompts; differences: {r['greedy_differences']}"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
