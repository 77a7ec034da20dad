"""Speculative generation on tiny random Llama models: greedy identity, cache
consistency, the end-to-end output law, and bad input. p = target, q = draft.

The models are float64 so that batched and one-token forwards agree to ~1e-15
and greedy ties cannot flip between the two code paths.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import specdec_rs as sd
from specdec_rs.generate import Decoder
from specdec_rs.models import forward, layer_view, new_cache, tiny_llama
from specdec_rs.processors import SamplingConfig, logits_to_probs
from specdec_rs.reference import verify_batch_numpy

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


@pytest.mark.parametrize("name", DRAFTERS)
def test_greedy_output_equals_target_only_greedy(target: Any, draft: Any, name: str) -> None:
    make = drafters(target, draft)[name]
    accepted = 0
    for prompt in prompts(8):
        plain = sd.generate(target, None, prompt, max_new_tokens=24, temperature=0, eos_token_id=[])
        hf = target.generate(
            torch.tensor([prompt]),
            max_new_tokens=24,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
        assert plain.tokens == hf
        for k in range(1, 7):
            out = sd.generate(
                target, make(), prompt, max_new_tokens=24, k=k, temperature=0, eos_token_id=[]
            )
            assert out.tokens == plain.tokens, (prompt, k)
            assert out.rounds == sum(out.accepted_histogram)
            assert out.new_tokens == 24
            accepted += sum(out.accepted)
    assert accepted > 0  # the drafts were not all rejected: the accept path ran


@pytest.mark.parametrize("name", DRAFTERS)
def test_caches_match_a_fresh_forward_after_generation(target: Any, draft: Any, name: str) -> None:
    drafter = drafters(target, draft)[name]()
    config = SamplingConfig(temperature=1.0)
    decoder = Decoder(target, drafter, [3, 4, 5, 3, 4], config, seed=7)
    with torch.inference_mode():
        for r in range(12):
            decoder.append(decoder.step(k=1 + r % 5))
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


# ---- the end-to-end law of the first two new tokens ----------------------------------------
#
# A target with an 8-token vocabulary; the exact probability of each pair (a, b)
# after the prompt is p(a | prompt) p(b | prompt, a) with the processors applied.
# Each run generates 3 tokens (the first round drafts 2) and keeps the first two.
#
# Threshold: TV(empirical, exact) changes by at most 1/N when one run changes, so
# McDiarmid gives P(TV >= E[TV] + t) <= exp(-2 N t^2), and
# E[TV] <= 1/2 sum_i sqrt(p_i (1 - p_i) / N). With t = sqrt(ln(1/delta) / (2N)) and
# delta = 1e-6 an exact sampler fails with probability below 1e-6.

SMALL_V = 8
RUNS = 6000
DELTA = 1e-6
PROMPT = [2, 5, 3]


def tv_threshold(exact: np.ndarray, runs: int) -> float:
    noise = 0.5 * np.sqrt(exact * (1 - exact) / runs).sum()
    return float(noise + math.sqrt(math.log(1 / DELTA) / (2 * runs)))


def exact_pairs(model: Any, config: SamplingConfig) -> np.ndarray:
    with torch.inference_mode():
        first = logits_to_probs(
            forward(model, torch.tensor(PROMPT), new_cache(model), keep=1), config
        )[0]
        rows = []
        for a in range(SMALL_V):
            logits = forward(model, torch.tensor([*PROMPT, a]), new_cache(model), keep=1)
            rows.append(logits_to_probs(logits, config)[0])
    return (first[:, None] * torch.stack(rows)).double().numpy()


class Swerve:
    """An adversarial γ policy: after a round that kept all its drafts ask for 3,
    after one that rejected ask for none; γ depends on every past outcome."""

    name = "swerve"

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.k = 2

    def next_k(self) -> int:
        return self.k

    def observe(self, k: int, drafted: int, num_accepted: int) -> None:
        self.k = 3 if num_accepted == drafted else 0 if self.k else 1


def pair_counts(
    target: Any, make: Callable[[], sd.Drafter], config: SamplingConfig, setting: str = ""
) -> np.ndarray:
    counts = np.zeros((SMALL_V, SMALL_V))
    drafter = make()
    adaptive = setting.startswith("adaptive")
    for seed in range(RUNS):
        out = sd.generate(
            target,
            drafter,
            PROMPT,
            max_new_tokens=5 if adaptive else 3,
            k=Swerve() if adaptive else 2,
            temperature=config.temperature,
            top_k=config.top_k,
            top_p=config.top_p,
            seed=seed,
            eos_token_id=[],
        )
        counts[out.tokens[0], out.tokens[1]] += 1
    return counts


def buggy_verifier(variant: str) -> Callable[..., Any]:
    """`verify` with one of the reference's known bugs, e.g. resample_from_p."""

    def run(p: Any, q: Any, drafts: Any, seed: int, *, check: str = "read") -> Any:
        rng = np.random.default_rng(seed)
        tokens, n = verify_batch_numpy(
            p.double().numpy()[None], q.double().numpy()[None], drafts.numpy()[None], rng, variant
        )
        return tokens[0, : n[0]]

    return run


class UnprocessedQ(sd.DraftModel):
    """Bug: drafts drawn from the processed q, verified against softmax(raw logits)."""

    def propose(self, seq: Any, k: int, sampler: Any) -> sd.Draft:
        d = super().propose(seq, k, sampler)
        if len(d.tokens) == 0:
            return d
        with torch.inference_mode():
            logits = forward(
                self.model,
                torch.cat([seq, d.tokens[:-1]]),
                new_cache(self.model),
                keep=len(d.tokens),
            )
        return sd.Draft(d.tokens, torch.softmax(logits.float(), dim=-1))


Factory = Callable[[Any, Any], sd.Drafter]  # (target, draft model) -> drafter

# processors, the exact drafter, then the same run with a bug: a broken drafter or verifier
CONFIGS: dict[str, tuple[SamplingConfig, Factory, Factory, Any]] = {
    "temperature-1": (
        SamplingConfig(1.0),
        lambda t, d: sd.DraftModel(d),
        lambda t, d: sd.DraftModel(d),
        buggy_verifier("resample_from_p"),
    ),
    "early-exit-temperature-1": (
        SamplingConfig(1.0),
        lambda t, d: sd.EarlyExit(t, 1),
        lambda t, d: sd.EarlyExit(t, 1),
        buggy_verifier("greedy_check"),
    ),
    "adaptive-γ-temperature-1": (
        SamplingConfig(1.0),
        lambda t, d: sd.DraftModel(d),
        lambda t, d: sd.DraftModel(d),
        buggy_verifier("resample_from_p"),
    ),
    "t0.7-top-k-top-p": (
        SamplingConfig(0.7, top_k=4, top_p=0.9),
        lambda t, d: sd.DraftModel(d),
        lambda t, d: UnprocessedQ(d),
        None,
    ),
}


@pytest.fixture(scope="module")
def small() -> tuple[Any, Any]:
    t = tiny_llama(vocab_size=SMALL_V, hidden_size=16, num_layers=3, seed=3)
    d = tiny_llama(vocab_size=SMALL_V, hidden_size=16, num_layers=1, seed=4)
    return t, d


@pytest.mark.slow
@pytest.mark.parametrize("setting", CONFIGS)
def test_first_two_tokens_follow_the_target(
    small: tuple[Any, Any], setting: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    target, draft = small
    config, exact_drafter, broken_drafter, broken_verifier = CONFIGS[setting]
    exact = exact_pairs(target, config)
    threshold = tv_threshold(exact, RUNS)
    good = pair_counts(target, lambda: exact_drafter(target, draft), config, setting)
    tv_good = 0.5 * np.abs(good / RUNS - exact).sum()
    assert tv_good < threshold, f"exact decoder: TV {tv_good:.4f} >= {threshold:.4f}"
    if broken_verifier is not None:
        monkeypatch.setattr(sys.modules["specdec_rs.generate"], "verify", broken_verifier)
    bad = pair_counts(target, lambda: broken_drafter(target, draft), config, setting)
    tv_bad = 0.5 * np.abs(bad / RUNS - exact).sum()
    assert tv_bad > threshold, f"the bug went unnoticed: TV {tv_bad:.4f} <= {threshold:.4f}"


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
