"""The batch engine on its own thread, fed by the server's request handlers.
p = target, q = draft, k = γ.

`EngineWorker` owns a `BatchEngine`; only its thread touches it. Handlers
send commands (`Submit`, `Cancel`, `Stop`) through a thread-safe queue; between two
batch rounds the thread takes every waiting command, so a request joins the
batch at the next round (continuous batching) and a cancelled one leaves
it at once. Each row's round comes back to its handler's asyncio queue as a
`Tokens` event (the ids it kept and its `Round`), and its end as
`Done` (the `GenerationResult`) or `Failed` (the error). A failure of the
whole round (a bug, not a request's fault) fails the rows in it and the
worker goes on with the next requests.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specdec_rs.engine import BatchEngine, Request
    from specdec_rs.generation import GenerationResult
    from specdec_rs.rounds import Round

log = logging.getLogger("specdec_rs.serve")


@dataclass(frozen=True)
class Tokens:
    """One round of a row: the ids it kept (after the budget and EOS cut)
    and the `Round` (its γ asked, drafts proposed and kept; without the
    verifier's probability rows, which stay on the engine's thread)."""

    ids: list[int]
    round: Round


@dataclass(frozen=True)
class Done:
    result: GenerationResult


@dataclass(frozen=True)
class Failed:
    """A request the engine ended with an error; status 400 when the error
    is the request's own (`Finished.refused`), else 500."""

    error: str
    status: int = 500


Event = Tokens | Done | Failed


@dataclass(frozen=True)
class Submit:
    """Queue `request`; its id (or the engine's ValueError) goes to `answer`,
    its events to `sink`."""

    request: Request
    sink: Sink
    answer: concurrent.futures.Future[int]


@dataclass(frozen=True)
class Cancel:
    """Free request `id`'s row or queue place."""

    id: int


@dataclass(frozen=True)
class Stop:
    """Finish the rows running and queued, then end the thread."""


Command = Submit | Cancel | Stop


@dataclass(frozen=True)
class Sink:
    """Where a request's events go: its handler's event loop and queue."""

    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[Event]

    def put(self, event: Event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the loop closed (server stopped): nobody is listening
            pass


class EngineWorker:
    """Runs `engine` on a thread (see the module docs). `running` and
    `waiting` are the engine's rows and queue after the last round."""

    def __init__(self, engine: BatchEngine):
        self.engine = engine
        engine.on_commit = self._on_commit
        self.commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self.sinks: dict[int, Sink] = {}
        self.running = self.waiting = 0
        self.rounds = 0
        self._thread = threading.Thread(target=self._loop, name="specdec-engine", daemon=True)
        self._stopping = False

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Finish the rows running and queued, then end the thread."""
        self.commands.put(Stop())
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # ---- the handlers' side (any thread)
    async def submit(self, request: Request) -> tuple[int, asyncio.Queue[Event]]:
        """Queue `request`; (its id, the queue its events arrive on). A bad
        request is a ValueError (the engine's check), and nothing is queued."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event] = asyncio.Queue()
        answer: concurrent.futures.Future[int] = concurrent.futures.Future()
        self.commands.put(Submit(request, Sink(loop, events), answer))
        rid = await asyncio.wrap_future(answer)
        return rid, events

    def cancel(self, rid: int) -> None:
        """Free request `rid`'s row (or queue place) before the next round."""
        self.commands.put(Cancel(rid))

    # ---- the engine's thread
    def _on_commit(self, rid: int, r: Round, ids: list[int]) -> None:
        sink = self.sinks.get(rid)
        if sink is not None:
            sink.put(Tokens(ids, replace(r, p=None, q=None, tokens=None)))

    def _take(self, command: Command) -> None:
        if isinstance(command, Submit):
            try:
                rid = self.engine.submit(command.request)
            except ValueError as e:
                command.answer.set_exception(e)
                return
            self.sinks[rid] = command.sink
            command.answer.set_result(rid)
        elif isinstance(command, Cancel):
            self.engine.cancel(command.id)
            self.sinks.pop(command.id, None)
        else:
            self._stopping = True

    def _busy(self) -> bool:
        return bool(self.engine.active or self.engine.queued)

    def _loop(self) -> None:
        while True:
            try:
                self._take(self.commands.get(block=not self._busy() and not self._stopping))
                while True:
                    self._take(self.commands.get_nowait())
            except queue.Empty:
                pass
            if self._busy():
                self._round()
            self.running, self.waiting = self.engine.active, self.engine.queued
            if self._stopping and not self._busy():
                return

    def _round(self) -> None:
        try:
            finished = self.engine.step()
        except Exception as e:  # noqa: BLE001 - a failed round must not end the server
            log.exception("a batch round failed; its requests end with the error")
            self._fail_all(f"the batch round failed: {type(e).__name__}: {e}")
            return
        self.rounds += 1
        for f in finished:
            sink = self.sinks.pop(f.id, None)
            if sink is not None:
                if f.result is not None:
                    sink.put(Done(f.result))
                else:
                    sink.put(Failed(f.error or "failed", 400 if f.refused else 500))

    def _fail_all(self, error: str) -> None:
        for rid in list(self.sinks):
            self.engine.cancel(rid)
            self.sinks.pop(rid).put(Failed(error))
