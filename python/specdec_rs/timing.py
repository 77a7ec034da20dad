"""Wall-clock timing: the one median-of-repeats helper every measurement uses."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def median_seconds(fn: Callable[[], Any], repeats: int, warmup: int = 3) -> float:
    """Median seconds of `repeats` calls of `fn`, after `warmup` untimed calls
    (the median shrugs off the odd call another process interrupted)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class Throughput:
    """new_tokens and tokens_per_second of a result holding `tokens` (the new
    ids) and `time_total` (seconds, prefill included)."""

    tokens: list[int]
    time_total: float

    @property
    def new_tokens(self) -> int:
        return len(self.tokens)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.time_total if self.time_total > 0 else 0.0
