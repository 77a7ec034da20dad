"""A grammar's rows read the LM head only where their masks allow an id:
`runner.stack.head_panels`, `Stack.forward(..., allowed=)` (the logits it
computes are the full head's bits; the panels it skips are NaN), and
constrained generation with and without it (the same tokens, greedy and
sampled, alone and in a batch). p = target, q = draft."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import specdec_rs as sd
from grammar_fixtures import SCHEMA, tiny_tokenizer
from specdec_rs import _core, models, runner
from specdec_rs.generation.decoder import Decoder
from specdec_rs.runner import stack as stack_module
from specdec_rs.runner.stack import DENSE_PANELS, head_panels, stack_of
from specdec_rs.structured import Grammar

torch = pytest.importorskip("torch")
pytest.importorskip("llguidance")

P = _core.panel_rows()
V = 40 * P  # the tokenizer's 34 pieces, then ids it lacks: masks allow 3 of 40 panels at most


@pytest.fixture(scope="module", params=["f32", "q8"])
def target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A tiny GGUF Llama (Q4_1 linears, a Q8_0 head of 40 panels) in either activation mode."""
    from specdec_rs.gguf import load_gguf
    from specdec_rs.gguf.writer import write_llama

    tiny = models.tiny_llama(vocab_size=V, hidden_size=64, num_layers=2, seed=3)
    path = Path(tmp_path_factory.mktemp("masked")) / "tiny.gguf"
    write_llama(tiny, path, linear_type="Q4_1", embed_type="Q8_0")
    return load_gguf(path, tokenizer=False, activations=request.param)[0]


@pytest.fixture(scope="module")
def tok() -> Any:
    return tiny_tokenizer()


@pytest.fixture
def no_grad() -> Any:
    """The Rust stack runs without autograd (`runner.stack.stack_of`)."""
    with torch.inference_mode():
        yield


def test_head_panels_lists_the_panels_holding_an_allowed_id() -> None:
    allowed = np.zeros((4, V), dtype=bool)
    allowed[0, [5, 17, 18, 16 * 39 + 15]] = True  # panels 0, 1, 39
    allowed[1, :] = True  # every panel: dense
    allowed[2, : int(DENSE_PANELS * 40) * P] = True  # exactly the dense share: still listed
    got = head_panels(allowed, V)
    assert got[0] == [0, 1, 39]
    assert got[1] is None
    assert got[2] == list(range(int(DENSE_PANELS * 40)))
    assert got[3] == []
    # a vocabulary that is not whole panels (a head of V + 3 rows: one more panel)
    short = np.zeros((1, V - 3), dtype=bool)
    short[0, V - 4] = True
    assert head_panels(short, V + 3) == [[39]]
    # a strided view reads the same as its copy
    wide = np.zeros((2, 2 * V), dtype=bool)
    wide[:, ::2] = allowed[:2]
    assert head_panels(wide[:, ::2], V) == got[:2]


@pytest.mark.parametrize(
    "bad",
    [np.zeros(V, dtype=bool), np.zeros((1, V), dtype=np.uint8), np.zeros((1, V + P), dtype=bool)],
    ids=["1-d", "not bool", "wider than the head"],
)
def test_head_panels_refuses_what_is_not_a_mask_of_the_head(bad: np.ndarray) -> None:
    with pytest.raises(ValueError, match="expected \\(rows, V\\) bool"):
        head_panels(bad, V)


def block_and_cache(target: Any, n: int) -> tuple[Any, Any]:
    cache = runner.new_cache(target)
    runner.forward(target, torch.tensor([3, 1, 4, 1, 5, 9, 2]), cache, keep=1)
    return torch.tensor([6, 5, 3, 5, 8][:n]), cache


def test_the_logits_it_computes_are_the_whole_heads_bits(target: Any, no_grad: None) -> None:
    block, plain_cache = block_and_cache(target, 5)
    _, masked_cache = block_and_cache(target, 5)
    stack = stack_of(target, plain_cache)
    assert stack is not None
    plain, plain_states = stack.forward([block], [plain_cache])
    allowed = np.zeros((4, V), dtype=bool)  # the block's 5th row is past the masks
    allowed[0, 7] = True  # one id: one panel
    allowed[1, [0, 33, 200, V - 1]] = True  # panels 0, 2, 12, 39
    allowed[2, :] = True  # dense: the whole head's pass with row 4
    masked, masked_states = stack.forward([block], [masked_cache], allowed=[allowed])
    assert torch.equal(masked_states, plain_states)
    lists = head_panels(allowed, V)
    for r in range(5):
        listed = None if r >= 4 else lists[r]
        if listed is None:
            assert torch.equal(masked[r], plain[r]), r
            continue
        computed = np.zeros(V, dtype=bool)
        for panel in listed:
            computed[panel * P : (panel + 1) * P] = True
        assert torch.equal(masked[r, computed], plain[r, computed]), r
        assert torch.isnan(masked[r, ~computed]).all(), r
        assert computed[allowed[r]].all()
    # the caches hold the same keys and values
    for a, b in zip(plain_cache.layers, masked_cache.layers, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_a_batch_masks_each_block_by_its_own_rows(target: Any, no_grad: None) -> None:
    from specdec_rs.runner.batch import StackRows

    blocks, plain_caches, masked_caches = [], [], []
    for n in (3, 1, 2):
        block, cache = block_and_cache(target, n)
        blocks.append(block)
        plain_caches.append(cache)
        masked_caches.append(block_and_cache(target, n)[1])
    backend = StackRows(target)
    plain, _ = backend.forward_blocks(blocks, plain_caches, hidden=False)
    first = np.zeros((3, V), dtype=bool)
    first[:, 20] = True
    third = np.zeros((1, V), dtype=bool)  # its second row past the masks
    third[0, [1, 100]] = True
    masked, _ = backend.forward_blocks(
        blocks, masked_caches, hidden=False, allowed=[first, None, third]
    )
    assert torch.equal(masked[1], plain[1])
    assert torch.equal(masked[2][1], plain[2][1])
    for got, want, mask in ((masked[0], plain[0], first), (masked[2][:1], plain[2][:1], third)):
        assert torch.equal(got[torch.from_numpy(mask)], want[torch.from_numpy(mask)])
        assert torch.isnan(got[:, 3 * P :][:, : 3 * P]).all()  # panels 3..5: never listed


def constrained(target: Any, drafter: Any, tok: Any, grammar: Grammar, **kw: Any) -> Any:
    options = {"max_new_tokens": 40, "k": 3, "eos_token_id": [0], "seed": 0, **kw}
    return sd.generate(target, drafter, [1, 2, 3], grammar=grammar, tokenizer=tok, **options)


@pytest.fixture
def whole_head(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Switches the masked head off for the test's generations (`Decoder.masked_head`)."""

    def off() -> None:
        monkeypatch.setattr(Decoder, "masked_head", False)

    return off


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_constrained_generation_keeps_its_tokens_with_the_masked_head(
    target: Any, tok: Any, temperature: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    grammars = [Grammar.json_schema(SCHEMA), Grammar.regex("(ab|a|b)+(xy)?c")]
    makers = [lambda: None, sd.PromptLookup, sd.SuffixDrafter]
    runs = {}
    for masked in (True, False):
        monkeypatch.setattr(Decoder, "masked_head", masked)
        for g, grammar in enumerate(grammars):
            for d, make in enumerate(makers):
                for seed in range(2):
                    out = constrained(
                        target, make(), tok, grammar, temperature=temperature, seed=seed
                    )
                    runs[(masked, g, d, seed)] = out.tokens
    for key, tokens in runs.items():
        if key[0]:
            assert tokens == runs[(False, *key[1:])], key
    distinct = len({tuple(t) for t in runs.values()})
    assert distinct >= (2 if temperature == 0 else 3)  # the grammars (and seeds) differ


def test_batch_rows_keep_their_tokens_with_the_masked_head(
    target: Any, tok: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    grammars = [Grammar.json_schema(SCHEMA), None, Grammar.regex("(ab|a|b)+(xy)?c")]
    requests = [
        sd.Request([1, 2, 3 + i], 30, temperature=0.8, seed=i, eos_token_id=[0], grammar=g)
        for i, g in enumerate(grammars)
    ]
    rows = {}
    for masked in (True, False):
        monkeypatch.setattr(Decoder, "masked_head", masked)
        out = sd.generate_batch(
            target, sd.PromptLookup, [], max_new_tokens=1, k=3, requests=requests, tokenizer=tok
        )
        rows[masked] = [r.result.tokens for r in out.rows if r.result is not None]
    assert len(rows[True]) == 3 and rows[True] == rows[False]


def dropping(allowed: np.ndarray, head_rows: int) -> list[list[int] | None]:
    """`head_panels` with a defect: each list's last panel left out."""
    lists = head_panels(allowed, head_rows)
    return [None if p is None else p[:-1] if len(p) > 1 else p for p in lists]


ACROSS_PANELS = "(ab|a|b|x|y|z|0|1|2|3|4|5|6|7|8|9)+c"  # allowed ids in panels 0-2


def test_a_panel_left_out_is_caught_not_sampled_around(
    target: Any, tok: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Power: a panel list that drops an allowed id's panel leaves NaN
    where the grammar allows an id, and the sampler's checks refuse it."""
    monkeypatch.setattr(stack_module, "head_panels", dropping)
    grammar = Grammar.regex(ACROSS_PANELS)
    with pytest.raises(ValueError, match="NaN"):
        for seed in range(4):
            constrained(target, None, tok, grammar, temperature=0.8, seed=seed)


def test_a_panel_left_out_in_a_batch_fails_its_rows(
    target: Any, tok: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Power, batch rounds: the rows whose masks lost a panel fail with the
    NaN error; a row without a grammar beside them is unaffected."""
    monkeypatch.setattr(stack_module, "head_panels", dropping)
    grammars = [Grammar.regex(ACROSS_PANELS), None, Grammar.regex(ACROSS_PANELS)]
    requests = [
        sd.Request([1, 2, 3 + i], 20, temperature=0.8, seed=i, eos_token_id=[0], grammar=g)
        for i, g in enumerate(grammars)
    ]
    out = sd.generate_batch(
        target, sd.PromptLookup, [], max_new_tokens=1, k=3, requests=requests, tokenizer=tok
    )
    assert out.rows[0].result is None and "NaN" in str(out.rows[0].error)
    assert out.rows[2].result is None and "NaN" in str(out.rows[2].error)
    assert out.rows[1].result is not None and len(out.rows[1].result.tokens) > 0
