"""`specdec serve` under load: throughput and latency at rising concurrency.

Three servers run side by side (`specdec serve` processes on 127.0.0.1,
the same model): speculation off (`--drafter none`), a fixed γ (`--k K`,
prompt lookup) and the load-aware goodput policy (prompt lookup). For each
concurrency C (1, 2, 4, 8, 16) the same `--requests` requests (the
workload's prompts in turn, greedy, `max_tokens` each with `ignore_eos`, so
every request does the same work) go to each server with at most C in
flight, the servers' turns interleaved (with --repeats R, each setting's run
of median throughput; of two, the faster). Per setting: throughput (completion tokens / wall clock
of the whole set), time to first token and time per output token (after
the first) at p50 and p95 over the requests, the mean acceptance length
(from the responses' usage) and the γ the server's rows asked for (from
its /metrics); the speedup is the throughput over the off server's at the
same C, same run. --prefill-chunks 0 64 runs each server at each
`--prefill-chunk` (0: a joining request prefills alone, stalling the
batch), so the chunked prefill's TTFT and throughput are a same-run ratio;
--prefill-orders shortest fifo likewise for `--prefill-order`; and
--before-package DIR runs each speculating mode twice, the second from the
specdec_rs package in DIR (the code before a change), in the same run.

--trace RATE replays traffic instead of closed-loop concurrency
(`serve_trace`: Poisson arrivals at RATE sessions per second, mixed code and
chat prompts and output lengths, a share of multi-turn conversations and of
repeated requests; the same seeded trace to every server, the servers' turns
interleaved). Per server: throughput (completion tokens / wall clock from
the first send to the last answer), TTFT and TPOT p50 / p99, and the
goodput: requests per second meeting both the TTFT and the TPOT SLO
(`--slo-ttft`, `--slo-tpot`), and their share.

    python benchmarks/bench_serve.py --out benchmarks/results/bench-serve
    python benchmarks/bench_serve.py --trace 0.5 --sessions 48 --repeats 2 \
        --out benchmarks/results/bench-serve-trace
    python benchmarks/bench_serve.py --workloads code --concurrency 16 \
        --modes off goodput --prefill-chunks 0 64 --out benchmarks/results/bench-prefill
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import httpx2 as httpx
from serve_trace import make_trace, replay, request
from specdec_rs.measure.report import write_results
from specdec_rs.measure.tables import fmt, markdown_table
from specdec_rs.prompts import workloads


@dataclass(frozen=True)
class Setting:
    workload: str
    mode: str  # "off", "fixed", "goodput"
    prefill_chunk: int | None  # the server's --prefill-chunk (None: its default)
    prefill_order: str | None  # the server's --prefill-order (None: its default)
    concurrency: int
    requests: int
    tokens: int
    wall_s: float
    tokens_per_second: float
    ttft_p50_ms: float
    ttft_p95_ms: float
    tpot_p50_ms: float
    tpot_p95_ms: float
    mean_acceptance_length: float | None
    rounds_by_k: dict[str, float]
    ttft_p50_runs_ms: tuple[float, ...] = ()  # every repeat's TTFT p50 (the run above is one)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    at = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[at]


POLICY_COUNTERS = ("probes", "switches")  # specdec:goodput_<name>_total


class Server:
    """A `specdec serve` process on a free port."""

    def __init__(
        self,
        mode: str,
        k: int,
        max_batch: int,
        extra: list[str],
        chunk: int | None = None,
        order: str | None = None,
        package: Path | None = None,
    ):
        argv = [sys.executable, "-m", "specdec_rs", "serve", "--port", "0", "--log-level"]
        argv += ["warning", "--max-batch", str(max_batch), "--max-queue", "1000", *extra]
        if chunk is not None:
            argv += ["--prefill-chunk", str(chunk)]
        if order is not None:
            argv += ["--prefill-order", order]
        self.chunk, self.order = chunk, order
        if mode == "off":
            argv += ["--drafter", "none"]
        elif mode == "fixed":
            argv += ["--drafter", "prompt-lookup", "--k", str(k)]
        else:
            argv += ["--drafter", "prompt-lookup"]
        self.mode = mode if package is None else f"{mode} (before)"
        # every server on the same kernel threads: a thread count measured while another
        # server starts beside it could differ (each server chooses its own at load)
        env = {**os.environ}
        if package is not None:  # its specdec_rs ahead of the installed one
            env["PYTHONPATH"] = os.pathsep.join([str(package), env.get("PYTHONPATH", "")])
        env.setdefault("SPECDEC_KERNEL_THREADS", "2" if (os.cpu_count() or 1) >= 2 else "1")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if " on http" not in line:
            raise RuntimeError(f"the {mode} server did not start: {line!r}")
        self.url = line.split(" on ")[1].split("/v1")[0]
        self.model = line.split("specdec serve: ")[1].split(" on ")[0]

    def counters(self) -> tuple[dict[str, float], dict[str, float]]:
        """From one /metrics scrape: row rounds by the γ asked, and the
        goodput policy's probes and switches (empty for the other servers)."""
        by_k: dict[str, float] = {}
        policy: dict[str, float] = {}
        for line in httpx.get(self.url + "/metrics").text.splitlines():
            if line.startswith("specdec:spec_decode_rounds_total{"):
                head, value = line.rsplit(" ", 1)
                k = head.split('k="')[1].split('"')[0]
                by_k[k] = by_k.get(k, 0.0) + float(value)
            for name in POLICY_COUNTERS:
                if line.startswith(f"specdec:goodput_{name}_total{{"):
                    policy[name] = float(line.rsplit(" ", 1)[1])
        return by_k, policy

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.communicate(timeout=120)


async def level(
    server: Server, prompts: list[Any], requests: int, concurrency: int, max_tokens: int
) -> tuple[list[dict[str, Any]], float]:
    gate = asyncio.Semaphore(concurrency)
    timeout = httpx.Timeout(600.0)
    async with httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=64)) as c:

        async def gated(i: int) -> dict[str, Any]:
            async with gate:
                messages = [{"role": "user", "content": prompts[i % len(prompts)]}]
                return await request(c, server.url, server.model, messages, max_tokens)

        started = time.perf_counter()
        out = await asyncio.gather(*(gated(i) for i in range(requests)))
        return list(out), time.perf_counter() - started


def measure(
    server: Server, workload: str, prompts: list[Any], args: argparse.Namespace, c: int
) -> Setting:
    before, _ = server.counters()
    rows, wall = asyncio.run(level(server, prompts, args.requests, c, args.max_tokens))
    after, _ = server.counters()
    tokens = sum(r["tokens"] for r in rows)
    drafts = sum(r["speculation"]["num_drafts"] for r in rows)
    accepted = sum(r["speculation"]["num_accepted_tokens"] for r in rows)
    return Setting(
        workload,
        server.mode,
        server.chunk,
        server.order,
        c,
        len(rows),
        tokens,
        wall,
        tokens / wall,
        1000 * percentile([r["ttft"] for r in rows], 0.5),
        1000 * percentile([r["ttft"] for r in rows], 0.95),
        1000 * percentile([r["tpot"] for r in rows], 0.5),
        1000 * percentile([r["tpot"] for r in rows], 0.95),
        1 + accepted / drafts if drafts else None,
        {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after},
    )


Run = TypeVar("Run", "Setting", "TraceSetting")


def median_setting(runs: list[Run]) -> Run:
    """The run whose throughput is the median (its other figures with it)."""
    ordered = sorted(runs, key=lambda s: s.tokens_per_second)
    return ordered[len(ordered) // 2]


def table(settings: list[Setting]) -> str:
    off = {
        (s.workload, s.concurrency, s.prefill_chunk, s.prefill_order): s.tokens_per_second
        for s in settings
        if s.mode == "off"
    }
    rows = []
    for s in settings:
        base = off.get((s.workload, s.concurrency, s.prefill_chunk, s.prefill_order))
        gamma = gamma_shares(s.rounds_by_k)
        rows.append(
            [
                s.workload,
                str(s.concurrency),
                s.mode,
                "default" if s.prefill_chunk is None else str(s.prefill_chunk),
                "default" if s.prefill_order is None else s.prefill_order,
                f"{s.tokens_per_second:.1f}",
                f"{s.tokens_per_second / base:.2f}x" if base else "",
                f"{s.ttft_p50_ms:.0f} / {s.ttft_p95_ms:.0f}",
                f"{statistics.median(s.ttft_p50_runs_ms):.0f}" if s.ttft_p50_runs_ms else "",
                f"{s.tpot_p50_ms:.1f} / {s.tpot_p95_ms:.1f}",
                fmt(s.mean_acceptance_length, ".2f"),
                gamma,
            ]
        )
    header = [
        "workload",
        "C",
        "speculation",
        "prefill chunk",
        "prefill order",
        "tokens/s",
        "vs off",
        "TTFT p50 / p95 ms",
        "TTFT p50, median of runs",
        "TPOT p50 / p95 ms",
        "accept len",
        "rounds by γ",
    ]
    return markdown_table(header, rows)


@dataclass(frozen=True)
class TraceSetting:
    mode: str
    requests: int
    tokens: int
    wall_s: float
    tokens_per_second: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p99_ms: float
    slo_met: int  # requests within both SLOs
    goodput_rps: float  # slo_met / wall_s
    mean_acceptance_length: float | None
    rounds_by_k: dict[str, float]
    policy: dict[str, float]  # the goodput policy's probes and switches during the trace


def measure_trace(server: Server, trace: Any, args: argparse.Namespace) -> TraceSetting:
    before, policy_before = server.counters()
    rows, wall = asyncio.run(replay(server.url, server.model, trace))
    after, policy_after = server.counters()
    tokens = sum(r["tokens"] for r in rows)
    drafts = sum(r["speculation"]["num_drafts"] for r in rows)
    accepted = sum(r["speculation"]["num_accepted_tokens"] for r in rows)
    met = sum(
        1
        for r in rows
        if r["ttft"] <= args.slo_ttft and (r["tokens"] < 2 or r["tpot"] <= args.slo_tpot)
    )
    return TraceSetting(
        server.mode,
        len(rows),
        tokens,
        wall,
        tokens / wall,
        1000 * percentile([r["ttft"] for r in rows], 0.5),
        1000 * percentile([r["ttft"] for r in rows], 0.99),
        1000 * percentile([r["tpot"] for r in rows if r["tokens"] > 1], 0.5),
        1000 * percentile([r["tpot"] for r in rows if r["tokens"] > 1], 0.99),
        met,
        met / wall,
        1 + accepted / drafts if drafts else None,
        {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after},
        {k: v - policy_before.get(k, 0.0) for k, v in policy_after.items()},
    )


def gamma_shares(rounds_by_k: dict[str, float]) -> str:
    total_rounds = sum(rounds_by_k.values())
    if not total_rounds:
        return ""
    return ", ".join(
        f"{k}: {v / total_rounds:.0%}"
        for k, v in sorted(rounds_by_k.items(), key=lambda kv: int(kv[0]))
        if v
    )


def trace_table(settings: list[TraceSetting]) -> str:
    off = next((s.tokens_per_second for s in settings if s.mode == "off"), None)
    rows = [
        [
            s.mode,
            str(s.requests),
            f"{s.tokens_per_second:.1f}",
            f"{s.tokens_per_second / off:.2f}x" if off else "",
            f"{s.ttft_p50_ms:.0f} / {s.ttft_p99_ms:.0f}",
            f"{s.tpot_p50_ms:.1f} / {s.tpot_p99_ms:.1f}",
            f"{s.slo_met / s.requests:.0%}",
            f"{s.goodput_rps:.3f}",
            fmt(s.mean_acceptance_length, ".2f"),
            gamma_shares(s.rounds_by_k),
            " / ".join(f"{s.policy.get(k, 0):.0f}" for k in POLICY_COUNTERS) if s.policy else "",
        ]
        for s in settings
    ]
    header = ["speculation", "requests", "tokens/s", "vs off", "TTFT p50 / p99 ms",
              "TPOT p50 / p99 ms", "within SLO", "goodput req/s", "accept len",
              "rounds by γ", "probes / switches"]  # fmt: skip
    return markdown_table(header, rows)


def run_trace(servers: list[Server], args: argparse.Namespace) -> tuple[list[Any], str]:
    trace = make_trace(
        sessions=args.sessions,
        rate=args.trace,
        multi_turn=args.multi_turn,
        repeated=args.repeated,
        lengths=args.lengths,
        think=args.think,
        seed=args.seed,
    )
    kinds = {k: sum(1 for t in trace if t.kind == k) for k in ("single", "conversation", "repeat")}
    print(f"trace: {len(trace)} sessions ({kinds}), {sum(len(t.turns) for t in trace)} requests")
    runs: dict[int, list[TraceSetting]] = {id(s): [] for s in servers}
    for _ in range(args.repeats):
        for server in servers:  # interleaved: the host's drift hits them all
            t = measure_trace(server, trace, args)
            runs[id(server)].append(t)
            print(
                f"trace {t.mode}: {t.tokens_per_second:.1f} tokens/s, TTFT p50 {t.ttft_p50_ms:.0f}"
                f" ms, TPOT p50 {t.tpot_p50_ms:.1f} ms, within SLO {t.slo_met}/{t.requests}",
                flush=True,
            )
    settings = [median_setting(runs[id(server)]) for server in servers]
    return settings, trace_table(settings)


def run_levels(servers: list[Server], args: argparse.Namespace) -> tuple[list[Any], str]:
    """Closed loop: every workload at every concurrency, the servers interleaved."""
    settings: list[Setting] = []
    for workload in args.workloads:
        prompts = workloads.prompts(workload)
        for c in args.concurrency:
            runs: dict[int, list[Setting]] = {id(s): [] for s in servers}
            for _ in range(args.repeats):
                for server in servers:  # interleaved: the host's drift hits them all
                    runs[id(server)].append(measure(server, workload, prompts, args, c))
            for server in servers:
                s = median_setting(runs[id(server)])
                s = replace(s, ttft_p50_runs_ms=tuple(r.ttft_p50_ms for r in runs[id(server)]))
                settings.append(s)
                print(
                    f"{workload} C={c} {s.mode} chunk {s.prefill_chunk} "
                    f"order {s.prefill_order}: "
                    f"{s.tokens_per_second:.1f} tokens/s, "
                    f"TTFT p50 {s.ttft_p50_ms:.0f} ms, TPOT p50 {s.tpot_p50_ms:.1f} ms",
                    flush=True,
                )
    return settings, table(settings)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", nargs="+", default=["code", "chat"])
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    ap.add_argument("--requests", type=int, default=16, help="requests per setting")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=3, help="the fixed server's γ")
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--modes", nargs="+", default=["off", "fixed", "goodput"])
    ap.add_argument(
        "--prefill-chunks",
        nargs="+",
        type=int,
        default=None,
        help="run every mode at each --prefill-chunk (default: the server's own)",
    )
    ap.add_argument(
        "--prefill-orders",
        nargs="+",
        choices=["shortest", "fifo"],
        default=None,
        help="run every mode and chunk at each --prefill-order (default: the server's own)",
    )
    ap.add_argument(
        "--before-package",
        type=Path,
        default=None,
        help="also run each non-off mode from the specdec_rs package in this folder (e.g. a "
        "worktree's python/ with the extension copied in): the code before a change, same run",
    )
    ap.add_argument("--server-args", default="", help="more flags for every server")
    ap.add_argument("--trace", type=float, default=None, help="replay traffic: sessions per s")
    ap.add_argument("--sessions", type=int, default=48, help="sessions in the trace")
    ap.add_argument("--multi-turn", type=float, default=0.25, help="share of conversations")
    ap.add_argument("--repeated", type=float, default=0.15, help="share of repeated requests")
    ap.add_argument("--lengths", type=int, nargs="+", default=[16, 64, 128, 256])
    ap.add_argument("--think", type=float, default=1.0, help="mean seconds between turns")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--slo-ttft", type=float, default=2.0, help="seconds")
    ap.add_argument("--slo-tpot", type=float, default=0.1, help="seconds")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    extra = args.server_args.split()
    chunks: list[int | None] = [None] if args.prefill_chunks is None else args.prefill_chunks
    orders: list[str | None] = [None] if args.prefill_orders is None else args.prefill_orders

    def packages(mode: str) -> list[Path | None]:
        """The installed package, and for a speculating mode the one before the change."""
        before = args.before_package
        return [None] if before is None or mode == "off" else [None, before]

    servers = [
        Server(m, args.k, args.max_batch, extra, c, o, package)
        for c in chunks
        for o in orders
        for m in args.modes
        for package in packages(m)
    ]
    try:
        if args.trace is not None:
            settings, text = run_trace(servers, args)
        else:
            settings, text = run_levels(servers, args)
    finally:
        for server in servers:
            server.stop()
    print(text)
    if args.out is not None:
        record = {
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "settings": [asdict(s) for s in settings],
        }
        write_results(args.out, record, text)


if __name__ == "__main__":
    main()
