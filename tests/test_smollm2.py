"""The embedded default, SmolLM2-135M-Instruct: speculative greedy output equals
target-only greedy on a code prompt and a chat prompt, for each drafter kind
(the shipped EAGLE, Medusa and hybrid heads included),
and with the tree drafters (the shipped heads' trees, lookup's trees)."""

from __future__ import annotations

from typing import Any

import pytest
import specdec_rs as sd
from specdec_rs import models
from specdec_rs.prompts import workloads

pytest.importorskip("transformers")
pytest.importorskip("gguf")


NEW = 12
# A short code prompt whose answer copies the function (prompt lookup gets
# long matches), and the first chat prompt.
PROMPTS = {"code": ("code", 10), "chat": ("chat", 0)}
HEADS = ("eagle", "medusa", "hybrid")


@pytest.fixture(scope="module")
def smollm2() -> tuple[Any, Any]:
    try:
        models.smollm2_gguf()
    except ValueError as e:  # an install step is missing: fail loudly, do not skip
        pytest.fail(str(e))
    return models.load_smollm2()


@pytest.fixture(scope="module")
def plain(smollm2: tuple[Any, Any]) -> dict[str, tuple[Any, sd.GenerationResult]]:
    """workload -> (prompt ids, target-only greedy result), computed once."""
    model, tokenizer = smollm2
    out = {}
    for name, (workload, index) in PROMPTS.items():
        ids = workloads.encode(tokenizer, workloads.prompts(workload)[index])
        out[name] = (ids, sd.generate(model, None, ids, max_new_tokens=NEW, temperature=0))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("workload", ["code", "chat"])
def test_greedy_speculative_equals_target_greedy(
    smollm2: tuple[Any, Any], plain: dict[str, tuple[Any, sd.GenerationResult]], workload: str
) -> None:
    model, tokenizer = smollm2
    ids, baseline = plain[workload]
    assert baseline.new_tokens > 8
    drafters: list[tuple[sd.Drafter, int]] = [
        (sd.PromptLookup(), 8),
        (sd.SuffixDrafter(), 8),
        (sd.Lookahead(), 2),  # its window runs in every verification forward
    ]
    if workload == "code":  # one prompt for the model drafter: its rounds cost the most
        drafters.append((sd.EarlyExit(model, 24), 2))
    else:  # the shipped heads, sampling their drafts (q their distribution)
        drafters += [(sd.drafters.from_spec(s, model, tokenizer), 3) for s in HEADS]
    for drafter, k in drafters:
        out = sd.generate(model, drafter, ids, max_new_tokens=NEW, k=k, temperature=0)
        assert out.tokens == baseline.tokens, drafter.name
        assert out.stop_reason == baseline.stop_reason
        if workload == "code" and drafter.name == "prompt-lookup":
            assert out.tokens_per_pass > 1.5, out.summary()  # the answer copies the function
        if drafter.name in HEADS:
            assert out.tokens_per_pass > 1.0, out.summary()  # the trained head's drafts are kept


@pytest.mark.slow
def test_tree_drafters_keep_the_greedy_output(
    smollm2: tuple[Any, Any], plain: dict[str, tuple[Any, sd.GenerationResult]]
) -> None:
    model, tokenizer = smollm2
    ids, baseline = plain["chat"]
    # hybrid's switching: test_heads.py
    for spec in ("prompt-lookup", "lookahead", "eagle", "medusa"):
        drafter = sd.drafters.from_spec(spec, model, tokenizer, greedy=True)
        out = sd.generate(model, drafter, ids, max_new_tokens=NEW, temperature=0, tree=8)
        assert out.tokens == baseline.tokens, spec
        assert out.policy == "tree:8"


def test_tokenizer_and_vocabulary(smollm2: tuple[Any, Any]) -> None:
    model, tokenizer = smollm2
    assert models.vocab_of(model) == len(tokenizer) == 49152
    models.check_same_tokenizer(tokenizer, tokenizer)


@pytest.mark.slow
@pytest.mark.parametrize("cache_type", ["f16", "q8_0"])
def test_a_smaller_cache_keeps_the_greedy_identity(
    smollm2: tuple[Any, Any], cache_type: str
) -> None:
    """SmolLM2 with q8 activations and float16 or q8_0 keys and values (the
    fast settings; other target functions): speculative greedy text equals
    its own target-only greedy text, for a chain and a tree (an EAGLE tree
    of 8 on this prompt parted at token 9 with q8_0 before a tree's rows
    took their keys in their own order)."""
    _, tokenizer = smollm2
    model, _ = models.load_smollm2(activations="q8", cache_type=cache_type)
    want = {"f16": "torch.float16", "q8_0": "torch.uint8"}[cache_type]
    assert str(model.model.layers[0].cache_dtype) == want
    ids = workloads.encode(tokenizer, workloads.prompts("code")[11])
    baseline = sd.generate(model, None, ids, max_new_tokens=NEW, temperature=0)
    assert baseline.new_tokens > 8
    for drafter, kw in (
        (sd.PromptLookup(), {"k": 8}),
        (sd.drafters.from_spec("eagle", model, tokenizer, greedy=True), {"tree": 8}),
    ):
        out = sd.generate(model, drafter, ids, max_new_tokens=NEW, temperature=0, **kw)
        assert out.tokens == baseline.tokens, drafter.name


@pytest.mark.slow
def test_q8_activations_keep_the_greedy_identity(smollm2: tuple[Any, Any]) -> None:
    """SmolLM2 with q8 activations (another target function): speculative
    greedy text equals its own target-only greedy text, chains and trees."""
    _, tokenizer = smollm2
    model, _ = models.load_smollm2(activations="q8")
    ids = workloads.encode(tokenizer, workloads.prompts("code")[10])
    baseline = sd.generate(model, None, ids, max_new_tokens=NEW, temperature=0)
    assert baseline.new_tokens > 8
    for drafter, kw in (
        (sd.PromptLookup(), {"k": 8}),
        (sd.Lookahead(), {"k": 2}),
        (sd.drafters.from_spec("eagle", model, tokenizer, greedy=True), {"tree": 8}),
    ):
        out = sd.generate(model, drafter, ids, max_new_tokens=NEW, temperature=0, **kw)
        assert out.tokens == baseline.tokens, drafter.name
