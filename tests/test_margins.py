"""Greedy margins: the target's top-1 minus top-2 logit at each new token
(`generate(margins=True)`), and `divergence`, which says where two greedy runs
part and how near a tie. p = target, q = draft."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import specdec_rs as sd
from specdec_rs.generation import divergence
from specdec_rs.generation.decoder import logit_margins
from specdec_rs.models import tiny_llama
from specdec_rs.runner import forward, new_cache

torch = pytest.importorskip("torch")

PROMPT = [3, 4, 5, 3, 4, 5, 3]


@pytest.fixture(scope="module")
def target() -> Any:
    return tiny_llama(vocab_size=64, num_layers=2, seed=3, dtype=torch.float64)


def test_margins_are_the_gap_between_the_top_two_logits() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.5], [0.0, 0.0, -1.0], [5.0, -2.0, 4.0]])
    assert logit_margins(logits) == (0.5, 0.0, 1.0)  # a tie is margin 0


def test_recorded_margins_match_a_fresh_forward(target: Any) -> None:
    out = sd.generate(
        target,
        sd.PromptLookup(),
        PROMPT,
        max_new_tokens=12,
        k=3,
        temperature=0,
        eos_token_id=[],
        margins=True,
    )
    assert len(out.margins) == out.new_tokens == 12
    seq = list(PROMPT)
    for token, margin in zip(out.tokens, out.margins, strict=True):
        with torch.inference_mode():
            row = forward(target, torch.tensor(seq), new_cache(target), keep=1)[-1]
        top = row.topk(2).values
        assert int(row.argmax()) == token
        assert margin == pytest.approx(float(top[0] - top[1]), abs=1e-9)
        seq.append(token)


def test_margins_need_greedy_decoding(target: Any) -> None:
    with pytest.raises(ValueError, match="margins=True records greedy margins"):
        sd.generate(target, None, PROMPT, max_new_tokens=4, temperature=0.7, margins=True)
    plain = sd.generate(target, None, PROMPT, max_new_tokens=4, temperature=0.7)
    assert plain.margins == []  # not recorded unless asked


def test_divergence_names_the_first_difference_and_its_margins(target: Any) -> None:
    a = sd.generate(target, None, PROMPT, max_new_tokens=8, temperature=0, margins=True)
    assert divergence(a, a) is None
    assert divergence(a, replace(a, tokens=a.tokens[:5])) is None  # a prefix: same text
    other = (a.tokens[3] + 1) % 64
    b = replace(a, tokens=[*a.tokens[:3], other, *a.tokens[4:]], margins=[])
    d = divergence(a, b)
    assert d is not None and d.index == 3 and d.tokens == (a.tokens[3], other)
    assert d.margins[0] == a.margins[3] and d.margins[1] != d.margins[1]  # NaN: not recorded


def parting_margins(target: Any) -> list[float]:
    """The smaller margin at each parting of greedy target-only and prompt
    lookup, over six prompts (none where the texts agree)."""
    found = []
    for start in range(6):
        prompt = [(start + t) % 64 for t in PROMPT]
        plain = sd.generate(
            target, None, prompt, max_new_tokens=24, temperature=0, eos_token_id=[], margins=True
        )
        spec = sd.generate(
            target,
            sd.PromptLookup(),
            prompt,
            max_new_tokens=24,
            k=4,
            temperature=0,
            eos_token_id=[],
            margins=True,
        )
        d = divergence(plain, spec)
        found += [] if d is None else [min(d.margins)]
    return found


def test_bfloat16_runs_part_only_at_near_ties(monkeypatch: pytest.MonkeyPatch) -> None:
    """bfloat16 forwards over one position and over a verification block
    round differently, so greedy runs may part, but only where the target's
    top two logits are within a few bfloat16 steps (2^-8 relative) of each
    other. Power: a round that keeps every draft unverified parts at wider
    margins."""
    import numpy as np

    target = tiny_llama(vocab_size=64, num_layers=2, seed=4, dtype=torch.bfloat16)
    with torch.inference_mode():
        scale = float(forward(target, torch.tensor(PROMPT), new_cache(target), keep=1).abs().max())
    bound = 8 * 2.0**-8 * max(scale, 1.0)
    assert all(m <= bound for m in parting_margins(target)), bound

    def unverified(p_argmax: Any, q: Any, drafts: Any) -> Any:
        return np.append(drafts.numpy(), int(p_argmax[-1]))

    monkeypatch.setattr("specdec_rs.generation.decoder.verify_greedy", unverified)
    assert any(m > bound for m in parting_margins(target)), bound
