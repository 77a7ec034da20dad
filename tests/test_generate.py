"""Speculative generation on tiny random Llama models: greedy identity, cache
consistency, the device path, what drafters receive, and bad input.
p = target, q = draft. (The end-to-end output law: test_law.py.)

The models are float64 so that batched and one-token forwards agree to ~1e-15
and greedy ties cannot flip between the two code paths.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import specdec_rs as sd
from specdec_rs.generation import Decoder
from specdec_rs.models import layer_view, tiny_llama
from specdec_rs.processors import SamplingConfig
from specdec_rs.runner import forward, new_cache

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

V = 64


@pytest.fixture(scope="module")
def target() -> Any:
    return tiny_llama(vocab_size=V, num_layers=3, seed=1, dtype=torch.float64)


@pytest.fixture(scope="module")
def draft() -> Any:
    return tiny_llama(vocab_size=V, num_layers=1, seed=2, dtype=torch.float64)


def drafters(target: Any, draft: Any) -> dict[str, Callable[[], sd.Drafter]]:
    return {
        "draft-model": lambda: sd.DraftModel(draft),
        "draft-model-greedy": lambda: sd.DraftModel(draft, greedy=True),
        "truncated-view": lambda: sd.DraftModel(layer_view(target, 2)),
        "prompt-lookup": lambda: sd.PromptLookup(min_ngram=1),
        "early-exit-1": lambda: sd.EarlyExit(target, 1),
        "early-exit-2-greedy": lambda: sd.EarlyExit(target, 2, greedy=True),
    }


DRAFTERS = list(drafters(None, None))


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    g = np.random.default_rng(seed)
    out = [g.integers(2, V, size=g.integers(1, 14)).tolist() for _ in range(count)]
    out.append([5, 6, 7, 8, 5, 6, 7, 8, 5, 6])  # repetitive: prompt lookup gets long matches
    return out


NEW = 20


@pytest.fixture(scope="module")
def greedy_baselines(target: Any) -> list[tuple[list[int], list[int]]]:
    """(prompt, target-only greedy tokens) for each test prompt, computed once;
    our target-only loop agrees with transformers' own greedy generate."""
    out = []
    for prompt in prompts(4):
        plain = sd.generate(
            target, None, prompt, max_new_tokens=NEW, temperature=0, eos_token_id=[]
        )
        hf = target.generate(
            torch.tensor([prompt]),
            max_new_tokens=NEW,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
        assert plain.tokens == hf
        out.append((prompt, plain.tokens))
    return out


@pytest.mark.parametrize("name", DRAFTERS)
def test_greedy_output_equals_target_only_greedy(
    target: Any, draft: Any, name: str, greedy_baselines: list[tuple[list[int], list[int]]]
) -> None:
    """Every drafter, γ = 1, 3 and 6, and both ways to the verifier (in place,
    and the accelerator path that moves only gathered values and sampled rows)."""
    make = drafters(target, draft)[name]
    accepted = 0
    for prompt, plain in greedy_baselines:
        for k, transfer in ((1, "auto"), (3, "gathered"), (6, "auto")):
            out = sd.generate(
                target,
                make(),
                prompt,
                max_new_tokens=NEW,
                k=k,
                temperature=0,
                eos_token_id=[],
                transfer=transfer,
            )
            assert out.tokens == plain, (prompt, k)
            assert out.rounds == sum(out.accepted_histogram)
            assert out.new_tokens == NEW
            accepted += sum(out.accepted)
    assert accepted > 0  # the drafts were not all rejected: the accept path ran


@pytest.mark.parametrize("name", DRAFTERS)
def test_the_device_path_samples_what_the_in_place_path_samples(
    target: Any, draft: Any, name: str
) -> None:
    """Same seed, temperature 0.8 with top-k: transfer="gathered" (the path an
    accelerator takes, run here on the CPU) emits the very same tokens."""
    make = drafters(target, draft)[name]
    for seed in range(3):
        runs = [
            sd.generate(
                target,
                make(),
                [3, 4, 5, 3, 4],
                max_new_tokens=20,
                k=3,
                temperature=0.8,
                top_k=20,
                seed=seed,
                eos_token_id=[],
                transfer=transfer,
            ).tokens
            for transfer in ("auto", "gathered")
        ]
        assert runs[0] == runs[1]


@pytest.mark.parametrize("name", DRAFTERS)
def test_caches_match_a_fresh_forward_after_generation(target: Any, draft: Any, name: str) -> None:
    drafter = drafters(target, draft)[name]()
    config = SamplingConfig(temperature=1.0)
    decoder = Decoder(target, drafter, [3, 4, 5, 3, 4], config, seed=7)
    with torch.inference_mode():
        for r in range(12):
            decoder.append(decoder.step(k=1 + r % 5).emitted)
        seq = decoder.seq
        assert decoder.cache.get_seq_length() == len(seq) - 1
        cached = forward(target, seq[-1:], decoder.cache, keep=1)[-1]
        fresh = forward(target, seq, new_cache(target), keep=1)[-1]
        torch.testing.assert_close(cached, fresh, rtol=1e-9, atol=1e-9)
        if isinstance(drafter, sd.DraftModel):
            model, cache = drafter.model, drafter._cache
            assert cache is not None and cache.get_seq_length() <= len(seq) - 1
            cached = forward(model, seq[cache.get_seq_length() :], cache, keep=1)[-1]
            fresh = forward(model, seq, new_cache(model), keep=1)[-1]
            torch.testing.assert_close(cached, fresh, rtol=1e-9, atol=1e-9)


# ---- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"input_ids": []}, "non-empty prompt"),
        ({"input_ids": [[1, 2], [3, 4]]}, "batch size 2"),
        ({"input_ids": [1, V + 5]}, "outside"),
        ({"input_ids": [1.5, 2.0]}, "integer token ids"),
        ({"k": 0}, "k = 0 is out of range"),
        ({"temperature": -0.5}, "temperature = -0.5"),
        ({"temperature": float("nan")}, "temperature = nan"),
        ({"top_p": 0.0}, r"top_p = 0.0 is out of range.*> 0 and <= 1"),
        ({"top_p": 1.5}, r"top_p = 1.5 is out of range.*> 0 and <= 1"),
        ({"top_k": 0}, "top_k = 0"),
        ({"min_p": 2.0}, "min_p = 2.0"),
        ({"max_new_tokens": 0}, "max_new_tokens = 0"),
        ({"vocab_size": V + 1}, "only 64 rows"),
    ],
)
def test_bad_arguments_raise_value_error(target: Any, kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"input_ids": [1, 2, 3], "max_new_tokens": 4, **kwargs}
    with pytest.raises(ValueError, match=message):
        sd.generate(target, sd.PromptLookup(), args.pop("input_ids"), **args)


def test_mismatched_vocabularies_raise(target: Any) -> None:
    other = tiny_llama(vocab_size=V + 16, num_layers=1, seed=5, dtype=torch.float64)
    with pytest.raises(ValueError, match="different tokenizers cannot be paired"):
        sd.generate(target, sd.DraftModel(other), [1, 2], max_new_tokens=2)
    # padded heads sharing a tokenizer: compare the first vocab_size entries
    out = sd.generate(
        target, sd.DraftModel(other), [1, 2], max_new_tokens=4, vocab_size=V, temperature=0
    )
    plain = sd.generate(target, None, [1, 2], max_new_tokens=4, temperature=0)
    assert out.tokens == plain.tokens


def test_layer_view_out_of_range(target: Any) -> None:
    with pytest.raises(ValueError, match="num_layers = 4 is out of range"):
        layer_view(target, 4)
    with pytest.raises(ValueError, match="min_ngram = 3, max_ngram = 2"):
        sd.PromptLookup(max_ngram=2, min_ngram=3)


# ---- stopping, statistics, determinism ----------------------------------------------------


def test_stops_after_eos_like_target_only(target: Any, draft: Any) -> None:
    plain = sd.generate(target, None, [7, 8, 9], max_new_tokens=40, temperature=0, eos_token_id=[])
    eos = plain.tokens[9]
    cut = plain.tokens[: plain.tokens.index(eos) + 1]
    for k in (1, 3, 6):
        out = sd.generate(
            target,
            sd.DraftModel(draft),
            [7, 8, 9],
            max_new_tokens=40,
            k=k,
            temperature=0,
            eos_token_id=eos,
        )
        assert out.tokens == cut and out.stop_reason == "eos"


def test_budget_is_never_exceeded(target: Any) -> None:
    for budget in (1, 2, 5, 13):
        out = sd.generate(
            target,
            sd.PromptLookup(min_ngram=1),
            [5, 6, 5, 6, 5, 6],
            max_new_tokens=budget,
            k=6,
            eos_token_id=[],
            seed=1,
        )
        assert out.new_tokens == budget and out.stop_reason == "length"


def test_same_seed_same_output_and_statistics_add_up(target: Any, draft: Any) -> None:
    a = sd.generate(
        target, sd.DraftModel(draft), [4, 5], max_new_tokens=30, k=3, seed=11, eos_token_id=[]
    )
    b = sd.generate(
        target, sd.DraftModel(draft), [4, 5], max_new_tokens=30, k=3, seed=11, eos_token_id=[]
    )
    assert a.tokens == b.tokens and a.accepted_histogram == b.accepted_histogram
    kept = sum(m * n for m, n in enumerate(a.accepted_histogram))
    assert kept == sum(a.accepted)
    assert a.new_tokens == kept + a.rounds  # each round adds its kept drafts plus one token
    assert 0 <= a.alpha <= 1 and a.tokens_per_pass == a.new_tokens / a.rounds
    s = a.summary()
    assert s["new_tokens"] == 30 and s["drafter"] == "model" and s["k"] == 3


# ---- what drafters receive ------------------------------------------------------------------


class Recorder(sd.DraftModel):
    """A draft model that asks for the target's hidden states and keeps them."""

    needs_target_hidden = True

    def start(self, seq: Any, target_cache: Any, target_hidden: Any = None) -> None:
        super().start(seq, target_cache, target_hidden)
        self.seen = [target_hidden]

    def update(self, seq: Any, num_accepted: int, target_hidden: Any = None) -> None:
        super().update(seq, num_accepted, target_hidden)
        assert target_hidden is not None and len(target_hidden) == num_accepted + 1
        self.seen.append(target_hidden)


def test_feature_drafters_get_the_verified_hidden_states(target: Any) -> None:
    """A drafter with needs_target_hidden gets the last hidden state of every
    position once: the prompt's at start, then each round's kept positions,
    taken from the verification forward (no extra pass). Together they are a
    fresh forward's hidden states of the whole text but its last token."""
    recorder = Recorder(target)  # drafting with the target itself: drafts are kept
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5]
    out = sd.generate(target, recorder, prompt, max_new_tokens=16, k=4, temperature=0.9, seed=2)
    seen = torch.cat(recorder.seen)
    seq = torch.tensor(prompt + out.tokens)
    with torch.inference_mode():
        full = target(seq[None], output_hidden_states=True).hidden_states[-1][0]
    assert seen.shape == (len(seq) - 1, full.shape[-1])
    torch.testing.assert_close(seen, full[:-1], rtol=1e-9, atol=1e-9)
    assert sum(out.accepted) > 0  # rounds kept drafts: multi-row updates were checked


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_generation_on_cuda_matches_the_cpu(target: Any, draft: Any) -> None:
    """The same models on a GPU: greedy output equals the CPU's target-only greedy."""
    plain = sd.generate(target, None, [3, 4, 5], max_new_tokens=16, temperature=0, eos_token_id=[])
    gpu_target = tiny_llama(vocab_size=V, num_layers=3, seed=1, dtype=torch.float64).cuda()
    gpu_draft = tiny_llama(vocab_size=V, num_layers=1, seed=2, dtype=torch.float64).cuda()
    for drafter in (sd.DraftModel(gpu_draft), sd.EarlyExit(gpu_target, 1), sd.PromptLookup()):
        out = sd.generate(
            gpu_target, drafter, [3, 4, 5], max_new_tokens=16, k=3, temperature=0, eos_token_id=[]
        )
        assert out.tokens == plain.tokens, drafter.name
    sampled = sd.generate(gpu_target, sd.DraftModel(gpu_draft), [3, 4, 5], max_new_tokens=16, k=3)
    assert sampled.new_tokens == 16


def test_the_tally_of_a_generation_is_the_sum_of_its_rounds() -> None:
    """`GenerationResult.tally` (from its fields) equals the `+` of
    `Tally.of` over the rounds `on_round` saw, and its α is kept / checked
    counted by hand from the rounds."""
    from specdec_rs.models import tiny_llama
    from specdec_rs.rounds import Tally

    target = tiny_llama(num_layers=2, seed=3)
    draft = tiny_llama(num_layers=1, seed=4)
    rounds: list[Any] = []
    out = sd.generate(
        target, sd.DraftModel(draft), [5, 6, 7, 5, 6], max_new_tokens=30, k=sd.HeuristicK(3),
        temperature=1.0, seed=7, eos_token_id=[], on_round=rounds.append,
    )  # fmt: skip
    summed = sum((Tally.of(r) for r in rounds), Tally())
    assert summed == out.tally and summed.rounds == out.rounds == len(rounds)
    kept = sum(r.accepted for r in rounds)
    checked = sum(min(r.accepted + 1, r.depth) for r in rounds)
    assert checked > kept > 0  # some drafts kept, some rejected: the check can fail
    assert out.alpha == kept / checked == summed.alpha
    assert summed.drafting == sum(r.drafted > 0 for r in rounds)
    assert sum(summed.histogram) == summed.rounds == sum(summed.by_k)
    assert Tally.of(rounds[0]) + Tally() == Tally.of(rounds[0])


def test_a_greedy_round_reads_the_target_rows_argmaxes_only(target: Any, draft: Any) -> None:
    """At temperature 0 on the CPU a chain round hands the verifier the target
    rows' argmaxes (`Round.p_argmax`, `verify_greedy`) instead of one-hot rows
    (p is None), and its tokens are the argmaxes' rule: each kept draft is its
    row's argmax, the last token the next row's. Sampled rounds keep their rows."""
    rounds: list[Any] = []
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    out = sd.generate(
        target, sd.DraftModel(draft), prompt, max_new_tokens=NEW, k=3, temperature=0,
        eos_token_id=[], on_round=rounds.append,
    )  # fmt: skip
    assert out.new_tokens == NEW and any(r.accepted for r in rounds)
    assert any(r.accepted < r.drafted for r in rounds)  # a rejection: the rule's other branch
    for r in rounds:
        assert r.p is None and r.p_argmax.shape == (r.drafted + 1,)
        emitted = list(r.emitted)
        assert emitted[:-1] == r.tokens[: r.accepted].tolist() == r.p_argmax[: r.accepted].tolist()
        assert emitted[-1] == int(r.p_argmax[r.accepted])
    sampled: list[Any] = []
    sd.generate(
        target, sd.DraftModel(draft), prompt, max_new_tokens=8, k=3, temperature=0.8, seed=1,
        eos_token_id=[], on_round=sampled.append,
    )  # fmt: skip
    assert all(r.p_argmax is None and r.p.shape == (r.drafted + 1, V) for r in sampled)
