"""Two builds' products in one process, on the same packed weights: a
kernel change measured against the build before it.

`_core.qlinear` of SmolLM2-shaped weights (576x576, 192x576, 1536x576,
576x1536; K-quants 1024-wide shapes), 40 copies (about 50-90 MB, so every
call streams from memory), at each n, float32 and q8 activations. The
builds alternate call set by call set (their order swapped every repeat),
both read the same arrays (the packing is checked to be the same bytes),
and every output is checked to be the same bits; medians over the repeats.
Two processes would each get their own pages and their own drift; this
compares like with like.

`--hot`: also one weight called 150 times (it sits in L2): the tile's
arithmetic alone, against which the streaming time shows whether memory
and arithmetic overlap.

    # the build before: its extension, e.g. from a worktree's maturin build
    python benchmarks/bench_products_ab.py --before /tmp/base/python/specdec_rs/_core.abi3.so \\
        --formats Q4_1,Q8_0 --ns 1,2,5,9,17 --repeats 9 [--path avx2] [--hot]
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_formats import FORMATS_ALL, random_blocks
from specdec_rs import _core as new

SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536)]
SHAPES_K = [(1024, 1024), (256, 1024), (2816, 1024), (1024, 2816)]
# seconds between timed runs: past the kernel workers' 2 ms spin (`rust/pool.rs`), so
# one run's spinning worker never shares the two cores with the next run's, and
# short: after 10-50 ms idle on the Intel host, products ran 1.5-2x slower for a
# while (the weights evicted from the shared L3, the idle vCPU parked: wake-ups of
# 10-30 ms), which a 10 ms settle put into random cells (BENCHMARKS.md)
SETTLE = 0.003


def load_before(so: Path) -> Any:
    """The other build's `_core`, imported as `specdec_before._core`."""
    package = Path(tempfile.mkdtemp()) / "specdec_before"
    package.mkdir()
    (package / "__init__.py").touch()
    shutil.copy(so, package / "_core.abi3.so")
    sys.path.insert(0, str(package.parent))
    return importlib.import_module("specdec_before._core")


def timed(
    mod: Any, weights: list, xs: dict, outs: dict, ggml: int, path: str | None, act: str
) -> float:
    start = time.perf_counter()
    for packed, m, k in weights:
        mod.qlinear(xs[k], packed, ggml, m, outs[m], 2, path, act)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="the other build's _core.abi3.so")
    ap.add_argument("--formats", default="Q4_1,Q8_0")
    ap.add_argument("--activations", default="q8,f32")
    ap.add_argument("--ns", default="1,2,5,9,17")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument(
        "--path", default=None, help="an instruction path (quant.rs's names); default the best"
    )
    ap.add_argument("--hot", action="store_true")
    args = ap.parse_args()
    before = load_before(args.before)
    rng = np.random.default_rng(0)
    print(
        "| format | activations | n | before ms | after ms | after / before |"
        + (" hot ms |" if args.hot else "")
    )
    print("|---|---|---:|---:|---:|---:|" + ("---:|" if args.hot else ""))
    for kind in args.formats.split(","):
        ggml = FORMATS_ALL[kind][0]
        shapes = SHAPES_K if kind.endswith("_K") else SHAPES
        copies = 12 if kind.endswith("_K") else 40
        raws = [(random_blocks(kind, m, k, rng), m, k) for _ in range(copies) for m, k in shapes]
        weights = [(new.pack_weight(raw, ggml, k), m, k) for raw, m, k in raws]
        for (packed, _, _), (raw, _, k) in zip(weights, raws, strict=True):
            if not np.array_equal(packed, before.pack_weight(raw, ggml, k)):
                raise SystemExit("the two builds pack differently: compare them in two processes")
        for act in args.activations.split(","):
            for n in (int(v) for v in args.ns.split(",")):
                xs = {k: rng.standard_normal((n, k)).astype(np.float32) for _, k in shapes}
                outs = {
                    mod: {m: np.empty((n, m), np.float32) for m, _ in shapes}
                    for mod in (before, new)
                }
                times: dict[Any, list[float]] = {before: [], new: []}
                for rep in range(args.repeats):
                    for mod in (before, new) if rep % 2 == 0 else (new, before):
                        times[mod].append(timed(mod, weights, xs, outs[mod], ggml, args.path, act))
                        time.sleep(SETTLE)
                for m in outs[new]:
                    if not np.array_equal(
                        outs[new][m].view(np.uint32), outs[before][m].view(np.uint32)
                    ):
                        raise SystemExit(f"{kind} {act} n={n}: the builds' outputs differ")
                b, a = (statistics.median(times[mod]) * 1e3 for mod in (before, new))
                row = f"| {kind} | {act} | {n} | {b:.2f} | {a:.2f} | {a / b:.3f} |"
                if args.hot:  # the same bytes' worth of calls on one cached weight
                    one = weights[2:3] * 150
                    hot = statistics.median(
                        timed(new, one, xs, outs[new], ggml, args.path, act) for _ in range(5)
                    )
                    total = sum(w.nbytes for w, _, _ in weights)
                    row += f" {hot * 1e3 * total / (150 * weights[2][0].nbytes):.2f} |"
                print(row, flush=True)


if __name__ == "__main__":
    main()
