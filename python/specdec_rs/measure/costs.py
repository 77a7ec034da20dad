"""What a target step, a verification and a draft step cost, measured.
p = target, q = draft, k = γ.

c = one draft step / one target step; v(n) = a target forward over n new
tokens / over one (v(1) = 1). Medians of repeated cached steps at a real
prompt's context, interleaved where sizes are compared so drift hits all alike.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specdec_rs import _checks, models, runner
from specdec_rs.processors import Sampler, SamplingConfig
from specdec_rs.timing import median_seconds

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel


@dataclass(frozen=True)
class Costs:
    """Measured at `context_tokens` tokens of context.

    target_step_s: one cached single-token target step (seconds).
    verify_cost: v(n) for n = 1..k_max+1 (+ the widest drafter window,
    `window_positions`).  cost_ratio: drafter spec -> c.
    part_cost_ratio: spec -> part -> c, for a drafter made of parts (the
    hybrid: each part drafts its own rounds, at its own cost).
    """

    context_tokens: int
    target_step_s: float
    verify_cost: list[float]
    cost_ratio: dict[str, float] = field(default_factory=dict)
    part_cost_ratio: dict[str, dict[str, float]] = field(default_factory=dict)


def decode_step_time(model: PreTrainedModel, context: torch.Tensor, repeats: int = 100) -> float:
    """Median seconds of one cached single-token decode step after `context` (n,)."""
    import torch

    repeats = _checks.integer(repeats, "repeats", minimum=1)
    with torch.inference_mode():
        cache = runner.new_cache(model)
        runner.forward(model, context[:-1], cache, keep=1)
        n = len(context) - 1

        def step() -> None:
            runner.forward(model, context[-1:], cache, keep=1)
            runner.crop(cache, n)

        return median_seconds(step, repeats)


def verify_cost_curve(
    model: PreTrainedModel, context: torch.Tensor, max_n: int = 9, repeats: int = 15
) -> list[float]:
    """v(n) for n = 1..max_n: a cached forward over n new tokens after `context`,
    relative to one token (medians; sizes interleaved so drift hits all alike)."""
    import torch

    max_n = _checks.integer(max_n, "max_n", minimum=1, maximum=1024)
    repeats = _checks.integer(repeats, "repeats", minimum=1)
    times: dict[int, list[float]] = {n: [] for n in range(1, max_n + 1)}
    with torch.inference_mode():
        cache = runner.new_cache(model)
        runner.forward(model, context, cache, keep=1)
        base = len(context)
        g = torch.Generator().manual_seed(0)
        for rep in range(repeats + 2):
            for n in times:
                tokens = torch.randint(0, models.vocab_of(model), (n,), generator=g)
                t = time.perf_counter()
                runner.forward(model, tokens, cache, keep=n)
                elapsed = time.perf_counter() - t
                runner.crop(cache, base)
                if rep >= 2:  # warm-up
                    times[n].append(elapsed)
    one = statistics.median(times[1])
    return [statistics.median(times[n]) / one for n in times]


def drafter_step_time(
    drafter: Any, target: PreTrainedModel, context: torch.Tensor, repeats: int = 100
) -> float:
    """Median seconds for the drafter to propose one token after `context`,
    through its own start/propose/update (any drafter)."""
    import torch

    repeats = _checks.integer(repeats, "repeats", minimum=1)
    device = models.device_of(target)
    sampler = Sampler(
        SamplingConfig(0.0), models.vocab_of(target), torch.Generator(device).manual_seed(0)
    )
    with torch.inference_mode():
        cache = runner.new_cache(target)
        hidden = drafter.needs_target_hidden
        _, h = runner.forward_with_hidden(target, context[:-1], cache, keep=1, hidden=hidden)
        drafter.start(context, cache, h)
        last = h[-1:] if h is not None else None

        def step() -> None:
            drafter.propose(context, 1, sampler)
            drafter.update(context[:-1], 0, last)  # back to the cache it started from

        return median_seconds(step, repeats)


def window_positions(drafter: Any) -> int:
    """Positions a drafter's window adds to each drafting round's forward
    (its ``window_positions``; lookahead's W·(N − 1)), else 0."""
    return int(getattr(drafter, "window_positions", 0) or 0)


def measure_costs(
    target: PreTrainedModel,
    context: torch.Tensor,
    drafters: dict[str, Any],
    *,
    k_max: int = 8,
    repeats: int = 100,
) -> Costs:
    """Target step time, v(1..k_max+1) and each drafter's c at `context` (n,).
    `drafters`: spec -> drafter (None entries are skipped); a drafter made of
    parts also gets each part's c (`part_cost_ratio[spec][part]`)."""
    k_max = _checks.integer(k_max, "k_max", minimum=1, maximum=1023)
    repeats = _checks.integer(repeats, "repeats", minimum=1)
    step = decode_step_time(target, context, repeats=repeats)
    built = {spec: d for spec, d in drafters.items() if d is not None}
    window = max((window_positions(d) for d in built.values()), default=0)
    v = verify_cost_curve(
        target, context, max_n=k_max + 1 + window, repeats=max(1, repeats * 3 // 20)
    )

    def c(drafter: Any) -> float:
        return drafter_step_time(drafter, target, context, repeats=repeats) / step

    ratios, parts = {}, {}
    for spec, d in built.items():
        ratios[spec] = c(d)
        if getattr(d, "parts", None):
            parts[spec] = {name: c(part) for name, part in d.parts.items()}
    return Costs(len(context), step, v, ratios, parts)
