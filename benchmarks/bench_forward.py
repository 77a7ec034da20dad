"""The target forward over n positions, taken apart: what verification costs.

On SmolLM2-135M at its own precision (GGUF), for each activation mode
(`--activations f32,q8`, see `rust/quant.rs`), each type of cached keys
and values (`--cache-types f32,f16`, see `rust/kv.rs`; llama.cpp's
default is f16) and each context L:

1. v(n) = T(n) / T(1) for n new positions after L cached ones (logits for
   all n, as a verification forward needs), the cache cut back after each;
   and ours again back to back (runs of one n with no pause between the
   forwards, as a decoding loop runs them: on a host whose shared cache
   others use while ours idles, the pause below lengthens T(1) and so
   flatters v(n); `bench_settle.py`);
   beside the first, llama.cpp's own v(n) on the same file, host and threads
   (llama-cpp-python, `logits_all`, the same positions evaluated and
   removed from its cache), interleaved position count by position count.
2. The breakdown of T(n): the layer's phases measured inside the one Rust
   call of the forward (`_core.layer_profile`: products per weight,
   attention, norms, RoPE and cache writes, the activation), the LM head
   (timed alone on the same rows), the rest of the call (the final norm,
   buffers), and the Python and torch around it; each part beside its roofline:
   bytes read / the measured read bandwidth, and operations / the host's
   peak (float32 fused multiply-adds; q8: the integer dot products, 4x
   the float32 rate with VNNI, 2x without).
3. Batches: T(B, n) of B rows (`BatchEngine.forward_blocks`), and the decode
   throughput B / T(B, 1) against 1 / T(1, 1); each T the median of runs of
   `BATCH_RUN` forwards of one shape back to back (the first left out), as a
   batch decodes (timed one at a time among other shapes, T(1, 1) read 1.3-1.6x
   its back-to-back time and B = 8 over B = 1 3.2-3.7x instead of 2.25x).

Medians of `--repeats` rounds, the position counts interleaved in each
round; 10 ms pass after every timed call, so neither engine's spinning
threads (ours spin 2 ms after a product, llama.cpp's OpenMP ones after an
evaluation) run into the other's measurement. The host (lscpu), its
bandwidth and peak head the report.

    python benchmarks/bench_forward.py --out benchmarks/results/bench-forward
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from lscpu import flags, lscpu
from specdec_rs import _core, models, runner
from specdec_rs.engine import BatchEngine
from specdec_rs.gguf.modules import QuantLinear
from specdec_rs.measure.tables import markdown_table

SETTLE = 0.01  # seconds after each timed call: the other engine's spinning threads stop
PRODUCT_PHASES = ("qkv products", "o product", "gate_up product", "down product")
OTHER_PHASES = ("norms", "rope and cache writes", "activation")


def host() -> dict[str, Any]:
    """lscpu's vendor, family/model, the flags that matter; read bandwidth and peak."""
    fields = lscpu()
    have = flags(fields)
    wanted = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_tile")
    return {
        "cpu": f"{fields.get('Vendor ID', '?')} {fields.get('Model name', '?')}, family "
        f"{fields.get('CPU family', '?')} model {fields.get('Model', '?')}",
        "flags": [f for f in wanted if f in have],
        "cores": fields.get("CPU(s)", "?"),
        "kernel path": _core.qlinear_path(),
        "read GB/s (2 threads)": _core.read_bandwidth(512 << 20, 2) / 1e9,
        "fma Glanes/s (2 threads)": _core.fma_peak(2) / 1e9,
    }


def context_ids(vocab: int, length: int) -> torch.Tensor:
    return torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(length))


class Ours:
    """A GGUF file (default: SmolLM2's) in one activation mode and cache
    type, a cache prefilled to L, and the timed forward of n more positions
    (its layer calls counted)."""

    def __init__(self, activations: str, path: Path | None = None, cache_type: str = "f32"):
        if path is None:
            self.model, _ = models.load_smollm2(activations=activations, cache_type=cache_type)
        else:
            from specdec_rs.gguf import load_gguf

            self.model, _ = load_gguf(
                path, tokenizer=False, activations=activations, cache_type=cache_type
            )
        self.activations, self.cache_type = activations, cache_type
        self.vocab = models.vocab_of(self.model)
        self.calls = 0.0
        from specdec_rs.runner.stack import stack_of

        with torch.inference_mode():
            model_stack = stack_of(self.model, runner.new_cache(self.model))
        assert model_stack is not None, "a GGUF model has a Rust stack"
        stack, bench = model_stack.stack, self

        class Counted:
            """The Rust stack, its calls timed."""

            def forward(self, *args: Any, **kwargs: Any) -> Any:
                start = time.perf_counter()
                out = stack.forward(*args, **kwargs)
                bench.calls += time.perf_counter() - start
                return out

        model_stack.stack = Counted()  # type: ignore[assignment]

    def prefill(self, length: int) -> None:
        self.length = length
        self.cache = runner.new_cache(self.model)
        with torch.inference_mode():
            runner.forward(self.model, context_ids(self.vocab, length), self.cache, keep=1)

    def forward(self, n: int) -> dict[str, float]:
        """One timed forward of n positions: total, the layer calls, the phases, the head."""
        block = torch.randint(0, self.vocab, (n,), generator=torch.Generator().manual_seed(n))
        self.calls = 0.0
        _core.layer_profile(True)
        try:
            with torch.inference_mode():
                start = time.perf_counter()
                runner.forward(self.model, block, self.cache, keep=n)
                total = time.perf_counter() - start
        finally:
            phases = dict(_core.layer_profile_totals())
            _core.layer_profile(False)
        runner.crop(self.cache, self.length)
        head = self.model.lm_head
        x = torch.randn(n, head.in_features)
        start = time.perf_counter()
        head.product(x)
        return {"total": total, "calls": self.calls, "head": time.perf_counter() - start, **phases}

    def back_to_back(self, ns: list[int], repeats: int, run: int = 10) -> dict[int, float]:
        """Median seconds of a forward over each n in runs of `run` forwards
        of that n with no pause between them (as a decoding loop runs one
        shape: target only n = 1, speculation n = γ + 1; its own work between
        two forwards is shorter than the kernel workers' spin), the runs of
        the n in turn `repeats` times, no profiling; each run's first
        forward warms up."""
        g = torch.Generator().manual_seed(0)
        blocks = {n: torch.randint(0, self.vocab, (n,), generator=g) for n in ns}
        times: dict[int, list[float]] = {n: [] for n in ns}
        with torch.inference_mode():
            for _ in range(repeats):
                for n in ns:
                    for i in range(run):
                        start = time.perf_counter()
                        runner.forward(self.model, blocks[n], self.cache, keep=n)
                        seconds = time.perf_counter() - start
                        runner.crop(self.cache, self.length)
                        if i:
                            times[n].append(seconds)
        return {n: statistics.median(t) for n, t in times.items()}


class LlamaCpp:
    """llama.cpp on the same file (default: SmolLM2's): n positions
    evaluated after L, then removed."""

    def __init__(self, path: Path | None = None) -> None:
        from llama_cpp import Llama

        self.llm = Llama(
            str(path or models.smollm2_gguf()),
            n_threads=2,
            n_ctx=4096,
            n_batch=512,
            logits_all=True,
            verbose=False,
        )

    def prefill(self, length: int, vocab: int) -> None:
        self.llm.reset()
        self.llm._ctx.kv_cache_clear()
        self.length = length
        self.llm.eval(context_ids(vocab, length).tolist())

    def forward(self, n: int, vocab: int) -> float:
        block = torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(n)).tolist()
        start = time.perf_counter()
        self.llm.eval(block)
        seconds = time.perf_counter() - start
        self.llm._ctx.kv_cache_seq_rm(-1, self.length, -1)
        self.llm.n_tokens = self.length
        return seconds


def weight_bytes(model: Any) -> dict[str, int]:
    """Packed bytes of the layers' weights by projection, and of the LM head."""
    out = {"qkv products": 0, "o product": 0, "gate_up product": 0, "down product": 0}
    for layer in model.model.layers:
        out["qkv products"] += sum(p.nbytes for p in layer.qkv)
        out["o product"] += layer.o_proj.nbytes
        out["gate_up product"] += sum(p.nbytes for p in layer.gate_up)
        out["down product"] += layer.down_proj.nbytes
    out["LM head"] = model.lm_head.nbytes
    return out


def macs(model: Any) -> dict[str, int]:
    """Multiply-adds per position of each product."""
    out = {"qkv products": 0, "o product": 0, "gate_up product": 0, "down product": 0}
    for layer in model.model.layers:
        out["qkv products"] += sum(p.in_features * p.out_features for p in layer.qkv)
        out["o product"] += layer.o_proj.in_features * layer.o_proj.out_features
        out["gate_up product"] += sum(p.in_features * p.out_features for p in layer.gate_up)
        out["down product"] += layer.down_proj.in_features * layer.down_proj.out_features
    out["LM head"] = model.lm_head.in_features * model.lm_head.out_features
    return out


def breakdown(
    ours: Ours, samples: list[dict[str, float]], n: int, bandwidth: float, peak: float
) -> list[list[Any]]:
    """Rows (part, ms, roofline ms, what bounds it) of one (L, n)."""
    med = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
    model, config = ours.model, ours.model.config
    nbytes, ops = weight_bytes(model), macs(model)
    rate = peak * (1 if ours.activations == "f32" else 4 if "vnni" in _core.qlinear_path() else 2)
    rows = []
    for part in [*PRODUCT_PHASES, "LM head"]:
        ms = med["head" if part == "LM head" else part] * 1e3
        memory, compute = nbytes[part] / bandwidth * 1e3, n * ops[part] / rate * 1e3
        rows.append([part, ms, max(memory, compute), "memory" if memory > compute else "compute"])
    element = {"f32": 4.0, "f16": 2.0, "q8_0": 34 / 32}[ours.cache_type]
    kv = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * element
    attention_bytes = kv * (ours.length + n)
    rows.append(["attention", med["attention"] * 1e3, attention_bytes / bandwidth * 1e3, "memory"])
    other = sum(med[p] for p in OTHER_PHASES) * 1e3
    rows.append(["norms, RoPE, cache writes, activation", other, 0.0, "-"])
    phases = sum(med[p] for p in (*PRODUCT_PHASES, *OTHER_PHASES, "attention"))
    # the stack call holds the layers, the final norm and the LM head
    rows.append(["Rust call, the rest", (med["calls"] - phases - med["head"]) * 1e3, 0.0, "-"])
    rows.append(["Python and torch", (med["total"] - med["calls"]) * 1e3, 0.0, "-"])
    rows.append(["forward", med["total"] * 1e3, sum(r[2] for r in rows), "-"])
    return rows


BATCH_RUN = 10  # forwards of one batch shape back to back (`batch_rows`)


def batch_rows(ours: Ours, batches: list[int], ns: list[int], repeats: int) -> dict[str, float]:
    """T(B, n) in ms at a context of 128: medians of runs of `BATCH_RUN`
    forwards back to back, the shapes in turn."""
    engine = BatchEngine(ours.model, None, max_batch=max(batches), k=0)
    base = runner.new_cache(ours.model)
    with torch.inference_mode():
        runner.forward(ours.model, context_ids(ours.vocab, 128), base, keep=1)
        import copy

        caches = [copy.deepcopy(base) for _ in range(max(batches))]
        times: dict[tuple[int, int], list[float]] = {(b, n): [] for b in batches for n in ns}
        for _ in range(repeats):
            for b in batches:
                for n in ns:
                    blocks = [context_ids(ours.vocab, n) for _ in range(b)]
                    run = []
                    for _ in range(BATCH_RUN):
                        start = time.perf_counter()
                        engine.forward_blocks(blocks, caches[:b], hidden=False)
                        run.append(time.perf_counter() - start)
                        for c in caches[:b]:
                            runner.crop(c, 128)
                    times[(b, n)].append(statistics.median(run[1:]))
    return {f"T({b}, {n})": statistics.median(t) * 1e3 for (b, n), t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--activations", default="f32,q8")
    ap.add_argument("--cache-types", default="f32", help="f32, f16, q8_0, or several (f32,f16)")
    ap.add_argument("--contexts", default="128,512,2048")
    ap.add_argument("--ns", default="1,2,3,5,9,17")
    ap.add_argument("--batches", default="1,4,8")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    ns = [int(v) for v in args.ns.split(",")]
    contexts = [int(v) for v in args.contexts.split(",")]
    batches = [int(v) for v in args.batches.split(",")]
    machine = host()
    print(json.dumps(machine, indent=1))
    report: dict[str, Any] = {"host": machine, "modes": {}}
    anchor = None
    if not args.no_llama_cpp:
        try:
            anchor = LlamaCpp()
        except ImportError:
            print("llama-cpp-python is not installed: no llama.cpp anchor")
    modes = [(a, c) for a in args.activations.split(",") for c in args.cache_types.split(",")]
    for activations, cache_type in modes:
        ours = Ours(activations, cache_type=cache_type)
        name = activations if cache_type == "f32" else f"{activations}, {cache_type} cache"
        label = f"{activations} activations, {cache_type} cache"
        threads = next(m.threads for m in ours.model.modules() if isinstance(m, QuantLinear))
        mode: dict[str, Any] = {"kernel threads": threads, "contexts": {}}
        for length in contexts:
            ours.prefill(length)
            if anchor is not None:
                anchor.prefill(length, ours.vocab)
            samples: dict[int, list[dict[str, float]]] = {n: [] for n in ns}
            theirs: dict[int, list[float]] = {n: [] for n in ns}
            for round_ in range(args.repeats + 1):
                for n in ns:
                    sample = ours.forward(n)
                    time.sleep(SETTLE)
                    other = anchor.forward(n, ours.vocab) if anchor is not None else None
                    time.sleep(SETTLE)
                    if round_:  # the first round warms up
                        samples[n].append(sample)
                        if other is not None:
                            theirs[n].append(other)
            t = {n: statistics.median(s["total"] for s in samples[n]) for n in ns}
            steady = ours.back_to_back(ns, args.repeats)
            row: dict[str, Any] = {
                "ms": {n: t[n] * 1e3 for n in ns},
                "v": {n: t[n] / t[1] for n in ns},
                "back to back ms": {n: steady[n] * 1e3 for n in ns},
                "back to back v": {n: steady[n] / steady[1] for n in ns},
                "breakdown": {
                    n: breakdown(
                        ours,
                        samples[n],
                        n,
                        machine["read GB/s (2 threads)"] * 1e9,
                        machine["fma Glanes/s (2 threads)"] * 1e9,
                    )
                    for n in ns
                },
            }
            if anchor is not None:
                lt = {n: statistics.median(theirs[n]) for n in ns}
                row["llama.cpp ms"] = {n: lt[n] * 1e3 for n in ns}
                row["llama.cpp v"] = {n: lt[n] / lt[1] for n in ns}
            mode["contexts"][length] = row
            print(f"\n### {label}, context {length}")
            header = ["", *[f"n = {n}" for n in ns]]
            table = [
                ["ours ms", *[f"{row['ms'][n]:.2f}" for n in ns]],
                ["ours v(n)", *[f"{row['v'][n]:.2f}" for n in ns]],
                ["ours ms, back to back", *[f"{row['back to back ms'][n]:.2f}" for n in ns]],
                ["ours v(n), back to back", *[f"{row['back to back v'][n]:.2f}" for n in ns]],
            ]
            if anchor is not None:
                table += [
                    ["llama.cpp ms", *[f"{row['llama.cpp ms'][n]:.2f}" for n in ns]],
                    ["llama.cpp v(n)", *[f"{row['llama.cpp v'][n]:.2f}" for n in ns]],
                    [
                        "llama.cpp / ours",
                        *[f"{row['llama.cpp ms'][n] / row['ms'][n]:.2f}" for n in ns],
                    ],
                ]
            print(markdown_table(header, table))
            for n in (ns[0], 5 if 5 in ns else ns[-1], ns[-1]):
                print(f"\nbreakdown, n = {n} (ms; roofline: max(bytes / bandwidth, ops / peak))")
                rows = [[r[0], f"{r[1]:.2f}", f"{r[2]:.2f}", r[3]] for r in row["breakdown"][n]]
                print(markdown_table(["part", "ms", "roofline ms", "bound"], rows))
        b = batch_rows(ours, batches, [1, 5], args.repeats)
        mode["batches"] = b
        print(f"\n### {label}, batches at context 128 (ms)")
        print(markdown_table(["T(B, n)", "ms"], [[k, f"{v:.2f}"] for k, v in b.items()]))
        for bsz in batches:
            gain = bsz * b["T(1, 1)"] / b[f"T({bsz}, 1)"]
            print(f"decode throughput B = {bsz} vs B = 1: {gain:.2f}x")
        report["modes"][name] = mode
        del ours
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
