"""The GGUF formats at their own precision: the kernels per format, and
whole files against llama.cpp.

1. **Kernels.** For each native block format, `_core.qlinear` over a set of
   weights of 0.4B-model shapes (about 200 MB packed, so
   every call streams its weight from memory), at n = 1, 5 and 9 positions,
   float32 activations and (the 32-block formats) q8 ones: the time per
   byte of the file, the bytes per second against the host's measured read
   bandwidth, and the ratio to Q4_1's time per byte. Weights are random
   valid blocks (the speed does not depend on the values).
2. **Files** (`--models`; default: the shipped SmolLM2 file, SmolLM2
   requantized to Q4_K_M by llama.cpp's own quantizer, and a random
   Llama-shaped 0.4B model written by `gguf.writer` in F16 and quantized to
   Q4_K_M by llama.cpp): the tensor types, the file size, one decode step
   and v(5) for ours (f32 and q8 activations) and llama.cpp (llama-cpp-python,
   `logits_all`, the same positions evaluated and removed), interleaved
   round by round; the greedy identity of our speculation (prompt lookup,
   k = 4) with our target-only text on each file; and the peak RSS of one
   generation in a fresh process against the file's size.

    python benchmarks/bench_formats.py --out benchmarks/results/bench-formats
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from specdec_rs import _core
from specdec_rs.measure.tables import markdown_table

SETTLE = 0.01  # seconds after each timed call (spinning threads stop)
FORMATS_ALL = {
    "Q4_0": (2, 32, 18),
    "Q4_1": (3, 32, 20),
    "Q5_0": (6, 32, 22),
    "Q5_1": (7, 32, 24),
    "Q8_0": (8, 32, 34),
    "IQ4_NL": (20, 32, 18),
    "Q4_K": (12, 256, 144),
    "Q5_K": (13, 256, 176),
    "Q6_K": (14, 256, 210),
}
FORMATS = dict(FORMATS_ALL)
# (out, in) shapes of a 0.4B model's projections, and SmolLM2's down
# projection (rows of whole 256-blocks, so every format takes them)
SHAPES = [(4096, 1024), (1024, 4096), (2816, 1024), (1024, 2816), (576, 1536)]


def random_blocks(kind: str, m: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """m rows of random valid blocks of `kind` (modest float16 scales)."""
    _, elems, size = FORMATS[kind]
    blocks = rng.integers(0, 256, (m * k // elems, size), dtype=np.uint8)
    halves = rng.uniform(2**-10, 2**-4, (len(blocks), 2)).astype(np.float16).view(np.uint8)
    at = {"Q6_K": [208]}.get(kind, [0, 2] if kind in ("Q4_1", "Q5_1", "Q4_K", "Q5_K") else [0])
    for i, a in enumerate(at):
        blocks[:, a : a + 2] = halves[:, 2 * i : 2 * i + 2]
    return np.ascontiguousarray(blocks).reshape(m, -1)


def kernel_rows(ns: list[int], repeats: int, mb: int) -> list[dict[str, Any]]:
    """Seconds per file byte of each format (medians), each call a fresh
    weight; the formats, modes and position counts interleaved in every repeat."""
    rng = np.random.default_rng(0)
    weights: dict[str, list[tuple[np.ndarray, int, int]]] = {}
    file_bytes: dict[str, int] = {}
    for kind, (ggml, _, _) in FORMATS.items():
        weights[kind], file_bytes[kind] = [], 0
        while file_bytes[kind] < mb * 2**20:
            for m, k in SHAPES:
                raw = random_blocks(kind, m, k, rng)
                weights[kind].append((_core.pack_weight(raw, ggml, k), m, k))
                file_bytes[kind] += raw.nbytes
    runs = [(kind, activations, n) for n in ns for kind in FORMATS for activations in ("f32", "q8")]
    xs = {(n, k): rng.standard_normal((n, k)).astype(np.float32) for n in ns for _, k in SHAPES}
    outs = {(n, m): np.empty((n, m), np.float32) for n in ns for m, _ in SHAPES}
    per_byte: dict[tuple[str, str, int], list[float]] = {run: [] for run in runs}
    for _ in range(repeats):
        for kind, activations, n in runs:
            ggml = FORMATS[kind][0]
            spent = 0.0
            for packed, m, k in weights[kind]:
                start = time.perf_counter()
                _core.qlinear(xs[(n, k)], packed, ggml, m, outs[(n, m)], 2, None, activations)
                spent += time.perf_counter() - start
            per_byte[(kind, activations, n)].append(spent / file_bytes[kind])
            time.sleep(SETTLE)
    rows = []
    for (kind, activations, n), values in per_byte.items():
        median = statistics.median(values)
        rows.append(
            {
                "format": kind,
                "activations": activations,
                "n": n,
                "ns per KB": median * 1e12,
                "GB/s": 1e-9 / median,
                "spread": (max(values) - min(values)) / median,
            }
        )
    base = {(r["activations"], r["n"]): r["ns per KB"] for r in rows if r["format"] == "Q4_1"}
    for r in rows:
        r["vs Q4_1 f32 per byte"] = r["ns per KB"] / base[("f32", r["n"])]
        r["vs Q4_1 same mode"] = r["ns per KB"] / base[(r["activations"], r["n"])]
    return sorted(rows, key=lambda r: (r["n"], r["activations"], r["format"]))


def table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of dict rows (floats to 3 significant digits)."""
    header = list(rows[0])

    def cell(v: Any) -> str:
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    return markdown_table(header, [[cell(r.get(h, "")) for h in header] for r in rows])


def llama_cpp_quantize(src: Path, dst: Path, ftype: int = 15) -> None:
    """`src` requantized by llama.cpp's own quantizer (ftype 15: Q4_K_M)."""
    import ctypes

    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    params.nthread = 2
    saved = os.dup(2)  # its per-tensor log goes to /dev/null
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
        try:
            rc = llama_cpp.llama_model_quantize(
                str(src).encode(), str(dst).encode(), ctypes.byref(params)
            )
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src} -> {dst}) returned {rc}")


def synthetic_llama(work: Path) -> Path:
    """A random Llama-shaped 0.4B model (hidden 1024, 24 layers, 16 heads,
    4 KV heads, MLP 4096, SmolLM2's vocabulary size and tokenizer), written
    by `gguf.writer` in F16 and quantized to Q4_K_M by llama.cpp."""
    out = work / "llama-0.4b-Q4_K_M.gguf"
    if out.exists():
        return out
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=1024,
        intermediate_size=4096,
        num_hidden_layers=24,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=64,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    write_q4_k_m(model, out)
    return out


def write_q4_k_m(model: Any, out: Path) -> None:
    """`model` written in F16 by `gguf.writer` (SmolLM2's tokenizer) next to
    `out`, quantized into `out` by llama.cpp's quantizer (Q4_K_M), the F16
    file removed."""
    from specdec_rs import models
    from specdec_rs.gguf.writer import write_gguf

    f16 = out.with_name(out.name.replace("Q4_K_M", "F16"))
    write_gguf(model, f16, linear_type="F16", embed_type="F16", tokenizer=models.smollm2_gguf())
    llama_cpp_quantize(f16, out)
    f16.unlink()


def default_files(work: Path) -> list[Path]:
    from specdec_rs import models

    work.mkdir(parents=True, exist_ok=True)
    shipped = models.smollm2_gguf()
    requantized = work / "SmolLM2-135M-Instruct-Q4_K_M.gguf"
    if not requantized.exists():
        llama_cpp_quantize(shipped, requantized)
    return [shipped, requantized, synthetic_llama(work)]


# VmHWM, not ru_maxrss: a child's ru_maxrss starts at the forking parent's RSS
RSS_SCRIPT = """
import sys, torch, specdec_rs as sd
from specdec_rs.gguf import load_gguf
model, _ = load_gguf(sys.argv[1], tokenizer=False)
ids = torch.arange(64) * 7 % 1000
sd.generate(model, sd.PromptLookup(), ids, max_new_tokens=32, temperature=0, eos_token_id=[], k=4)
print(open("/proc/self/status").read().split("VmHWM:")[1].split()[0])  # kB
"""


def file_rows(paths: list[str] | None, work: Path, rounds: int) -> list[dict[str, Any]]:
    """Per file: its types and size, ours (f32, q8) and llama.cpp's step and
    v(5) after 128 positions (medians, interleaved), greedy identity, peak RSS."""
    from collections import Counter

    import specdec_rs as sd
    import torch
    from bench_forward import LlamaCpp, Ours
    from specdec_rs.gguf.reader import read

    files = [Path(p) for p in paths] if paths else default_files(work)
    rows = []
    for path in files:
        types = Counter(t.type_name for t in read(path).tensors.values() if len(t.shape) > 1)
        ours = {mode: Ours(mode, path) for mode in ("f32", "q8")}
        llama = LlamaCpp(path)
        vocab = ours["f32"].vocab
        context = 128
        for o in ours.values():
            o.prefill(context)
        llama.prefill(context, vocab)
        times: dict[tuple[str, int], list[float]] = {}
        for _ in range(rounds):
            for n in (1, 5):
                for mode, o in ours.items():
                    times.setdefault((mode, n), []).append(o.forward(n)["total"])
                    time.sleep(SETTLE)
                times.setdefault(("llama.cpp", n), []).append(llama.forward(n, vocab))
                time.sleep(SETTLE)
        med = {key: statistics.median(v) for key, v in times.items()}
        ids = torch.cat([torch.arange(40) * 13 % vocab] * 2)
        same = []
        for mode, o in ours.items():
            plain = sd.generate(
                o.model, None, ids, max_new_tokens=32, temperature=0, eos_token_id=[]
            )
            spec = sd.generate(
                o.model,
                sd.PromptLookup(),
                ids,
                max_new_tokens=32,
                temperature=0,
                eos_token_id=[],
                k=4,
            )
            same.append(f"{mode} {'yes' if spec.tokens == plain.tokens else 'NO'}")
        del ours, llama
        rss = subprocess.run(
            [sys.executable, "-c", RSS_SCRIPT, str(path)],
            capture_output=True,
            text=True,
            check=True,
        )
        rows.append(
            {
                "file": path.name,
                "MB": path.stat().st_size / 2**20,
                "types": " ".join(f"{k}×{v}" for k, v in sorted(types.items())),
                "f32 step ms": med[("f32", 1)] * 1e3,
                "f32 v(5)": med[("f32", 5)] / med[("f32", 1)],
                "q8 step ms": med[("q8", 1)] * 1e3,
                "q8 v(5)": med[("q8", 5)] / med[("q8", 1)],
                "llama.cpp step ms": med[("llama.cpp", 1)] * 1e3,
                "llama.cpp v(5)": med[("llama.cpp", 5)] / med[("llama.cpp", 1)],
                "llama.cpp / f32 step": med[("llama.cpp", 1)] / med[("f32", 1)],
                "llama.cpp / q8 step": med[("llama.cpp", 1)] / med[("q8", 1)],
                "speculative == target-only": ", ".join(same),
                "peak RSS MB": int(rss.stdout.split()[-1]) / 1024,
            }
        )
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ns", default="1,5,9")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--mb", type=int, default=200, help="packed weight megabytes per format")
    ap.add_argument("--skip-kernels", action="store_true")
    ap.add_argument("--skip-files", action="store_true")
    ap.add_argument("--models", nargs="*", default=None, help="GGUF files (default: see above)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/specdec-bench-formats"))
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--formats", default=",".join(FORMATS_ALL))
    args = ap.parse_args()
    FORMATS.clear()
    FORMATS.update({f: FORMATS_ALL[f] for f in args.formats.split(",")})
    from bench_forward import host

    report: dict[str, Any] = {"host": host()}
    print(report["host"], flush=True)
    md = [f"Host: {report['host']}", ""]
    if not args.skip_kernels:
        ns = [int(v) for v in args.ns.split(",")]
        report["kernels"] = kernel_rows(ns, args.repeats, args.mb)
        md += ["## Kernels: time per file byte", "", table(report["kernels"]), ""]
    if not args.skip_files:
        report["files"] = file_rows(args.models, args.work, args.rounds)
        md += ["## Files", "", table(report["files"]), ""]
    text = "\n".join(md)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(report, indent=1))
        (args.out / "report.md").write_text(text)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
