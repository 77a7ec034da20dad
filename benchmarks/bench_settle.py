"""v(n) against the pause between forwards: back to back, as decoding runs, or
after an idle gap, as `bench_forward.py` times them.

On SmolLM2-135M at its own precision (GGUF), after a 128-token context:
for each pause (`--pauses`, ms) and activation mode, the median T(1) and
T(n) over `--repeats` forwards, each followed by the cache cut back and the
pause; the pauses in turn, the position counts interleaved within each.
Speculative decoding runs its forwards back to back (its verification and
drafting take well under the kernel workers' 2 ms spin), so the pause 0 row
is the v(n) it sees; `bench_forward.py` pauses 10 ms after every timed call
(so that neither its engine's nor llama.cpp's spinning threads run into the
other's measurement), which is what a host that idles between calls gives.

    python benchmarks/bench_settle.py --out benchmarks/results/bench-settle
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from lscpu import lscpu
from specdec_rs import models, runner
from specdec_rs.measure.report import write_results
from specdec_rs.measure.tables import markdown_table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--activations", default="f32,q8")
    ap.add_argument("--pauses", default="0,1,3,10", help="ms after each forward")
    ap.add_argument("--ns", default="1,5,9")
    ap.add_argument("--repeats", type=int, default=150)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    pauses = [float(p) for p in args.pauses.split(",")]
    ns = [int(n) for n in args.ns.split(",")]
    rows, record = [], []
    with torch.inference_mode():
        for act in args.activations.split(","):
            model, _ = models.load_smollm2(activations=act)
            vocab = models.vocab_of(model)
            g = torch.Generator().manual_seed(0)
            cache = runner.new_cache(model)
            runner.forward(model, torch.randint(0, vocab, (128,), generator=g), cache, keep=1)
            for pause in pauses:
                times: dict[int, list[float]] = {n: [] for n in ns}
                blocks = {n: torch.randint(0, vocab, (n,), generator=g) for n in ns}
                for _ in range(args.repeats):
                    for n in ns:
                        start = time.perf_counter()
                        runner.forward(model, blocks[n], cache, keep=n)
                        times[n].append(time.perf_counter() - start)
                        runner.crop(cache, 128)
                        if pause:
                            time.sleep(pause / 1e3)
                med = {n: statistics.median(v[1:]) * 1e3 for n, v in times.items()}
                rows.append(
                    [act, f"{pause:g}", f"{med[ns[0]]:.2f}"]
                    + [f"{med[n] / med[ns[0]]:.2f}" for n in ns[1:]]
                )
                record.append({"activations": act, "pause_ms": pause, "ms": med})
                print(rows[-1], flush=True)
    header = ["activations", "pause ms", f"T({ns[0]}) ms"] + [f"v({n})" for n in ns[1:]]
    text = markdown_table(header, rows)
    print(text)
    if args.out is not None:
        fields = lscpu()
        host = (
            f"{fields.get('Model name', '?')}, family {fields.get('CPU family', '?')} "
            f"model {fields.get('Model', '?')}"
        )
        write_results(args.out, {"args": vars(args) | {"out": str(args.out)}, "host": host,
                                 "runs": record}, text)  # fmt: skip


if __name__ == "__main__":
    main()
