"""`bench_serve.py --trace`'s traffic replayed in process on a `BatchEngine`
(no server, no HTTP): speculation off, a fixed γ and the goodput policy, in
turn, on SmolLM2.

The trace is `serve_trace.make_trace`'s (Poisson sessions, conversations
whose later turns carry the history with the engine's own answers, repeated
requests; greedy, `ignore_eos`). Sessions are submitted at their times and
each later turn when the one before has ended plus its think time; the
engine steps whenever it has work. Per mode: the wall clock, the busy time
(the rounds' seconds), tokens per busy second, the rounds that carried a
prefill piece and the others, and for the policy the γ its rows asked and
its predicted / measured tokens per second (median over the rounds without a
prefill piece). `--probe`: the policy's probe interval (`Goodput(probe=)`).

    SPECDEC_KERNEL_THREADS=2 python benchmarks/bench_trace_engine.py --rate 2.0 \\
        --modes off fixed goodput
"""

from __future__ import annotations

import argparse
import collections
import heapq
import statistics
import time
from typing import Any

from serve_trace import make_trace
from specdec_rs import models
from specdec_rs.engine.build import engine_for
from specdec_rs.engine.requests import Request
from specdec_rs.policy import Goodput
from specdec_rs.prompts import workloads


def replay(target: Any, tokenizer: Any, trace: list[Any], mode: str, args: Any) -> None:
    """One mode over the whole trace; prints its figures."""
    if mode == "off":
        built = engine_for(target, tokenizer, "none", max_batch=args.max_batch)
    elif mode == "fixed":
        built = engine_for(target, tokenizer, "prompt-lookup", k=args.k, max_batch=args.max_batch)
    else:
        policy = Goodput(probe=args.probe)
        built = engine_for(
            target, tokenizer, "prompt-lookup", goodput=policy, max_batch=args.max_batch
        )
    engine = built.engine
    engine.steps = []
    events = [(s.start, i, 0) for i, s in enumerate(trace)]  # (time, session, turn)
    heapq.heapify(events)
    history: dict[int, list[dict[str, str]]] = {i: [] for i in range(len(trace))}
    running: dict[int, tuple[int, int]] = {}
    total, done = sum(len(s.turns) for s in trace), 0
    start = time.perf_counter()
    while done < total:
        now = time.perf_counter() - start
        while events and events[0][0] <= now:
            _, si, ti = heapq.heappop(events)
            turn = trace[si].turns[ti]
            history[si].append({"role": "user", "content": turn.content})
            prompt = workloads.encode(tokenizer, list(history[si]))
            request = Request(prompt, turn.max_tokens, temperature=0.0, eos_token_id=None)
            running[engine.submit(request)] = (si, ti)
        if engine.active or engine.queued:
            for finished in engine.step():
                si, ti = running.pop(finished.id)
                done += 1
                assert finished.result is not None, finished.error
                answer = tokenizer.decode(finished.result.tokens, skip_special_tokens=True)
                history[si].append({"role": "assistant", "content": answer})
                if ti + 1 < len(trace[si].turns):
                    later = time.perf_counter() - start + trace[si].turns[ti + 1].think
                    heapq.heappush(events, (later, si, ti + 1))
        elif events:
            time.sleep(max(0.0, events[0][0] - now))
    wall = time.perf_counter() - start
    steps = engine.steps
    tokens, busy = sum(s.tokens for s in steps), sum(s.seconds for s in steps)
    piece = [s for s in steps if s.prefill]
    print(
        f"{mode}: wall {wall:.1f} s, busy {busy:.1f} s, {tokens} tokens, "
        f"{tokens / busy:.1f} tokens per busy second; rounds with a prefill piece "
        f"{len(piece)} ({sum(s.seconds for s in piece):.1f} s), others "
        f"{len(steps) - len(piece)} ({busy - sum(s.seconds for s in piece):.1f} s)"
    )
    if built.policy is not None:
        ks = collections.Counter(k for s in steps if s.ks for k in s.ks)
        ratios = [
            s.predicted_goodput / (s.tokens / s.seconds)
            for s in steps
            if s.predicted_goodput and not s.prefill and s.seconds > 0 and s.tokens
        ]
        print(
            f"   row rounds by γ {sorted(ks.items())}; predicted / measured "
            f"{statistics.median(ratios):.3f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=2.0, help="sessions per second")
    ap.add_argument("--sessions", type=int, default=48)
    ap.add_argument("--modes", nargs="+", default=["off", "fixed", "goodput"])
    ap.add_argument("--k", type=int, default=3, help="the fixed γ")
    ap.add_argument("--probe", type=int, default=32, help="the policy's probe interval")
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    target, tokenizer = models.load_smollm2()
    trace = make_trace(
        sessions=args.sessions,
        rate=args.rate,
        multi_turn=0.25,
        repeated=0.15,
        lengths=[16, 64, 128, 256],
        think=1.0,
        seed=args.seed,
    )
    for mode in args.modes:
        replay(target, tokenizer, trace, mode, args)


if __name__ == "__main__":
    main()
