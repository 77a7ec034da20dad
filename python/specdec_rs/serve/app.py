"""The OpenAI-compatible HTTP face of a `BatchEngine` (Starlette).
p = target, q = draft, k = γ.

Routes: POST /v1/completions and /v1/chat/completions (SSE streaming or
one JSON body), GET /v1/models, /health, /metrics. Every refusal is an
OpenAI error body ({"error": {"message", "type", "param", "code"}}): 400
for a malformed or invalid request (a prompt past the context has code
"context_length_exceeded"), 401 without the API key when one is set, 404
for another model's name or an unknown route, 413 for a body over
`max_body` bytes, 429 when the queue is full, 503 while draining. A client
that disconnects (mid-body, mid-stream or while waiting) frees its row
before the next round. The response's `usage` carries the request's
speculation figures (`usage.speculation`).

No request stalls the others: the body is read with its size bounded, and
parsing and tokenizing run on a worker thread (one: a tokenizer is not
safe to share between threads), after a prompt longer than the context
could hold in characters (`prompt_char_limit`) is refused uncounted;
stop strings are bounded (`text.MAX_STOPS`, `text.MAX_STOP_CHARS`) and
scanned in time linear in the text, and a handler yields to the event loop
after each round's text.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from specdec_rs.engine import Request
from specdec_rs.limits import MAX_NEW_TOKENS
from specdec_rs.rounds import Tally
from specdec_rs.serve.metrics import ServerMetrics
from specdec_rs.serve.protocol import (
    ChatRequest,
    CompletionRequest,
    Sampling,
    error_body,
    validation_message,
)
from specdec_rs.serve.text import TextAssembler
from specdec_rs.serve.worker import Done, EngineWorker, Failed, Tokens, log

if TYPE_CHECKING:
    from specdec_rs.policy.goodput import GoodputReport
    from specdec_rs.structured import Grammar


@dataclass
class Served:
    """What the app serves: the engine's worker, the tokenizer, the model's
    name and context, the drafters a request may name (`default_drafter`
    when it names none), and the queue bound: at most max_batch running
    plus max_queue waiting requests, the next one is a 429. api_key: when
    set, /v1/ routes want ``Authorization: Bearer <api_key>`` (else 401).
    built: the drafter object of each spec, whose `fresh()` copies the rows
    get (a suffix drafter's global index is `built["suffix"].shared`).
    max_body: the largest request body in bytes (a larger one is a 413);
    max_prompt_chars: the longest prompt text the context could hold
    (`prompt_char_limit`; None: no bound before tokenizing)."""

    worker: EngineWorker
    tokenizer: Any
    model_name: str
    context: int | None
    default_drafter: str
    drafters: list[str]
    max_batch: int
    max_queue: int
    api_key: str | None = None
    built: dict[str, Any] = field(default_factory=dict)
    max_body: int = 8 << 20
    max_prompt_chars: int | None = None
    metrics: ServerMetrics = field(init=False)
    tokenizing: concurrent.futures.ThreadPoolExecutor = field(init=False)
    draining: bool = False
    outstanding: int = 0
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        self.metrics = ServerMetrics(
            self.model_name,
            lambda: self.worker.running,
            lambda: self.worker.waiting,
            self.policy_report,
        )
        self.tokenizing = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="specdec-tokenize"
        )

    def policy_report(self) -> GoodputReport | None:
        """What the engine's goodput policy did (None without one)."""
        policy = self.worker.engine.goodput
        return None if policy is None else policy.report()

    async def off_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args) on the tokenizing thread, the event loop free meanwhile."""
        return await asyncio.get_running_loop().run_in_executor(self.tokenizing, fn, *args)


def prompt_char_limit(tokenizer: Any, context: int | None) -> int | None:
    """The most characters a prompt the context can hold may have:
    context × the longest token's text (a vocabulary entry's length bounds
    its decoded characters for byte-level and SentencePiece vocabularies),
    × 4 where the tokenizer normalizes its input first (a normalizer may
    shorten the text, e.g. by dropping accents). None without a context or
    a vocabulary to read."""
    if context is None:
        return None
    try:
        longest = max((len(t) for t in tokenizer.get_vocab()), default=0)
    except Exception:  # noqa: BLE001 - a tokenizer without a readable vocabulary: no bound
        return None
    if longest < 1:
        return None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    slack = 1 if backend is not None and backend.normalizer is None else 4
    return int(context) * longest * slack


class Refusal(Exception):
    """A request refused before it reached the engine."""

    def __init__(
        self,
        status: int,
        message: str,
        reason: str,
        *,
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.reason = status, message, reason
        self.param, self.code = param, code

    def response(self) -> JSONResponse:
        kind = {
            400: "invalid_request_error",
            401: "authentication_error",
            404: "not_found_error",
            413: "invalid_request_error",
            429: "rate_limit_error",
        }
        body = error_body(
            self.message,
            kind=kind.get(self.status, "server_error"),
            param=self.param,
            code=self.code,
        )
        headers = {"Retry-After": "1"} if self.status in (429, 503) else None
        return JSONResponse(body, status_code=self.status, headers=headers)


@dataclass
class Figures:
    """A request's speculation so far: the `Tally` of its rounds (rounds,
    the rounds that drafted, drafts proposed / reached / kept, per position,
    rounds by γ asked)."""

    drafter: str
    tally: Tally = field(default_factory=Tally)

    def add(self, t: Tokens) -> None:
        self.tally += Tally.of(t.round)

    def summary(self) -> dict[str, Any]:
        t = self.tally
        return {
            "drafter": self.drafter,
            "rounds": t.rounds,
            "num_drafts": t.drafting,
            "num_draft_tokens": t.drafted,
            "num_accepted_tokens": t.kept,
            "accepted_per_position": t.kept_positions,
            "acceptance_rate": t.acceptance_rate,
            "alpha": t.alpha,
            "mean_acceptance_length": t.mean_acceptance_length,
            "rounds_by_k": {str(k): n for k, n in enumerate(t.by_k) if n},
        }


class Answer:
    """One admitted request: its events become text (`pieces`), and its
    end is recorded once (`close`: a request that did not finish is
    cancelled in the engine and counted as an abort)."""

    def __init__(
        self,
        served: Served,
        rid: int,
        events: asyncio.Queue[Any],
        text: TextAssembler,
        prompt_tokens: int,
        drafter: str,
        started: float,
    ):
        self.served, self.rid, self.events, self.text = served, rid, events, text
        self.prompt_tokens, self.started = prompt_tokens, started
        self.figures = Figures(drafter)
        self.cached_tokens = 0  # prompt tokens the prefix cache gave (known at the end)
        self.finish_reason: str | None = None
        self.first_token: float | None = None
        self.closed = False

    async def pieces(self) -> AsyncIterator[str]:
        """The text as it is decoded; raises RuntimeError when the engine
        failed the request."""
        while self.finish_reason is None:
            event = await self.events.get()
            if isinstance(event, Tokens):
                self.figures.add(event)
                r = event.round
                self.served.metrics.round(r.asked, r.drafted, r.accepted)
                if event.ids and self.first_token is None:
                    self.first_token = time.perf_counter()
                delta = self.text.feed(event.ids)
                if self.text.stopped:
                    self.finish_reason = "stop"
                    self.served.worker.cancel(self.rid)
                if delta:
                    yield delta
                await asyncio.sleep(0)  # queued rounds of one request never hold the loop
            elif isinstance(event, Done):
                self.cached_tokens = event.result.cached_tokens
                if self.served.worker.engine.prefix is not None:
                    self.served.metrics.prefix(self.prompt_tokens, self.cached_tokens)
                rest = self.text.finish()
                eos = event.result.stop_reason == "eos"
                self.finish_reason = "stop" if eos or self.text.stopped else "length"
                if rest:
                    yield rest
            elif isinstance(event, Failed):
                self.finish_reason = "error"
                if event.status == 400:  # the request's own (a grammar this model cannot follow)
                    raise Refusal(400, event.error, "bad_request")
                raise RuntimeError(event.error)

    @property
    def completion_tokens(self) -> int:
        return self.text.tokens

    def usage(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "speculation": self.figures.summary(),
        }

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.served.outstanding -= 1
        if self.finish_reason is None:
            self.served.worker.cancel(self.rid)
        reason = self.finish_reason or "abort"
        ttft = None if self.first_token is None else self.first_token - self.started
        self.served.metrics.finished(
            reason,
            self.prompt_tokens,
            self.completion_tokens,
            ttft,
            time.perf_counter() - self.started,
        )


# ---- the request bodies into engine requests
def prompt_ids(served: Served, body: Sampling) -> list[int]:
    """The prompt's token ids: a completion's text (or ids) as given, a
    chat's messages through the model's chat template."""
    from specdec_rs.prompts import workloads

    tokenizer = served.tokenizer
    if isinstance(body, ChatRequest):
        turns = [m.turn() for m in body.messages]
        _within_chars(served, sum(len(t["content"]) for t in turns), "messages")
        try:
            return [int(t) for t in workloads.encode(tokenizer, turns)]
        except ValueError as e:
            raise Refusal(400, str(e), "bad_request", param="messages") from None
        except Exception as e:  # noqa: BLE001 - a template that refuses these turns
            raise Refusal(
                400, f"the chat template refused the messages: {e}", "bad_request", param="messages"
            ) from None
    prompt = _completion(body).prompt
    if isinstance(prompt, str):
        _within_chars(served, len(prompt), "prompt")
        return [int(t) for t in tokenizer(prompt)["input_ids"]]
    return list(prompt or [])


def _within_chars(served: Served, chars: int, param: str) -> None:
    """Refuse, before tokenizing, text longer than any prompt the context holds."""
    limit = served.max_prompt_chars
    if limit is not None and chars > limit:
        raise Refusal(
            400,
            f"the {param} holds {chars:,} characters, more than this model's context of "
            f"{served.context} tokens can hold (at most {limit:,} characters); shorten it",
            "bad_request",
            param=param,
            code="context_length_exceeded",
        )


def _completion(body: Sampling) -> CompletionRequest:
    assert isinstance(body, CompletionRequest)
    return body


def grammar_of(body: Sampling) -> Grammar | None:
    """The body's grammar (response_format or structured_outputs), a 400
    naming the field and the problem when it cannot be compiled."""
    try:
        return body.grammar()
    except ImportError:
        raise Refusal(
            400,
            "this server has no grammar library for structured output; install it "
            "with pip install 'specdec_rs[structured]' and restart",
            "bad_request",
            param="response_format",
        ) from None
    except ValueError as e:
        field = "structured_outputs" if body.structured_outputs is not None else "response_format"
        raise Refusal(400, f"{field}: {e}", "bad_request", param=field) from None


def engine_request(
    served: Served, body: Sampling, ids: list[int], grammar: Grammar | None = None
) -> tuple[Request, str]:
    """(the engine's `Request`, the drafter's name) for a checked body."""
    if not ids:
        raise Refusal(400, "the prompt is empty; send some text", "bad_request", param="prompt")
    budget = body.budget if isinstance(body, ChatRequest) else _completion(body).max_tokens
    context = served.context
    if budget is None:  # a chat without a budget: the rest of the context
        budget = MAX_NEW_TOKENS if context is None else min(MAX_NEW_TOKENS, context - len(ids))
    if context is not None and (len(ids) + budget > context or budget < 1):
        raise Refusal(
            400,
            f"this model's context is {context} tokens; the prompt holds {len(ids)} and "
            f"max_tokens asks for {budget} more ({len(ids) + budget}); shorten the prompt "
            "or lower max_tokens",
            "bad_request",
            param=(
                "max_tokens"
                if len(ids) < context
                else "messages"
                if isinstance(body, ChatRequest)
                else "prompt"
            ),
            code="context_length_exceeded",
        )
    spec = body.speculation
    drafter = served.default_drafter if spec is None or spec.drafter is None else spec.drafter
    if drafter not in served.drafters:
        raise Refusal(
            400,
            f"speculation.drafter {drafter!r} is not served here; this server has: "
            f"{', '.join(served.drafters)} (start it with --drafters to add one)",
            "bad_request",
            param="speculation.drafter",
        )
    k = None if spec is None else spec.k
    request = Request(
        ids,
        budget,
        body.temperature,
        body.top_k_or_none,
        body.top_p_or_none,
        body.min_p,
        seed=body.seed,
        eos_token_id=[] if body.ignore_eos else None,
        k=k,
        drafter=drafter,
        grammar=grammar,
    )
    return request, drafter if k != 0 else "none"


# ---- the responses
def envelope(served: Served, obj: str, rid: str, choice: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI response object (or stream chunk) around its one choice."""
    return {
        "id": rid,
        "object": obj,
        "created": int(time.time()),
        "model": served.model_name,
        "choices": [{"index": 0, "logprobs": None, **choice}],
    }


def completion_json(
    served: Served, kind: str, rid: str, text: str, finish: str | None
) -> dict[str, Any]:
    if kind == "text":
        return envelope(served, "text_completion", rid, {"text": text, "finish_reason": finish})
    message = {"role": "assistant", "content": text}
    return envelope(served, "chat.completion", rid, {"message": message, "finish_reason": finish})


def chunk_json(
    served: Served,
    kind: str,
    rid: str,
    delta: str | None,
    finish: str | None,
    *,
    role: bool = False,
) -> dict[str, Any]:
    if kind == "text":
        choice = {"text": delta or "", "finish_reason": finish}
        return envelope(served, "text_completion", rid, choice)
    d: dict[str, Any] = {"role": "assistant"} if role else {}
    if delta is not None:
        d["content"] = delta
    return envelope(served, "chat.completion.chunk", rid, {"delta": d, "finish_reason": finish})


def sse(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


async def stream_body(
    served: Served, answer: Answer, kind: str, rid: str, include_usage: bool
) -> AsyncIterator[bytes]:
    """The SSE events of a streamed answer, ending with data: [DONE]."""
    usage: dict[str, Any] = {"usage": None} if include_usage else {}
    if kind == "chat":
        yield sse({**chunk_json(served, kind, rid, "", None, role=True), **usage})
    try:
        async for piece in answer.pieces():
            yield sse({**chunk_json(served, kind, rid, piece, None), **usage})
    except RuntimeError as e:
        yield sse(error_body(str(e), kind="server_error"))
        yield b"data: [DONE]\n\n"
        return
    except Refusal as e:
        yield sse(error_body(e.message, kind="invalid_request_error", param=e.param))
        yield b"data: [DONE]\n\n"
        return
    yield sse({**chunk_json(served, kind, rid, None, answer.finish_reason), **usage})
    if include_usage:
        last = chunk_json(served, kind, rid, None, None)
        yield sse({**last, "choices": [], "usage": answer.usage()})
    yield b"data: [DONE]\n\n"


class EventStream:
    """An SSE response that watches for the client leaving: then the body
    stops and the answer is closed (its row freed) at once."""

    def __init__(self, answer: Answer, body: AsyncIterator[bytes]):
        self.answer, self.body = answer, body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
        ]

        async def pump() -> None:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            async for chunk in self.body:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        pumping = asyncio.ensure_future(pump())
        try:
            await first_of(pumping, until_disconnect(receive))
        except asyncio.CancelledError:
            if not self.answer.served.draining:
                raise
            cut_by_drain(self.answer)  # the stream ends here, saying so; the answer is an abort
            ending = sse(
                error_body(
                    "the server shut down before this request finished",
                    kind="server_error",
                    code="shutdown",
                )
            )
            try:
                await send({"type": "http.response.body", "body": ending, "more_body": True})
                await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
            except (OSError, RuntimeError):  # the client or the transport is gone already
                pass
            return
        finally:
            self.answer.close()
        if pumping.done() and not pumping.cancelled() and pumping.exception() is not None:
            exc = pumping.exception()
            if not isinstance(exc, OSError):  # OSError: the client left while we wrote
                raise exc  # type: ignore[misc]


def cut_by_drain(answer: Answer) -> None:
    """One log line for a request the drain timeout cut (not a traceback)."""
    log.warning(
        "request %d cut unfinished by the drain timeout after %d tokens",
        answer.rid,
        answer.completion_tokens,
    )


async def until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def first_of(task: asyncio.Future[Any], other: Awaitable[Any]) -> None:
    """Wait for `task` or `other`, whichever ends first; cancel the other."""
    watcher = asyncio.ensure_future(other)
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, watcher):
            if not t.done():
                t.cancel()
        await asyncio.gather(task, watcher, return_exceptions=True)


async def whole_answer(
    http: HttpRequest, served: Served, answer: Answer, kind: str, rid: str
) -> Response:
    """A non-streamed answer; a client that leaves first cancels it."""
    parts: list[str] = []

    async def collect() -> None:
        async for piece in answer.pieces():
            parts.append(piece)

    collecting = asyncio.ensure_future(collect())
    try:
        await first_of(collecting, until_disconnect(http.receive))
    except asyncio.CancelledError:
        if not served.draining:
            raise
        cut_by_drain(answer)
        return Response(status_code=503)
    finally:
        answer.close()
    if not collecting.done() or collecting.cancelled():
        return Response(status_code=499)  # the client left; nobody reads this
    error = collecting.exception()
    if isinstance(error, Refusal):
        return error.response()
    if error is not None:
        return JSONResponse(error_body(str(error), kind="server_error"), status_code=500)
    body = completion_json(served, kind, rid, "".join(parts), answer.finish_reason)
    return JSONResponse({**body, "usage": answer.usage()})


async def handle(http: HttpRequest, schema: type[Sampling], kind: str) -> Response:
    served: Served = http.app.state.served
    started = time.perf_counter()
    counted = False  # this request holds a place in `outstanding`
    try:
        authorize(http, served)
        body = await served.off_loop(parse, await read_body(http, served.max_body), schema)
        if body.model is not None and body.model != served.model_name:
            raise Refusal(
                404,
                f"the model {body.model!r} is not served here; this server has "
                f"{served.model_name!r} (GET /v1/models)",
                "not_found",
                param="model",
                code="model_not_found",
            )
        if served.draining:
            raise Refusal(503, "the server is shutting down; retry elsewhere", "draining")
        if served.outstanding >= served.max_batch + served.max_queue:
            raise Refusal(
                429,
                f"the queue is full ({served.max_batch} running, {served.max_queue} waiting); "
                "retry shortly",
                "queue_full",
            )
        served.outstanding += 1  # before any await: concurrent requests see it
        counted = True
        ids = await served.off_loop(prompt_ids, served, body)
        grammar = await served.off_loop(grammar_of, body)
        request, drafter = engine_request(served, body, ids, grammar)
        try:
            rid, events = await served.worker.submit(request)
        except ValueError as e:
            raise Refusal(400, str(e), "bad_request") from None
        answer = Answer(
            served,
            rid,
            events,
            TextAssembler(served.tokenizer, body.stops),
            len(ids),
            drafter,
            started,
        )
        counted = False  # the answer's close() gives the place back
    except Refusal as r:
        served.metrics.reject(r.reason)
        return r.response()
    except ClientDisconnect:  # the client left before its body arrived: nobody reads this
        return Response(status_code=499)
    finally:
        if counted:
            served.outstanding -= 1
    name = ("cmpl-" if kind == "text" else "chatcmpl-") + uuid.uuid4().hex
    if body.stream:
        return EventStream(answer, stream_body(served, answer, kind, name, body.include_usage))  # type: ignore[return-value]
    return await whole_answer(http, served, answer, kind, name)


async def read_body(http: HttpRequest, limit: int) -> bytes:
    """The request's body, refused with a 413 once it passes `limit` bytes
    (by its Content-Length before any byte is read, else as it streams in)."""

    def too_large(size: str) -> Refusal:
        return Refusal(
            413,
            f"the request body is {size}; this server takes at most {limit:,} bytes "
            "(--max-body-mb)",
            "too_large",
            code="request_too_large",
        )

    declared = http.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(f"{int(declared):,} bytes")
    chunks, size = [], 0
    async for chunk in http.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(f"over {limit:,} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def authorize(http: HttpRequest, served: Served) -> None:
    """With an API key set, the request must carry it as a bearer token
    (the scheme's name in any case, RFC 7235)."""
    import hmac

    if served.api_key is None:
        return
    scheme, _, token = http.headers.get("authorization", "").strip().partition(" ")
    ok = scheme.lower() == "bearer" and hmac.compare_digest(
        token.strip().encode(), served.api_key.encode()
    )
    if not ok:
        raise Refusal(401, "a valid API key is needed (Authorization: Bearer ...)", "unauthorized")


def parse(raw: bytes, schema: type[Sampling]) -> Any:
    """The body as `schema` (strict JSON: no NaN, and nesting too deep for
    the parser is refused too)."""
    from specdec_rs import _files

    try:
        data = _files.parse_json(raw, where=None, what="request body", fix="send a JSON object")
    except ValueError as e:
        raise Refusal(400, str(e), "bad_request") from None
    if not isinstance(data, dict):
        raise Refusal(
            400, f"the body is a JSON {type(data).__name__}; send a JSON object", "bad_request"
        )
    try:
        return schema.model_validate(data)
    except ValidationError as e:
        message, param = validation_message(e)
        raise Refusal(400, message, "bad_request", param=param) from None
    except RecursionError:
        raise Refusal(400, "the body is nested too deeply", "bad_request") from None


async def completions(http: HttpRequest) -> Response:
    return await handle(http, CompletionRequest, "text")


async def chat_completions(http: HttpRequest) -> Response:
    return await handle(http, ChatRequest, "chat")


async def models(http: HttpRequest) -> Response:
    served: Served = http.app.state.served
    try:
        authorize(http, served)
    except Refusal as r:
        served.metrics.reject(r.reason)
        return r.response()
    card = {
        "id": served.model_name,
        "object": "model",
        "created": served.created,
        "owned_by": "specdec_rs",
        "max_model_len": served.context,
        "drafters": served.drafters,
    }
    return JSONResponse({"object": "list", "data": [card]})


async def health(http: HttpRequest) -> Response:
    served: Served = http.app.state.served
    ok = served.worker.alive and not served.draining
    body = {
        "status": "ok" if ok else "draining" if served.draining else "stopped",
        "running": served.worker.running,
        "waiting": served.worker.waiting,
        "outstanding": served.outstanding,
    }
    return JSONResponse(body, status_code=200 if ok else 503)


async def metrics(http: HttpRequest) -> Response:
    served: Served = http.app.state.served
    return Response(served.metrics.text(), media_type="text/plain; version=0.0.4; charset=utf-8")


async def http_error(http: HttpRequest, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    message = f"{http.method} {http.url.path}: {exc.detail}"
    return JSONResponse(error_body(message, kind=kind), status_code=exc.status_code)


async def internal_error(http: HttpRequest, exc: Exception) -> Response:
    """A bug, not the request's fault: a 500 with an error body (logged)."""
    log.error("%s %s failed", http.method, http.url.path, exc_info=exc)
    message = f"internal error: {type(exc).__name__}: {exc}"
    return JSONResponse(error_body(message, kind="server_error"), status_code=500)


def build_app(served: Served) -> Starlette:
    """The app over `served`; its lifespan starts the engine's thread and,
    at shutdown (after the server drained its connections), stops it."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if not served.worker.alive:
            served.worker.start()
        yield
        served.draining = True
        await asyncio.to_thread(served.worker.stop)
        served.tokenizing.shutdown(wait=False)

    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    handlers: dict[Any, Callable[..., Any]] = {
        HTTPException: http_error,
        Exception: internal_error,
    }
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers)
    app.state.served = served
    return app
