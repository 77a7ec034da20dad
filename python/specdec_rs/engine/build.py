"""An engine from drafter specs, with the one default γ rule (the CLI's
`--batch`, the server and the benchmarks build theirs here).

The rule: a γ given (`k`) is fixed for every row that sets none; without
one, the load-aware `Goodput` policy chooses each row's γ, when some
drafter drafts at all (target-only rows ask for none either way). Each
spec is built once; every row gets its own drafter from it
(`drafters.copies`: the first row the object itself, later rows its
``fresh()``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specdec_rs.engine.engine import BatchEngine

if TYPE_CHECKING:
    from specdec_rs.policy.goodput import Goodput

DEFAULT_K = 4  # the engine's γ for rows that draft, when a policy does not choose


@dataclass(frozen=True)
class Built:
    """What `engine_for` made: the engine, its γ policy (the rule's Goodput,
    or None for a fixed γ; started unless `start=False`) and each spec's
    drafter (None for "none")."""

    engine: BatchEngine
    policy: Goodput | None
    drafters: dict[str, Any]


def default_policy(k: int | None, speculating: bool) -> Goodput | None:
    """The one default γ rule: `Goodput` when no γ is given and some row
    may draft, else None (the fixed `k`)."""
    from specdec_rs.policy import Goodput

    return Goodput() if k is None and speculating else None


def engine_for(
    target: Any,
    tokenizer: Any,
    drafter: str = "none",
    *,
    drafters: Sequence[str] = (),
    k: int | None = None,
    goodput: Goodput | None = None,
    greedy_draft: bool = False,
    built: Mapping[str, Any] | None = None,
    start: bool = True,
    **options: Any,
) -> Built:
    """A `BatchEngine` on `target` whose requests draft with spec `drafter`
    by default and may name any of `drafters` (each built once, by
    `drafters.from_spec` with `tokenizer`, or taken from `built`); γ by the
    default rule (`default_policy`), or by `goodput` when given; `options` go to the engine
    (max_batch, cache_positions, prefill_chunk, prefix_cache, ...). With
    start=False the policy is not started yet (call
    `engine.use_goodput(policy)` once the requests passed their checks:
    the profile is work)."""
    from specdec_rs import drafters as registry

    made: dict[str, Any] = {}
    for spec in dict.fromkeys([drafter, *drafters]):
        if built is not None and spec in built:
            made[spec] = built[spec]
        else:
            made[spec] = registry.from_spec(spec, target, tokenizer, greedy=greedy_draft)
    factories = {s: None if d is None else registry.copies(d) for s, d in made.items()}
    speculating = any(f is not None for f in factories.values())
    policy = goodput if goodput is not None else default_policy(k, speculating)
    engine = BatchEngine(
        target,
        factories[drafter],
        k=k if k is not None else DEFAULT_K if speculating else 0,
        vocab_size=len(tokenizer) if speculating else None,
        drafters=factories,
        tokenizer=tokenizer,
        **options,
    )
    if start:
        engine.use_goodput(policy)
    return Built(engine, policy, made)
