"""`generate_batch`: many prompts through one `BatchEngine`, each output
with exactly the law of target-only sampling at its settings.

>>> import specdec_rs as sd
>>> from specdec_rs.models import tiny_llama
>>> target = tiny_llama(num_layers=2)
>>> out = sd.generate_batch(target, sd.PromptLookup, [[5, 6, 7, 5, 6], [9, 8, 9]],
...                         max_new_tokens=6, temperature=0, eos_token_id=[])
>>> alone = sd.generate(target, sd.PromptLookup(), [9, 8, 9], max_new_tokens=6,
...                     temperature=0, eos_token_id=[])
>>> out.rows[1].result.tokens == alone.tokens
True
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from specdec_rs import _checks
from specdec_rs.engine.engine import MAX_ROWS, BatchEngine, BatchResult
from specdec_rs.engine.requests import Request

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from specdec_rs.drafters import Drafter
    from specdec_rs.policy.goodput import Goodput


def generate_batch(
    target: PreTrainedModel,
    drafter_factory: Callable[[], Drafter] | None,
    prompts: Sequence[Any],
    *,
    max_new_tokens: int,
    max_batch: int = 8,
    k: int = 4,
    goodput: Goodput | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    seed: int | None = None,
    eos_token_id: int | Iterable[int] | None = None,
    vocab_size: int | None = None,
    requests: Sequence[Request] | None = None,
    cache_positions: int | None = None,
    tokenizer: Any = None,
) -> BatchResult:
    """Generate for every prompt, up to `max_batch` at a time (see the
    module docs). Each prompt's output has exactly the law of target-only
    sampling at its settings; prompt i gets seed `seed` + i (seed None:
    drawn), so it equals `generate` on that prompt alone with that seed.
    `requests` instead of `prompts` (pass prompts=[]) gives every row its
    own settings (a `Request.grammar` needs `tokenizer`). A bad prompt is a
    ValueError naming its row, before any work. The engine holds at most as
    many rows as there are requests."""
    if requests is None:
        if isinstance(prompts, str) or not isinstance(prompts, Sequence):
            raise ValueError(
                f"prompts is a {type(prompts).__name__}; pass a list of prompts (token id lists)"
            )
        if len(prompts) == 0:
            raise ValueError("prompts is empty; pass at least one prompt")
        import secrets

        base = secrets.randbits(62) if seed is None else _checks.seed(seed)
        if base + len(prompts) - 1 >= 2**64:
            raise ValueError(
                f"seed = {base}: prompt i takes seed + i, and seed + {len(prompts) - 1} passes "
                f"2^64 - 1; pass a seed of at most {2**64 - len(prompts)}"
            )
        requests = [
            Request(
                prompt, max_new_tokens, temperature, top_k, top_p, min_p, base + i, eos_token_id
            )
            for i, prompt in enumerate(prompts)
        ]
    elif isinstance(requests, str) or not isinstance(requests, Sequence) or not requests:
        raise ValueError("requests must be a non-empty list of engine.Request")
    rows = _checks.integer(max_batch, "max_batch", minimum=1, maximum=MAX_ROWS)
    engine = BatchEngine(
        target,
        drafter_factory,
        max_batch=min(rows, len(requests)),
        k=k,
        vocab_size=vocab_size,
        cache_positions=cache_positions,
        tokenizer=tokenizer,
    )
    needs = []
    for i, request in enumerate(requests):  # every row checked before any work
        item = engine.check(request, i, where=f"prompt {i}")
        needs.append(len(item.prompt) + item.max_new)
    largest = sum(sorted(needs, reverse=True)[: engine.max_batch])
    if largest > engine.cache_positions:
        raise ValueError(
            f"max_batch = {max_batch} rows of these prompts need up to {largest} cache positions "
            f"at once, more than the cache holds (cache_positions = {engine.cache_positions}); "
            "lower max_batch or max_new_tokens, or raise cache_positions"
        )
    engine.use_goodput(goodput)  # the profile (work) only once every row passed
    return engine.run(requests)
