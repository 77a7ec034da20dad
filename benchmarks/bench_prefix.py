"""The prefix cache under multi-turn chat: prefill tokens computed against
the new tokens of each turn, and time to first token, with the cache on and
off (`specdec serve --prefix-cache-mb`, target only), one server after the other.

Each of `--conversations` conversations has `--turns` user turns (the chat
workload's prompts in turn as messages, a shared system message); turn t
sends the whole history (earlier questions and the server's own answers,
greedy, `--max-tokens` each), so without a cache every turn re-prefills
everything before it. `--concurrency` conversations run at once. Per server:
prompt tokens sent, prompt tokens computed (sent − `cached_tokens` of the
usage), the new tokens (a turn's prompt minus the previous turn's prompt
and answer; all of the first turn's), computed / new, the hit rate from
/metrics, and TTFT p50 / p95 of turns 2.. and of first turns.

    python benchmarks/bench_prefix.py --out benchmarks/results/bench-prefix
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx
from bench_serve import Server, percentile
from specdec_rs.measure.report import write_results
from specdec_rs.measure.tables import markdown_table
from specdec_rs.prompts import workloads

SYSTEM = "You are a helpful assistant. Answer clearly and keep each answer short."


async def turn(
    client: httpx.AsyncClient, server: Server, messages: list[dict[str, str]], max_tokens: int
) -> dict[str, Any]:
    body = {"model": server.model, "messages": messages, "max_tokens": max_tokens}
    body |= {"temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    sent, first, usage, text = time.perf_counter(), None, None, []
    async with client.stream("POST", server.url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for c in chunk.get("choices", []):
                piece = c.get("delta", {}).get("content")
                if piece:
                    first = first or time.perf_counter()
                    text.append(piece)
    assert usage is not None
    return {
        "ttft": (first or time.perf_counter()) - sent,
        "prompt": usage["prompt_tokens"],
        "cached": usage["prompt_tokens_details"]["cached_tokens"],
        "completion": usage["completion_tokens"],
        "text": "".join(text),
    }


async def conversation(
    client: httpx.AsyncClient, server: Server, questions: list[str], max_tokens: int
) -> list[dict[str, Any]]:
    messages = [{"role": "system", "content": SYSTEM}]
    out = []
    for q in questions:
        messages.append({"role": "user", "content": q})
        t = await turn(client, server, messages, max_tokens)
        messages.append({"role": "assistant", "content": t["text"]})
        out.append(t)
    return out


async def run_all(server: Server, chats: list[list[str]], concurrency: int, max_tokens: int) -> Any:
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as c:

        async def gated(qs: list[str]) -> list[dict[str, Any]]:
            async with gate:
                return await conversation(c, server, qs, max_tokens)

        return await asyncio.gather(*(gated(qs) for qs in chats))


def figures(server: Server, label: str, convs: list[list[dict[str, Any]]]) -> dict[str, Any]:
    turns = [t for conv in convs for t in conv]
    sent = sum(t["prompt"] for t in turns)
    computed = sum(t["prompt"] - t["cached"] for t in turns)
    new = 0
    for conv in convs:
        before = 0
        for t in conv:
            new += t["prompt"] - before
            before = t["prompt"] + t["completion"]
    metrics = {}
    for line in httpx.get(server.url + "/metrics").text.splitlines():
        for name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
            if line.startswith(name + "{"):
                metrics[name] = float(line.rsplit(" ", 1)[1])
    queries = metrics.get("vllm:prefix_cache_queries_total", 0.0)
    later = [t["ttft"] for conv in convs for t in conv[1:]]
    firsts = [conv[0]["ttft"] for conv in convs]
    return {
        "server": label,
        "sent": sent,
        "computed": computed,
        "new": new,
        "computed_over_new": computed / new,
        "hit_rate": metrics.get("vllm:prefix_cache_hits_total", 0.0) / queries if queries else 0.0,
        "ttft_later_p50_ms": 1000 * percentile(later, 0.5),
        "ttft_later_p95_ms": 1000 * percentile(later, 0.95),
        "ttft_first_p50_ms": 1000 * percentile(firsts, 0.5),
        "texts": [[t["text"] for t in conv] for conv in convs],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--cache-mb", type=float, default=256.0, help="the cached server's size")
    ap.add_argument("--server-args", default="")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    asks = workloads.prompts("chat")
    chats = [
        [asks[(c * args.turns + t) % len(asks)] for t in range(args.turns)]
        for c in range(args.conversations)
    ]
    extra = args.server_args.split()
    servers = {
        "off": Server("off", 0, 16, [*extra, "--prefix-cache-mb", "0"]),
        "cache": Server("off", 0, 16, [*extra, "--prefix-cache-mb", str(args.cache_mb)]),
    }
    results = []
    try:
        for label, server in servers.items():  # each its own process; one at a time
            convs = asyncio.run(run_all(server, chats, args.concurrency, args.max_tokens))
            results.append(figures(server, label, convs))
            print(f"{label}: {results[-1]['computed_over_new']:.2f} computed / new", flush=True)
    finally:
        for server in servers.values():
            server.stop()
    same = results[0]["texts"] == results[1]["texts"]
    rows = [
        [
            r["server"],
            str(r["sent"]),
            str(r["computed"]),
            str(r["new"]),
            f"{r['computed_over_new']:.2f}",
            f"{r['hit_rate']:.0%}",
            f"{r['ttft_first_p50_ms']:.0f}",
            f"{r['ttft_later_p50_ms']:.0f} / {r['ttft_later_p95_ms']:.0f}",
        ]
        for r in results
    ]
    header = ["prefix cache", "prompt tokens sent", "computed", "new", "computed / new",
              "hit rate", "TTFT turn 1 p50 ms", "TTFT turns 2.. p50 / p95 ms"]  # fmt: skip
    text = markdown_table(header, rows) + f"\n\nthe same answers with and without: {same}"
    print(text)
    if args.out is not None:
        write_results(args.out, {"args": vars(args) | {"out": str(args.out)}, "results": results},
                      text)  # fmt: skip
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
