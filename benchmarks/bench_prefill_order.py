"""Time to first token when many prompts arrive at once: the prefill order.

In one process, on SmolLM2-135M at its own precision (GGUF), `BatchEngine`
(target only, greedy, `--max-tokens` each, no EOS) takes `--requests`
prompts of a workload submitted together into as many slots (in a
seeded random order each repeat: the order they arrived in), three ways
interleaved run by run: each prompt prefilled alone as it joins
(`prefill_chunk=0`: every row waits), in chunks of `--chunk` tokens a round
oldest request first (`prefill_order="fifo"`), and shortest first aged by
the wait (`"shortest"`, the default). Per way: TTFT p50 / p95 (from the
submission to the request's first committed token), throughput, the ratio
of TTFT p50 to the stalling engine's of the same repeat, and the floor of
that ratio for these prompts: no order can give a median request its first
token before the shortest half of the prompts are prefilled, so p50 / the
stalling p50 ≥ Σ of the shortest half's prompt tokens / Σ of all (the
prefill costs about the same per token, compute-bound on a CPU).

    python benchmarks/bench_prefill_order.py --out benchmarks/results/bench-prefill-order
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from specdec_rs import models
from specdec_rs.engine import BatchEngine
from specdec_rs.engine.engine import PREFILL_CHUNK
from specdec_rs.engine.requests import Request
from specdec_rs.measure.report import write_results
from specdec_rs.measure.tables import markdown_table
from specdec_rs.prompts import workloads

WAYS = (("alone at the join", 0, "fifo"), ("chunks, fifo", None, "fifo"),
        ("chunks, shortest", None, "shortest"))  # fmt: skip


def one_run(
    model: Any, prompts: list[torch.Tensor], chunk: int, order: str, max_tokens: int
) -> dict[str, float]:
    """TTFT of each request (seconds from the submission), and tokens/s."""
    first: dict[int, float] = {}
    start = [0.0]

    def on_commit(rid: int, _round: Any, tokens: list[int]) -> None:
        if tokens and rid not in first:
            first[rid] = time.perf_counter() - start[0]

    engine = BatchEngine(
        model, None, max_batch=len(prompts), k=0, prefill_chunk=chunk, prefill_order=order,
        on_commit=on_commit,
    )  # fmt: skip
    requests = [Request(p, max_tokens, temperature=0.0, eos_token_id=[]) for p in prompts]
    start[0] = time.perf_counter()
    out = engine.run(requests)
    wall = time.perf_counter() - start[0]
    ttft = sorted(first.values())
    return {
        "ttft_p50": statistics.median(ttft),
        "ttft_p95": ttft[round(0.95 * (len(ttft) - 1))],
        "tokens_per_second": out.new_tokens / wall,
    }


def floor_ratio(prompts: list[torch.Tensor]) -> float:
    """Σ of the shortest half's prompt tokens (the median's, halfway
    between the two middle ones) over Σ of all."""
    lengths = sorted(len(p) - 1 for p in prompts)  # the last token runs in the first round
    cumulative = [sum(lengths[: i + 1]) for i in range(len(lengths))]
    n = len(lengths)
    median = (cumulative[(n - 1) // 2] + cumulative[n // 2]) / 2
    return median / cumulative[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", nargs="+", default=["code", "chat"])
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=None, help="prefill_chunk (default: the engine's)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    model, tokenizer = models.load_smollm2()
    chunked = args.chunk if args.chunk is not None else PREFILL_CHUNK
    rows, record = [], []
    for workload in args.workloads:
        prompts = workloads.prompt_set(tokenizer, workload, args.requests)
        runs: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in WAYS}
        g = torch.Generator().manual_seed(0)
        for _ in range(args.repeats):
            # the arrival order: a server numbers requests as they arrive, not by length
            arrived = [prompts[i] for i in torch.randperm(len(prompts), generator=g).tolist()]
            for name, chunk, order in WAYS:  # interleaved: the host's drift hits them all
                r = one_run(
                    model, arrived, chunked if chunk is None else chunk, order, args.max_tokens
                )
                runs[name].append(r)
                print(workload, name, {k: round(v, 3) for k, v in r.items()}, flush=True)
        base = [r["ttft_p50"] for r in runs[WAYS[0][0]]]
        floor = floor_ratio(prompts)
        for name, _, _ in WAYS:
            mine = runs[name]
            ratio = statistics.median(r["ttft_p50"] / b for r, b in zip(mine, base, strict=True))
            p50 = statistics.median(r["ttft_p50"] for r in mine)
            p95 = statistics.median(r["ttft_p95"] for r in mine)
            tps = statistics.median(r["tokens_per_second"] for r in mine)
            rows.append([workload, name, f"{p50 * 1e3:.0f} / {p95 * 1e3:.0f}", f"{tps:.1f}",
                         f"{ratio:.2f}x", f"{floor:.2f}x"])  # fmt: skip
            record.append({"workload": workload, "way": name, "runs": mine, "ratio": ratio,
                           "floor": floor})  # fmt: skip
    text = markdown_table(
        [
            "workload",
            "prefill",
            "TTFT p50 / p95 ms",
            "tokens/s",
            "TTFT p50 vs alone at the join",
            "floor of that ratio",
        ],  # fmt: skip
        rows,
    )
    print(text)
    if args.out is not None:
        write_results(args.out, {"args": vars(args) | {"out": str(args.out)}, "runs": record}, text)


if __name__ == "__main__":
    main()
