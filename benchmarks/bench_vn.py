"""v(n), the long-context step and batch decoding with only what every
revision of the package offers (`runner.forward`, before it `models.forward`;
`BatchEngine.forward_blocks`),
so a revision before the new forward can be measured beside it (build it in a
worktree, point PYTHONPATH at its `python/`, run each in its own process,
alternating).

SmolLM2 GGUF: n new positions after a random context of L (128, 512, 2048),
the cache cut back after each, 8 interleaved rounds, medians (the first
round dropped); then T(B, 1) of B = 1, 4, 8 rows after 128 cached positions.

    python benchmarks/bench_vn.py after [f32|q8]
"""

from __future__ import annotations

import copy
import statistics
import sys
import time

import torch
from specdec_rs import models
from specdec_rs.engine import BatchEngine

try:
    from specdec_rs import runner
except ImportError:  # a revision before `runner/`: the forward and cache calls in models
    runner = models  # type: ignore[assignment]


def main() -> None:
    label = sys.argv[1] if len(sys.argv) > 1 else "run"
    kw = {} if len(sys.argv) < 3 else {"activations": sys.argv[2]}
    m, _ = models.load_smollm2(**kw)
    vocab = models.vocab_of(m)
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for length in (128, 512, 2048):
            cache = runner.new_cache(m)
            runner.forward(m, torch.randint(0, vocab, (length,), generator=g), cache, keep=1)
            ns = (1, 2, 5, 9, 17)
            t: dict[int, list[float]] = {n: [] for n in ns}
            for _ in range(8):
                for n in ns:
                    x = torch.randint(0, vocab, (n,), generator=g)
                    start = time.perf_counter()
                    runner.forward(m, x, cache, keep=n)
                    t[n].append(time.perf_counter() - start)
                    runner.crop(cache, length)
                    time.sleep(0.005)
            med = {n: statistics.median(v[1:]) * 1e3 for n, v in t.items()}
            cells = " ".join(f"{n}:{med[n]:.2f}ms(v{med[n] / med[1]:.2f})" for n in ns)
            print(label, length, cells, flush=True)
        engine = BatchEngine(m, None, max_batch=8, k=0)
        base = runner.new_cache(m)
        runner.forward(m, torch.randint(0, vocab, (128,), generator=g), base, keep=1)
        caches = [copy.deepcopy(base) for _ in range(8)]
        tb: dict[int, list[float]] = {b: [] for b in (1, 4, 8)}
        for _ in range(8):
            for b in (1, 4, 8):
                blocks = [torch.randint(0, vocab, (1,), generator=g) for _ in range(b)]
                start = time.perf_counter()
                engine.forward_blocks(blocks, caches[:b], hidden=False)
                tb[b].append(time.perf_counter() - start)
                for c in caches[:b]:
                    runner.crop(c, 128)
                time.sleep(0.005)
        mb = {b: statistics.median(v[1:]) * 1e3 for b, v in tb.items()}
        print(label, "T(B, 1) ms", mb, f"throughput B = 8 vs 1: {8 * mb[1] / mb[8]:.2f}x")


if __name__ == "__main__":
    main()
