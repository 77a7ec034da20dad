"""Greedy identity for the drafter tests: each prompt's greedy output with a
drafter equals target-only's. p = target, q = draft, k = γ."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import specdec_rs as sd


def greedy_runs(
    target: Any,
    drafter_for: Callable[[], Any],
    prompts: Sequence[list[int]],
    *,
    max_new_tokens: int,
    **options: Any,
) -> list[sd.GenerationResult]:
    """Each prompt generated greedily with `drafter_for()` (called once per
    prompt: a new drafter, or one object over all) and `options` (k, tree),
    asserted to give target-only's tokens; the results, in prompt order."""
    results = []
    for prompt in prompts:
        plain = sd.generate(
            target, None, prompt, max_new_tokens=max_new_tokens, temperature=0, eos_token_id=[]
        )
        out = sd.generate(
            target,
            drafter_for(),
            prompt,
            max_new_tokens=max_new_tokens,
            temperature=0,
            eos_token_id=[],
            **options,
        )
        assert out.tokens == plain.tokens, (prompt, out.drafter)
        results.append(out)
    return results
