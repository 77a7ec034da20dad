"""Building the server from a model and drafter specs, and running it.
p = target, q = draft, k = γ.

`build_served(target, tokenizer, options)` makes the engine (one
`BatchEngine`: up to `max_batch` rows, the goodput policy's γ unless `k` is
fixed), its worker thread and what the routes need. Each drafter spec
(`--drafter` and `--drafters`) is built once; every request's row gets its
own drafter from it by `drafters.copies` (the first row the object itself,
later rows its ``fresh()``): a drafter that learns across requests keeps
what it learns in the state its ``fresh()`` copies share, so every row of
the server sees it.

`run_server` serves under uvicorn on `host:port` (127.0.0.1 unless told)
until SIGTERM or Ctrl-C: then it stops accepting connections, lets the
running requests finish (at most `drain_timeout` seconds when set), stops
the engine's thread and returns. `start_in_thread` runs the same server on
a background thread (tests, benchmarks).
"""

from __future__ import annotations

import math
import signal
import socket
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specdec_rs import _checks, drafters
from specdec_rs.engine import BatchEngine
from specdec_rs.engine.build import engine_for
from specdec_rs.engine.engine import MAX_PREFILL_CHUNK, MAX_ROWS, PREFILL_CHUNK
from specdec_rs.engine.scheduler import PREFILL_ORDER, PREFILL_ORDERS
from specdec_rs.policy.base import MAX_K
from specdec_rs.serve.app import Served, build_app, prompt_char_limit
from specdec_rs.serve.worker import EngineWorker

if TYPE_CHECKING:
    from collections.abc import Callable

    import uvicorn

    from specdec_rs.generation.prefix import PrefixCache

MAX_QUEUE = 100_000
DEFAULT_BODY_MB = 8.0  # a full context of text, JSON-escaped, with room to spare
MAX_BODY_MB = 1024.0
DEFAULT_PREFIX_CACHE_MB = 256.0  # about 5,700 positions of SmolLM2's keys and values


@dataclass(frozen=True)
class ServerOptions:
    """host/port to listen on; drafter: the spec a request gets unless it
    names another of `drafters` (or "none"); max_batch rows decode
    together, max_queue more wait (the next is a 429); k: a fixed γ for
    requests that set none (None: the load-aware goodput policy);
    model_name: the name /v1/models gives and requests may send;
    drain_timeout: seconds SIGTERM waits for running requests (None: until
    they finish); api_key: the bearer token the /v1/ routes want (None: none;
    an empty key is refused, never taken as none); max_body_mb: the largest
    request body (a larger one is a 413); prefill_chunk: the most prompt
    tokens a batch round prefills beside the running rows (0: a joining
    request prefills alone, stalling the batch); prefill_order: which
    prompts prefill first ("shortest", aged by their wait, or "fifo";
    `BatchEngine`); prefix_cache_mb: the
    prefix cache's size (0: none; a GGUF target's only)."""

    host: str = "127.0.0.1"
    port: int = 8000
    drafter: str = "prompt-lookup"
    drafters: tuple[str, ...] = ()
    max_batch: int = 8
    max_queue: int = 64
    k: int | None = None
    model_name: str = "SmolLM2-135M-Instruct"
    drain_timeout: float | None = None
    log_level: str = "info"
    api_key: str | None = None
    max_body_mb: float = DEFAULT_BODY_MB
    prefill_chunk: int = PREFILL_CHUNK
    prefill_order: str = PREFILL_ORDER
    prefix_cache_mb: float = DEFAULT_PREFIX_CACHE_MB

    def check(self) -> ServerOptions:
        """Every option, before a model loads (ValueError naming the flag)."""
        if not isinstance(self.host, str) or not self.host:
            raise ValueError(f"--host {self.host!r} must be an address, e.g. 127.0.0.1")
        _checks.integer(self.port, "--port", minimum=0, maximum=65535)
        for spec in (self.drafter, *self.drafters):
            drafters.parse_spec(spec)
        _checks.integer(self.max_batch, "--max-batch", minimum=1, maximum=MAX_ROWS)
        _checks.integer(self.max_queue, "--max-queue", minimum=0, maximum=MAX_QUEUE)
        if self.k is not None:
            _checks.integer(self.k, "--k", minimum=0, maximum=MAX_K)
        if not isinstance(self.model_name, str) or not self.model_name:
            raise ValueError("--served-model-name must be a non-empty name")
        if self.drain_timeout is not None:
            _checks.real(self.drain_timeout, "--drain-timeout", above=0.0)
        _checks.choice(self.log_level, "--log-level", ("debug", "info", "warning", "error"))
        if self.api_key is not None and (
            not isinstance(self.api_key, str) or not self.api_key.strip()
        ):
            raise ValueError(
                "--api-key (or $SPECDEC_API_KEY) is empty; give a key, or unset it to serve "
                "without authentication"
            )
        _checks.real(self.max_body_mb, "--max-body-mb", above=0.0, maximum=MAX_BODY_MB)
        _checks.integer(self.prefill_chunk, "--prefill-chunk", minimum=0, maximum=MAX_PREFILL_CHUNK)
        _checks.choice(self.prefill_order, "--prefill-order", PREFILL_ORDERS)
        _checks.real(self.prefix_cache_mb, "--prefix-cache-mb", minimum=0.0, maximum=1 << 20)
        return self

    @property
    def max_body(self) -> int:
        """The body limit in bytes."""
        return int(self.max_body_mb * (1 << 20))


def prepare_grammars(engine: BatchEngine, tokenizer: Any) -> None:
    """Prepare the tokenizer for grammars now (a second or more), not at
    the first constrained request; nothing without the `structured` extra."""
    try:
        import llguidance  # noqa: F401
    except ImportError:
        return
    from specdec_rs.generation.inputs import eos_set
    from specdec_rs.structured.constraint import prepared

    eos = eos_set(None, engine.target)
    if eos:
        prepared(tokenizer, engine.vocab, eos)


def prefix_cache(target: Any, megabytes: float) -> PrefixCache | None:
    """The server's prefix cache: `megabytes` of a GGUF target's prefixes
    (None at 0, or for a target whose reused entries could differ in bits)."""
    from specdec_rs.generation.prefix import PrefixCache, check_target

    if megabytes <= 0:
        return None
    try:
        check_target(target)
    except ValueError:
        return None
    return PrefixCache(megabytes)


def build_served(target: Any, tokenizer: Any, options: ServerOptions) -> Served:
    """The engine, its worker (not started yet) and the routes' state."""
    options.check()
    made = engine_for(
        target,
        tokenizer,
        options.drafter,
        drafters=options.drafters,
        k=options.k,
        max_batch=options.max_batch,
        prefill_chunk=options.prefill_chunk,
        prefill_order=options.prefill_order,
        prefix_cache=prefix_cache(target, options.prefix_cache_mb),
    )
    engine, built = made.engine, made.drafters
    prepare_grammars(engine, tokenizer)
    context = getattr(target.config, "max_position_embeddings", None)
    context = int(context) if context else None
    return Served(
        worker=EngineWorker(engine),
        tokenizer=tokenizer,
        model_name=options.model_name,
        context=context,
        default_drafter=options.drafter,
        drafters=list(engine.drafters),
        max_batch=options.max_batch,
        max_queue=options.max_queue,
        api_key=options.api_key,
        built=built,
        max_body=options.max_body,
        max_prompt_chars=prompt_char_limit(tokenizer, context),
    )


@dataclass(frozen=True)
class ServeSummary:
    """What a finished `run_server` did: where it listened, the requests
    it answered, the batch rounds it ran."""

    url: str
    requests: int
    rounds: int
    cut: int = 0  # requests that ended unfinished (the client left, or the drain timed out)


def listening_socket(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: any free one): a client may
    connect as soon as it is printed, before uvicorn has started."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as e:
        raise ValueError(f"--host {host!r} is not an address this machine knows: {e}") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)  # connections wait in the backlog until uvicorn accepts them
    except OSError as e:
        sock.close()
        raise ValueError(
            f"cannot listen on {host}:{port}: {e.strerror}; pick another --port"
        ) from None
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _uvicorn_server(served: Served, options: ServerOptions) -> uvicorn.Server:
    import uvicorn

    class Draining(uvicorn.Server):
        """uvicorn's server; a SIGTERM or Ctrl-C first marks the app as
        draining (new requests get a 503 while the running ones finish)."""

        def handle_exit(self, sig: int, frame: Any) -> None:
            # uvicorn's own records the signal to raise it again after the
            # drain (the process would end by it); here `run_server` returns
            served.draining = True
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True  # a second Ctrl-C: stop without waiting
            else:
                self.should_exit = True

    config = uvicorn.Config(
        build_app(served),
        log_level=options.log_level,
        access_log=options.log_level == "debug",
        timeout_graceful_shutdown=(
            None if options.drain_timeout is None else math.ceil(options.drain_timeout)
        ),
        lifespan="on",
    )
    return Draining(config)


def run_server(
    served: Served,
    options: ServerOptions,
    *,
    ready: Callable[[str], None] | None = None,
    sock: socket.socket | None = None,
) -> ServeSummary:
    """Serve until SIGTERM or Ctrl-C (see the module docs) on `sock` (None:
    a socket bound now to the options' host and port); `ready(url)` is
    called once the socket is bound."""
    if sock is None:
        sock = listening_socket(options.host, options.port)
    url = url_of(sock)
    if ready is not None:
        ready(url)
    server = _uvicorn_server(served, options)
    server.run(sockets=[sock])
    m = served.metrics
    return ServeSummary(url, m.n_answered, served.worker.rounds, m.n_finished - m.n_answered)


class Background:
    """A server on a background thread: `url`, and `stop()` (drains first)."""

    def __init__(self, served: Served, options: ServerOptions):
        self.served = served
        sock = listening_socket(options.host, options.port)
        self.url = url_of(sock)
        self.server = _uvicorn_server(served, options)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, name="specdec-serve", daemon=True
        )
        self.thread.start()
        while not self.server.started and self.thread.is_alive():
            time.sleep(0.01)
        if not self.server.started:
            raise RuntimeError("the server did not start (see its log)")

    def stop(self) -> None:
        self.served.draining = True
        self.server.should_exit = True
        self.thread.join()


def start_in_thread(served: Served, options: ServerOptions | None = None) -> Background:
    """Serve `served` on a background thread (default: 127.0.0.1, a free port)."""
    return Background(served, options or ServerOptions(port=0, log_level="warning"))
