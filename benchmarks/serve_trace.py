"""Traffic for `bench_serve.py --trace`: Poisson arrivals, mixed prompt and
output lengths, multi-turn conversations and repeated requests, replayed
against a `specdec serve` process.

A trace is a list of sessions. Sessions start at the arrival times of a
Poisson process of `rate` sessions per second; a session is one request,
or (with probability `multi_turn`) a conversation of 2–4 turns, each sent
when the answer to the one before has ended plus a think time (exponential,
mean `think` s), carrying the whole history (the server's own answers
included), or (with probability `repeated`) an exact copy of an earlier
single-turn request. Prompts are drawn from the code and chat workloads
(code: 156–446 tokens, chat: 38–44), each turn's output length from
`lengths` (greedy, `ignore_eos`, so a request does the work it asks for).
The same seed gives the same trace, so every server replays the same traffic.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass
from typing import Any

import httpx2 as httpx
from specdec_rs.prompts import workloads


@dataclass(frozen=True)
class Turn:
    content: str
    max_tokens: int
    think: float  # seconds after the previous turn's answer (0 for a first turn)


@dataclass(frozen=True)
class Session:
    start: float  # seconds after the trace's start
    turns: tuple[Turn, ...]
    kind: str  # "single", "conversation" or "repeat"


def make_trace(
    *,
    sessions: int,
    rate: float,
    multi_turn: float,
    repeated: float,
    lengths: list[int],
    think: float,
    seed: int,
) -> list[Session]:
    """`sessions` sessions (see the module docs)."""
    rng = random.Random(seed)
    pool = workloads.prompts("code") + workloads.prompts("chat")
    chat = workloads.prompts("chat")
    out: list[Session] = []
    t = 0.0
    for _ in range(sessions):
        t += rng.expovariate(rate)
        singles = [s for s in out if s.kind == "single"]
        draw = rng.random()
        if singles and draw < repeated:
            out.append(Session(t, rng.choice(singles).turns, "repeat"))
        elif draw < repeated + multi_turn:
            first = Turn(rng.choice(pool), rng.choice(lengths), 0.0)
            more = tuple(
                Turn(rng.choice(chat), rng.choice(lengths), rng.expovariate(1.0 / think))
                for _ in range(rng.randint(1, 3))
            )
            out.append(Session(t, (first, *more), "conversation"))
        else:
            out.append(Session(t, (Turn(rng.choice(pool), rng.choice(lengths), 0.0),), "single"))
    return out


async def request(
    client: httpx.AsyncClient, url: str, model: str, messages: Any, max_tokens: int
) -> dict[str, Any]:
    """One streamed greedy chat request: TTFT, TPOT, tokens, its text, its speculation usage."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    sent = time.perf_counter()
    first = last = None
    usage, text = None, []
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk.get("choices", []):
                piece = c.get("delta", {}).get("content")
                if piece:
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    text.append(piece)
    assert usage is not None and first is not None and last is not None
    n = usage["completion_tokens"]
    return {
        "sent": sent,
        "end": last,
        "ttft": first - sent,
        "tpot": (last - first) / (n - 1) if n > 1 else float("nan"),
        "tokens": n,
        "text": "".join(text),
        "speculation": usage["speculation"],
    }


async def replay(url: str, model: str, trace: list[Session]) -> tuple[list[dict[str, Any]], float]:
    """Every session of the trace at its time: (each request's figures, the
    wall clock from the first send to the last answer's end)."""
    timeout = httpx.Timeout(900.0)
    async with httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=256)) as c:
        started = time.perf_counter()

        async def session(s: Session) -> list[dict[str, Any]]:
            await asyncio.sleep(max(0.0, started + s.start - time.perf_counter()))
            messages: list[dict[str, str]] = []
            out = []
            for turn in s.turns:
                await asyncio.sleep(turn.think)
                messages.append({"role": "user", "content": turn.content})
                r = await request(c, url, model, list(messages), turn.max_tokens)
                messages.append({"role": "assistant", "content": r["text"]})
                out.append(r | {"kind": s.kind})
            return out

        done = await asyncio.gather(*(session(s) for s in trace))
        rows = [r for rs in done for r in rs]
        return rows, max(r["end"] for r in rows) - started
