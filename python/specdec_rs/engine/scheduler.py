"""The engine's slots, its queue and its cache-position budget: which
requests run, which wait, and where a finished row's cache goes.

A request reserves its prompt plus its budget of cache positions; the
oldest queued request joins a free slot when that fits beside the running
rows (or when none runs), so requests start in submission order. A freed
slot's cache buffers are kept for the next row.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specdec_rs import models, runner

if TYPE_CHECKING:
    from specdec_rs.engine.requests import Checked
    from specdec_rs.generation.decoder import Decoder
    from specdec_rs.generation.loop import Run


@dataclass
class Row:
    """A slot's request: its id, decoder and loop state; `fixed_k` is its
    own γ (0 without a drafter; None: the engine's); `waited`: the prompt
    tokens the engine prefilled for other rows while this one's prompt
    was still being prefilled (`prefill_rank`)."""

    id: int
    decoder: Decoder
    run: Run
    fixed_k: int | None
    waited: int = 0


PREFILL_ORDERS = ("shortest", "fifo")
PREFILL_ORDER = "shortest"  # the default (`BatchEngine`, `specdec serve`)
# "shortest": a token prefilled for others while a row waits counts as this much of its own
AGING = 0.5


def prefill_rank(order: str, rid: int, left: int, waited: int) -> tuple[float, int, int]:
    """The sort key of a row still prefilling (smallest first) under the
    prefill order `order`, for a row of request id `rid` with `left` > 0
    prompt tokens to prefill, having waited while `waited` tokens were
    prefilled for others.

    "fifo": the oldest request first. "shortest": the fewest tokens left
    first, aged: left − `AGING`·waited, ties to the fewer left, then the
    older request. Rows that joined together have waited alike, so a burst
    is prefilled shortest remaining prompt first (which minimises the mean
    time to first token); a row being prefilled keeps its turn (its key
    falls by its whole piece a round, a waiting row's by half the pieces),
    so equal prompts are finished one by one rather than in turns; and a
    long prompt's key falls as it waits, so a stream of later short prompts
    cannot starve it (it waits at most 1 / `AGING` times its own length)."""
    if order == "fifo":
        return (0.0, 0, rid)
    return (left - AGING * waited, left, rid)


class Scheduler:
    """`max_batch` slots (`rows[slot]`: a Row or None), the queue of
    checked requests, the caches of freed slots, and `cache_positions`,
    the most positions the running rows may reserve together."""

    def __init__(self, max_batch: int, cache_positions: int):
        self.rows: list[Row | None] = [None] * max_batch
        self.queue: deque[Checked] = deque()
        self.free_caches: list[Any] = []
        self.cache_positions = cache_positions

    @property
    def active(self) -> int:
        """Rows decoding now."""
        return sum(row is not None for row in self.rows)

    @property
    def queued(self) -> int:
        return len(self.queue)

    @property
    def reserved(self) -> int:
        """Cache positions the running rows may fill (prompt + budget each)."""
        return sum(r.decoder.prompt_length + r.run.max_new for r in self.live())

    def live(self) -> list[Row]:
        return [row for row in self.rows if row is not None]

    def admit(self, start: Callable[[Checked], Row]) -> list[tuple[Checked, ValueError]]:
        """Start queued requests (`start`) in free slots, oldest first, while
        their reservations fit; the requests whose start failed, with why."""
        failed = []
        for slot in range(len(self.rows)):
            if not self.queue:
                break
            if self.rows[slot] is None:
                item = self.queue[0]
                if self.active and self.reserved + len(item.prompt) + item.max_new > (
                    self.cache_positions
                ):
                    break  # it waits (in order) until running rows free their positions
                self.queue.popleft()
                try:
                    self.rows[slot] = start(item)
                except ValueError as e:
                    failed.append((item, e))
        return failed

    def reused_cache(self) -> Any:
        """A freed slot's cache, emptied (None: none kept)."""
        cache = self.free_caches.pop() if self.free_caches else None
        if cache is not None:
            runner.crop(cache, 0)
        return cache

    def release(self, slot: int) -> Row:
        """Empty `slot`, keeping its row's cache for the next; its row."""
        row = self.rows[slot]
        assert row is not None
        self.rows[slot] = None
        self.free_caches.append(row.decoder.cache)
        return row

    def dequeue(self, rid: int) -> bool:
        """Drop queued request `rid` (False: not queued)."""
        for item in list(self.queue):
            if item.id == rid:
                self.queue.remove(item)
                return True
        return False

    def slot_of(self, rid: int) -> int | None:
        """The slot running request `rid` (None: not running)."""
        return next((s for s, r in enumerate(self.rows) if r is not None and r.id == rid), None)


def default_cache_positions(target: Any) -> int:
    """Positions of a target cache that half this machine's memory holds:
    2 (keys, values) · layers · key-value heads · head size · 4 bytes each
    (the caches are float32 on a GGUF target, else in the model's dtype)."""
    config = target.config
    layers = int(getattr(config, "num_hidden_layers", 1))
    heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    head_dim = int(
        getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    )
    per_position = 2 * layers * heads * head_dim * max(4, models.dtype_of(target).itemsize)
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # no sysconf: assume 8 GiB
        memory = 8 << 30
    return max(1, memory // 2 // per_position)
