"""The README's development examples run as written: the example drafter and
γ policy plug in without touching the loop, and the greedy output stays the
target's own (the law tests check the loop at temperature > 0)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import specdec_rs as sd
from specdec_rs import drafters, models
from specdec_rs.drafters.registry import REGISTRY

README = Path(__file__).resolve().parents[1] / "README.md"


def example(name: str) -> str:
    """The Python block after `<!-- example: name -->` in the README."""
    found = re.search(rf"<!-- example: {name} -->\n```python\n(.*?)```", README.read_text(), re.S)
    assert found is not None, f"the README has no example {name!r}"
    return found.group(1)


@pytest.fixture
def repeat() -> Any:
    scope: dict[str, Any] = {}
    exec(compile(example("drafter"), "README.md (drafter)", "exec"), scope)
    try:
        yield scope["Repeat"]
    finally:
        REGISTRY.pop("repeat", None)  # registered by the example: other tests see the usual list


def test_the_example_drafter_is_twenty_lines_and_registers_its_name(repeat: Any) -> None:
    lines = [line for line in example("drafter").splitlines() if line.strip()]
    assert len(lines) <= 22
    target = models.tiny_llama(num_layers=2)
    assert isinstance(drafters.from_spec("repeat", target), repeat)


def test_the_example_drafter_keeps_the_greedy_output(repeat: Any) -> None:
    target = models.tiny_llama(num_layers=2)
    prompt = [5, 6, 6, 6, 7, 7]
    plain = sd.generate(target, None, prompt, max_new_tokens=24, temperature=0, eos_token_id=[])
    out = sd.generate(
        target,
        drafters.from_spec("repeat", target),
        prompt,
        max_new_tokens=24,
        k=3,
        temperature=0,
        eos_token_id=[],
    )
    assert out.tokens == plain.tokens and out.drafted > 0 and out.rounds < 24 + 1


def test_the_example_policy_chooses_gamma_from_past_rounds(repeat: Any) -> None:
    scope: dict[str, Any] = {}
    exec(compile(example("policy"), "README.md (policy)", "exec"), scope)
    policy = scope["Doubling"]()
    target = models.tiny_llama(num_layers=2)
    seen: list[int] = []
    out = sd.generate(
        target,
        repeat(),
        [5, 6, 6, 6],
        max_new_tokens=40,
        k=policy,
        temperature=0,
        eos_token_id=[],
        on_round=lambda r: seen.append(r.asked),
    )
    plain = sd.generate(
        target, None, [5, 6, 6, 6], max_new_tokens=40, temperature=0, eos_token_id=[]
    )
    assert out.tokens == plain.tokens and out.policy == "doubling"
    assert seen[0] == 1 and set(seen) <= {0, 1, 2, 4, 8, 16}  # 0: the budget's last token
