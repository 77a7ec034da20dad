"""specdec serve: the OpenAI-compatible server (`specdec_rs.serve`).

specdec serve [--model PATH] [--drafter prompt-lookup] [--drafters SPEC,SPEC]
              [--host 127.0.0.1] [--port 8000] [--max-batch 8] [--max-queue 64]
              [--k K] [--served-model-name NAME] [--drain-timeout S] [--api-key KEY]
              [--max-body-mb 8] [--prefill-chunk 64] [--prefill-order shortest]
              [--prefix-cache-mb 256]
              [--log-level info]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from specdec_rs import drafters
from specdec_rs.cli.flags import check_model_flags, load_target

if TYPE_CHECKING:  # the server's packages load only when it runs (the `serve` extra)
    from specdec_rs.serve import ServerOptions
    from specdec_rs.serve.server import ServeSummary


def add_parsers(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    s = sub.add_parser(
        "serve",
        parents=parents,
        help="an OpenAI-compatible server (continuous batching, exact speculation, /metrics)",
    )
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback)")
    s.add_argument("--port", type=int, default=8000, help="0: any free port (printed)")
    s.add_argument("--drafter", default="prompt-lookup", help=drafters.spec_help())
    s.add_argument(
        "--drafters",
        default="",
        metavar="SPEC,SPEC",
        help='more drafters a request may pick by name ("speculation": {"drafter": SPEC}); '
        '"none" is always there',
    )
    s.add_argument("--max-batch", type=int, default=8, help="rows decoded together")
    s.add_argument(
        "--max-queue", type=int, default=64, help="requests that may wait; the next gets a 429"
    )
    s.add_argument(
        "--k",
        type=int,
        default=None,
        help="a fixed γ for requests that set none (default: the load-aware goodput policy)",
    )
    s.add_argument("--served-model-name", default=None, help="the model's name in the API")
    s.add_argument(
        "--drain-timeout",
        type=float,
        default=None,
        metavar="S",
        help="on SIGTERM wait at most S seconds for running requests (default: until done)",
    )
    s.add_argument(
        "--api-key",
        default=None,
        help="require Authorization: Bearer KEY on /v1/ (default: $SPECDEC_API_KEY, else none)",
    )
    s.add_argument(
        "--max-body-mb",
        type=float,
        default=8.0,
        metavar="MB",
        help="the largest request body; a larger one gets a 413 (default: 8)",
    )
    s.add_argument(
        "--prefill-chunk",
        type=int,
        default=None,
        metavar="N",
        help="the most prompt tokens a batch round prefills beside the running rows, on a GGUF "
        "target (0: a joining request prefills alone, stalling the batch; default: 64)",
    )
    s.add_argument(
        "--prefill-order",
        default=None,
        choices=["shortest", "fifo"],
        help="which joining prompts prefill first: the shortest, aged by how long each has "
        "waited (default), or the oldest request",
    )
    s.add_argument(
        "--prefix-cache-mb",
        type=float,
        default=None,
        metavar="MB",
        help="keys and values of earlier requests' token prefixes kept for later ones that "
        "start alike, on a GGUF target (0: none; default: 256)",
    )
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    s.set_defaults(run=run_serve, show=show_serve)


def options(args: argparse.Namespace) -> ServerOptions:
    from specdec_rs.serve import ServerOptions

    extra = tuple(drafters.split_specs(args.drafters))
    name = args.served_model_name
    if name is None:
        name = (
            Path(args.model).name.removesuffix(".gguf") if args.model else "SmolLM2-135M-Instruct"
        )
    # an empty key (flag or variable) is refused by check(), never taken as "no key"
    api_key = args.api_key if args.api_key is not None else os.environ.get("SPECDEC_API_KEY")
    return ServerOptions(
        host=args.host,
        port=args.port,
        drafter=args.drafter,
        drafters=extra,
        max_batch=args.max_batch,
        max_queue=args.max_queue,
        k=args.k,
        model_name=name,
        drain_timeout=args.drain_timeout,
        log_level=args.log_level,
        api_key=api_key,
        max_body_mb=args.max_body_mb,
        **({} if args.prefill_chunk is None else {"prefill_chunk": args.prefill_chunk}),
        **({} if args.prefill_order is None else {"prefill_order": args.prefill_order}),
        **({} if args.prefix_cache_mb is None else {"prefix_cache_mb": args.prefix_cache_mb}),
    ).check()


def run_serve(args: argparse.Namespace, console: Console) -> ServeSummary:
    try:
        from specdec_rs.serve import build_served, run_server
    except ImportError as e:
        raise ValueError(
            f"specdec serve needs the server's packages ({e.name} is missing); "
            "pip install 'specdec_rs[serve]'"
        ) from None
    from specdec_rs.serve.server import listening_socket

    check_model_flags(args)
    opts = options(args)  # every flag, the drafters' options and files: before the model loads
    sock = listening_socket(opts.host, opts.port)  # a port in use: before the model loads
    try:
        target, tokenizer = load_target(args)
        served = build_served(target, tokenizer, opts)
    except BaseException:
        sock.close()
        raise

    def ready(url: str) -> None:
        names = ", ".join(served.drafters)
        auth = "API key required" if opts.api_key is not None else "no authentication"
        console.out(
            f"specdec serve: {opts.model_name} on {url}/v1 (drafters: {names}; default "
            f"{opts.drafter}; up to {opts.max_batch} rows, {opts.max_queue} waiting; {auth})",
            highlight=False,
        )
        console.file.flush()

    return run_server(served, opts, ready=ready, sock=sock)


def show_serve(s: ServeSummary, console: Console) -> None:
    cut = f"; {s.cut} cut unfinished" if s.cut else ""
    console.out(
        f"specdec serve: stopped; {s.requests} requests answered in {s.rounds} batch rounds{cut}",
        highlight=False,
    )
