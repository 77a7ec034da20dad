"""Batched generation (`specdec_rs.engine`): each row equals the same request
run alone with the same seed (bitwise on a GGUF target, whose kernels are
order-fixed; on the tiny float32 transformers Llama too, whose products run
over all rows at once: torch could sum them in another order for another
row count, which would show only at a near-tie), the power of that check
against a cache cut by another row's count, continuous batching, rows that
fail alone, cancelling, bad input, and the goodput policy's choices under
synthetic loads. p = target, q = draft.
The law of batched output is in test_batch_law.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import specdec_rs as sd
from specdec_rs import models
from specdec_rs.drafters.draft import Draft
from specdec_rs.engine import BatchEngine, Request
from specdec_rs.engine.engine import MAX_ROWS
from specdec_rs.engine.profile import profile_forward
from specdec_rs.policy import ForwardProfile, Goodput
from specdec_rs.policy.goodput import BatchRow as Row

torch = pytest.importorskip("torch")
V = 64


@pytest.fixture(scope="module")
def tiny() -> Any:
    return models.tiny_llama(vocab_size=V, hidden_size=64, num_layers=2, seed=1)


@pytest.fixture(
    scope="module",
    params=[("f32", "f32"), ("q8", "f32"), ("q8", "f16"), ("q8", "q8_0")],
    ids=["f32", "q8", "q8-f16cache", "q8-q8cache"],
)
def gguf(
    tiny: Any, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Any:
    """A GGUF target with float32 or q8 activations and a float32, float16
    or q8_0 cache (each exact by itself; q8_0: a tiny model with heads of
    32, its block)."""
    from specdec_rs.gguf import load_gguf
    from specdec_rs.gguf.writer import write_llama

    activations, cache_type = request.param
    if cache_type == "q8_0":
        tiny = models.tiny_llama(vocab_size=V, hidden_size=128, num_layers=2, seed=1)
    path = Path(tmp_path_factory.mktemp("batch")) / "tiny.gguf"
    write_llama(tiny, path, linear_type="Q4_1", embed_type="Q8_0")
    return load_gguf(path, tokenizer=False, activations=activations, cache_type=cache_type)[0]


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(2, V, (n,), generator=g).tolist() for n in (5, 9, 3, 12, 7)]


# (temperature, top_k, top_p, k, max_new_tokens, eos) per request: mixed settings
MIXED = (
    (1.0, None, None, 3, 16, []),
    (0.0, None, None, 2, 12, []),
    (0.7, 8, 0.9, 0, 10, []),
    (0.9, None, 0.95, 4, 16, [7, 11]),
    (1.0, None, None, None, 14, []),
)


def requests(seed: int = 5) -> list[Request]:
    return [
        Request(p, n, t, top_k, top_p, seed=seed + i, eos_token_id=eos, k=k)
        for i, (p, (t, top_k, top_p, k, n, eos)) in enumerate(zip(prompts(), MIXED, strict=True))
    ]


def alone(target: Any, r: Request, k: int) -> Any:
    """The request through `generate` (a row of k = 0 runs as target-only)."""
    k = r.k if r.k is not None else k
    return sd.generate(
        target,
        sd.PromptLookup() if k else None,
        r.prompt,
        max_new_tokens=r.max_new_tokens,
        k=max(k, 1),
        temperature=r.temperature,
        top_k=r.top_k,
        top_p=r.top_p,
        seed=r.seed,
        eos_token_id=r.eos_token_id,
    )


@pytest.mark.parametrize("which", ["gguf", "float32"])
def test_each_row_equals_the_same_request_alone(which: str, tiny: Any, gguf: Any) -> None:
    """Five requests of mixed settings (k = 0..4, greedy, top-k/top-p, EOS)
    through 2 slots: rows join as others finish; every row's tokens equal
    the request run alone with `generate` and the same seed, bit for bit."""
    target = gguf if which == "gguf" else tiny
    engine = BatchEngine(target, sd.PromptLookup, max_batch=2, k=2)
    assert engine.path == ("gguf" if which == "gguf" else "llama")
    out = engine.run(requests())
    assert max(s.rows for s in out.steps) == 2 and len(out.rows) == 5
    for r, f in zip(requests(), out.rows, strict=True):
        assert f.result is not None, f.error
        solo = alone(target, r, 2)
        assert f.result.tokens == solo.tokens
        assert f.result.k_per_round == solo.k_per_round
        assert f.result.seed == r.seed
    assert out.new_tokens == sum(len(f.result.tokens) for f in out.rows if f.result)
    assert engine.active == 0 and engine.queued == 0


class CrossCrop(BatchEngine):
    """Bug: every row's cache is cut by the accepted count of the round's
    first row, not its own."""

    def _round(self) -> None:
        self.first: int | None = None
        super()._round()

    def _settle(self, row: Any, pending: Any, logits: Any, hidden: Any, target_s: float) -> Any:
        before = len(row.decoder.seq)
        r = super()._settle(row, pending, logits, hidden, target_s)
        if self.first is None:
            self.first = r.accepted
        for layer in row.decoder.cache.layers:  # the forward wrote before + r.drafted entries
            layer.length = before + min(self.first, r.drafted)
        return r


def test_the_identity_check_catches_a_cache_cut_by_another_row(gguf: Any) -> None:
    """Power of the per-row identity check: with a draft model (drafts every
    round, rows keep different counts) a cross-row crop parts some row from
    its lone run; the exact engine keeps all rows."""
    draft = models.tiny_llama(vocab_size=V, hidden_size=32, num_layers=1, seed=2)
    rs = [Request(p, 12, 1.0, seed=9 + i, eos_token_id=[], k=3) for i, p in enumerate(prompts())]
    alone_tokens = [
        sd.generate(
            gguf, sd.DraftModel(draft), r.prompt, max_new_tokens=12, k=3, temperature=1.0,
            seed=r.seed, eos_token_id=[],
        ).tokens
        for r in rs
    ]  # fmt: skip
    for engine, parts in ((BatchEngine, False), (CrossCrop, True)):
        out = engine(gguf, lambda: sd.DraftModel(draft), max_batch=3).run(rs)
        same = [
            f.result is not None and f.result.tokens == a
            for f, a in zip(out.rows, alone_tokens, strict=True)
        ]
        assert (not all(same)) == parts, (engine.__name__, same)


def test_generate_batch_seeds_rows_from_one_seed(gguf: Any) -> None:
    """generate_batch(seed=s): prompt i gets seed s + i, target-only rows too."""
    out = sd.generate_batch(gguf, None, prompts(), max_new_tokens=8, seed=40, temperature=1.0)
    for i, p in enumerate(prompts()):
        solo = sd.generate(gguf, None, p, max_new_tokens=8, seed=40 + i, temperature=1.0)
        assert out.rows[i].result is not None and out.rows[i].result.tokens == solo.tokens


def test_the_goodput_policy_keeps_greedy_output(gguf: Any) -> None:
    """γ chosen by the load each round: the greedy tokens are target-only greedy."""
    profile = ForwardProfile({(b, n): 1.0 + 0.1 * n for b in (1, 2, 4) for n in range(1, 6)})
    policy = Goodput(k_max=4, profile=profile, probe=2)
    out = sd.generate_batch(
        gguf,
        sd.PromptLookup,
        prompts(),
        max_new_tokens=12,
        goodput=policy,
        temperature=0,
        max_batch=4,
        eos_token_id=[],
    )
    decoding = [s for s in out.steps if s.rows]
    assert all(s.ks is not None and len(s.ks) == s.rows for s in decoding)  # a γ per row
    assert any(any(s.ks or ()) for s in decoding)  # and some rounds drafted
    assert out.predicted_goodput is not None and out.predicted_goodput > 0
    for i, p in enumerate(prompts()):
        plain = sd.generate(gguf, None, p, max_new_tokens=12, temperature=0, eos_token_id=[])
        assert out.rows[i].result is not None and out.rows[i].result.tokens == plain.tokens


class BadAfter:
    """A lookup drafter that proposes an id outside the vocabulary from its
    `after`-th proposal on."""

    name = "bad-after"

    def __init__(self, after: int):
        self.inner, self.after, self.calls = sd.PromptLookup(), after, 0

    def start(self, seq: Any, cache: Any, hidden: Any) -> None:
        self.inner.start(seq, cache, hidden)

    def propose(self, seq: Any, k: int, sampler: Any) -> Any:
        self.calls += 1
        if self.calls > self.after:
            return Draft(torch.tensor([V + 5]), torch.full((1, V), 1.0 / V))
        return self.inner.propose(seq, k, sampler)

    def update(self, seq: Any, num_accepted: int, hidden: Any) -> None:
        self.inner.update(seq, num_accepted, hidden)


def test_a_row_whose_drafter_fails_fails_alone(gguf: Any) -> None:
    made = iter([sd.PromptLookup(), BadAfter(2), sd.PromptLookup()])
    out = sd.generate_batch(
        gguf,
        lambda: next(made),
        prompts()[:3],
        max_new_tokens=10,
        temperature=0.8,
        seed=1,
        eos_token_id=[],
    )
    bad = out.rows[1]
    assert bad.result is None and bad.error is not None
    assert "request 1" in bad.error and f"[0, {V})" in bad.error
    for i in (0, 2):
        solo = sd.generate(
            gguf,
            sd.PromptLookup(),
            prompts()[i],
            max_new_tokens=10,
            k=4,
            temperature=0.8,
            seed=1 + i,
            eos_token_id=[],
        )
        assert out.rows[i].result is not None and out.rows[i].result.tokens == solo.tokens


def test_cancel_frees_the_row_and_the_queue(gguf: Any) -> None:
    engine = BatchEngine(gguf, sd.PromptLookup, max_batch=2)
    ids = [engine.submit(r) for r in requests()]
    engine.step()
    assert engine.active == 2 and engine.queued == 3
    assert engine.cancel(ids[0]) and engine.cancel(ids[4])
    assert engine.active == 1 and engine.queued == 2
    assert not engine.cancel(ids[0]) and not engine.cancel(999)
    finished = []
    while engine.active or engine.queued:
        finished += engine.step()
    assert sorted(f.id for f in finished) == [1, 2, 3]


@pytest.mark.parametrize(
    "prompt, words",
    [
        ([], ["prompt 1", "non-empty prompt"]),
        ("hello", ["prompt 1", "is a str"]),
        ([[1, 2], [3, 4]], ["prompt 1", "batch size 2"]),
        ([1, V + 3], ["prompt 1", f"outside [0, {V})"]),
        ([1] * 1020, ["prompt 1", "past the model's context of 1024"]),
    ],
)
def test_bad_prompts_name_their_row(gguf: Any, prompt: Any, words: list[str]) -> None:
    with pytest.raises(ValueError) as e:
        sd.generate_batch(gguf, None, [[3, 4, 5], prompt], max_new_tokens=8)
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"max_batch": 0}, ["max_batch"]),
        ({"max_batch": MAX_ROWS + 1}, ["max_batch", str(MAX_ROWS)]),
        ({"k": -1}, ["k = -1"]),
        ({"goodput": 3}, ["goodput is a int", "policy.Goodput"]),
        ({"vocab_size": V + 1}, [f"vocab_size = {V + 1}", f"only {V} rows"]),
    ],
)
def test_bad_engine_options(gguf: Any, kwargs: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(ValueError) as e:
        sd.generate_batch(gguf, None, [[3, 4, 5]], max_new_tokens=4, **kwargs)
    for w in words:
        assert w in str(e.value)


def test_the_cache_capacity_bounds_the_batch(gguf: Any) -> None:
    """A request over the cache alone is refused naming it; max_batch rows
    over it are refused before any work; an engine whose cache fits two rows
    runs two at a time (the others wait), each row still its lone output."""
    with pytest.raises(
        ValueError, match=r"request 0 needs 13 cache positions.*cache_positions = 12"
    ):
        BatchEngine(gguf, None, cache_positions=12).submit(Request([1, 2, 3], 10))
    with pytest.raises(ValueError, match=r"max_batch = 3 rows of these prompts need up to 39"):
        sd.generate_batch(gguf, None, [[1, 2, 3]] * 3, max_new_tokens=10, max_batch=3,
                          cache_positions=30)  # fmt: skip
    rs = requests()
    two = sum(sorted(len(r.prompt) + r.max_new_tokens for r in rs)[-2:])
    engine = BatchEngine(gguf, sd.PromptLookup, max_batch=4, k=2, cache_positions=two)
    out = engine.run(rs)
    assert max(s.rows for s in out.steps) == 2
    for r, f in zip(rs, out.rows, strict=True):
        assert f.result is not None and f.result.tokens == alone(gguf, r, 2).tokens


def test_empty_and_wrong_prompt_lists(gguf: Any) -> None:
    with pytest.raises(ValueError, match="prompts is empty"):
        sd.generate_batch(gguf, None, [], max_new_tokens=4)
    with pytest.raises(ValueError, match="list of prompts"):
        sd.generate_batch(gguf, None, "text", max_new_tokens=4)
    with pytest.raises(ValueError, match="pass an engine.Request"):
        BatchEngine(gguf, None).submit([1, 2, 3])  # type: ignore[arg-type]


# ---- the goodput policy --------------------------------------------------------------


class FakeRound:
    """What `Goodput.observe` reads of a `Round`."""

    def __init__(
        self,
        asked: int,
        accepted: int,
        drafted: int | None = None,
        *,
        draft_s: float = 0.0,
        verify_s: float = 0.0,
    ):
        self.asked, self.accepted, self.tree = asked, accepted, False
        self.drafted = asked if drafted is None else drafted
        self.draft_s, self.verify_s, self.positions = draft_s, verify_s, self.drafted + 1
        self.forced, self.forced_drafts = False, 0

    def drafters_part(self) -> FakeRound:
        return self


def trained(policy: Goodput, rows: int, *accepts: int, rounds: int = 40) -> list[Row]:
    """`rows` rows whose rounds at γ = k_max keep accepts[0], accepts[1], ...
    drafts in turn."""
    out = [Row(i) for i in range(rows)]
    for r in out:
        policy.join(r.id)
    for i in range(rounds):
        kept = accepts[i % len(accepts)]
        policy.observe([(r.id, FakeRound(policy.k_max, kept)) for r in out], rows, 0.0)
    return out


def ks(choice: Any) -> list[int]:
    return list(choice.ks.values())


def memory_bound() -> ForwardProfile:
    """T(B, n) = 1 + 0.05·B·n: a wide pass costs little more than one position."""
    return ForwardProfile({(b, n): 1.0 + 0.05 * b * n for b in (1, 8, 64) for n in range(1, 6)})


def test_goodput_speculates_at_a_small_batch_and_stops_at_a_large_one() -> None:
    """The same acceptance (the first draft kept in half the rounds, no
    other): one draft at B = 1, where T(1, 2) = 1.05·T(1, 1); none at
    B = 64, where T(64, 2) = 1.76·T(64, 1) costs more than the 1.5 tokens
    a round then emits."""
    small = Goodput(k_max=4, profile=memory_bound(), hysteresis=0.0, prior=0.0)
    assert ks(small.choose(trained(small, 1, 0, 1))) == [1]
    large = Goodput(k_max=4, profile=memory_bound(), hysteresis=0.0, prior=0.0)
    assert ks(large.choose(trained(large, 64, 0, 1))) == [0] * 64


def test_goodput_predicts_tokens_over_cost() -> None:
    policy = Goodput(k_max=4, profile=memory_bound(), prior=0.0)
    rows = trained(policy, 8, 4)  # every draft kept
    # E = k + 1 per row; C = T(8, k + 1) (no drafting or verification time)
    for k in range(5):
        assert policy.predicted([r.id for r in rows], k) == pytest.approx(
            8 * (k + 1) / (1.0 + 0.05 * 8 * (k + 1))
        )


def test_goodput_costs_a_ragged_batch_by_the_drafts_proposed() -> None:
    """A drafter that proposes one draft of the two asked (all kept) adds
    one position per row, not two: T(B, 1 + 2·½), by interpolation."""
    policy = Goodput(k_max=2, profile=memory_bound(), prior=0.0)
    rows = [Row(i) for i in range(8)]
    for r in rows:
        policy.join(r.id)
    for _ in range(30):
        policy.observe([(r.id, FakeRound(2, 1, drafted=1)) for r in rows], 8, 0.0)
    assert policy.fill(0) == pytest.approx(0.5)
    ids = [r.id for r in rows]
    assert policy.predicted(ids, 2) == pytest.approx(8 * 2 / (1.0 + 0.05 * 8 * 2), rel=1e-3)


def test_goodput_gives_each_row_its_own_gamma() -> None:
    """Two rows beside each other: one whose drafts are all kept gets
    k_max, one whose drafts are never kept gets none (a batch-wide γ
    would pay the second row's positions for nothing, or starve the first)."""
    policy = Goodput(k_max=4, profile=memory_bound(), hysteresis=0.0, prior=0.0)
    good, bad = Row(0), Row(1)
    for r in (good, bad):
        policy.join(r.id)
    for _ in range(40):
        policy.observe([(0, FakeRound(4, 4)), (1, FakeRound(4, 0))], 2, 0.0)
    assert policy.choose([good, bad]).ks == {0: 4, 1: 0}
    rates = [policy.predicted([0, 1], k) for k in range(5)]
    mixed = policy.evaluate([policy.view(0), policy.view(1)], [4, 0])
    assert mixed[0] / mixed[1] > max(rates)  # it beats every uniform γ


def convex() -> ForwardProfile:
    """T(1, n) = 1 + 0.02·(n - 1)² (cheap for a few positions, dear for many)."""
    return ForwardProfile({(1, n): 1.0 + 0.02 * (n - 1) ** 2 for n in range(1, 8)})


def test_goodput_prices_a_bursty_drafter_by_the_rounds_it_drafts() -> None:
    """A drafter that proposes all 6 drafts asked (all kept) in half the
    rounds and nothing in the others: a round costs ½·T(1, 1) + ½·T(1, 7),
    not T(1, 4) at its mean positions, and its drafting rate is ½, its
    fill (when it drafts) 1."""
    policy = Goodput(k_max=6, profile=convex(), prior=0.0)
    policy.join(0)
    for i in range(200):
        policy.observe([(0, FakeRound(6, 6 if i % 2 else 0, 6 if i % 2 else 0))], 1, 0.0)
    view = policy.view(0)
    assert view.drafting == pytest.approx(0.5, abs=0.02) and view.fill == 1.0
    tokens, seconds = policy.evaluate([view], [6])
    assert tokens == pytest.approx(1 + 6 * view.drafting, rel=0.02)
    r = view.drafting
    assert seconds == pytest.approx((1 - r) * 1.0 + r * (1.0 + 0.02 * 36))
    mean_priced = convex().seconds(1, 1 + 6 * r)
    assert seconds > 1.1 * mean_priced  # the average would underprice it


def test_goodput_counts_a_drafters_cost_at_gamma_zero() -> None:
    """A drafter whose update costs 0.2 s a row every round, drafting or
    not (verify_s at one position), and drafting 0.1 s + 0.05 s a draft:
    C(0) carries the update, C(k) the line fitted to the drafting seconds."""
    flat = ForwardProfile({(b, n): 1.0 for b in (1, 2) for n in range(1, 5)})
    policy = Goodput(k_max=3, profile=flat, prior=0.0)
    for rid in (0, 1):
        policy.join(rid)
    for i in range(60):
        k = i % 4
        rounds = [(rid, FakeRound(k, 0, draft_s=0.1 + 0.05 * k if k else 0.0, verify_s=0.2))
                  for rid in (0, 1)]  # fmt: skip
        policy.observe(rounds, 2, 0.0)
    views = [policy.view(0), policy.view(1)]
    assert policy.evaluate(views, [0, 0])[1] == pytest.approx(1.0 + 2 * 0.2)
    assert policy.evaluate(views, [3, 3])[1] == pytest.approx(1.0 + 2 * (0.2 + 0.1 + 0.15))


def test_goodput_learns_nothing_of_the_drafter_from_a_grammars_forced_drafts() -> None:
    """A row whose drafter keeps none of its 4 drafts, between rounds a
    grammar forced (4 drafts, all kept, no drafting time) and rounds with a
    forced tail after the drafter's 2 drafts: the policy's view of the row
    (acceptance, drafting rate and fill) and its drafting cost are those of
    the drafter's own drafts alone, and it asks the row for none."""
    from specdec_rs.rounds import Round
    from specdec_rs.structured.constraint import FORCED_SOURCE

    def round_(asked: int, kept: int, draft_s: float, forced: int = 0, source: Any = None) -> Round:
        return Round(
            0, asked, asked, asked, kept, tuple(range(kept + 1)), source, False,
            draft_s, 1.0, 0.0, asked + 1, forced_drafts=forced,
        )  # fmt: skip

    plain = Goodput(k_max=4, profile=memory_bound(), hysteresis=0.0, prior=0.0)
    mixed = Goodput(k_max=4, profile=memory_bound(), hysteresis=0.0, prior=0.0)
    for policy in (plain, mixed):
        policy.join(0)
    for _ in range(40):
        plain.observe([(0, round_(4, 0, 0.1))], 1, 0.0)
        plain.observe([(0, round_(2, 0, 0.05))], 1, 0.0)
        mixed.observe([(0, round_(4, 0, 0.1))], 1, 0.0)
        mixed.observe([(0, round_(4, 4, 0.0, 4, FORCED_SOURCE))], 1, 0.0)
        mixed.observe([(0, round_(4, 0, 0.05, 2))], 1, 0.0)  # 2 drafts rejected, a tail of 2
    assert mixed.view(0) == plain.view(0)
    assert mixed.drafting_s.__dict__ == plain.drafting_s.__dict__
    assert mixed.choose([Row(0)]).ks == plain.choose([Row(0)]).ks == {0: 0}


def test_goodput_hysteresis_and_probe() -> None:
    flat = ForwardProfile({(b, n): 1.0 for b in (1, 2) for n in range(1, 4)})
    policy = Goodput(k_max=2, profile=flat, hysteresis=10.0)  # nothing beats the current γ by 10×
    rows = trained(policy, 2, 2)
    assert ks(policy.choose(rows)) == [2, 2]  # the first round takes the model's choice
    for r in rows:
        policy.rows[r.id].k = 1  # as if the batch had settled at γ = 1
    assert ks(policy.choose(rows)) == [1, 1] and policy.k == 1
    assert policy.report().switches == 0
    off = Goodput(k_max=2, profile=memory_bound_steep(), probe=3, probe_k=2)
    rows = trained(off, 2, 0)  # nothing kept: γ = 0, probes after 3, then 6, then 12 rounds
    chosen = [ks(off.choose(rows)) for _ in range(21)]
    assert off.k == 0 and [i + 1 for i, k in enumerate(chosen) if any(k)] == [3, 9, 21]
    assert {k for c in chosen for k in c} == {0, 2}
    report = off.report()
    assert report.probes == 6 and report.rounds == 21
    assert report.rows_by_k == (2 * 21 - 6, 0, 6)


def test_goodput_trusts_the_rounds_it_measured_over_its_model() -> None:
    """The model rates γ = 4 at 5 / 1.05... tokens per second a row; the
    rounds run there measure a fifth of it. After `MEASURED` such rounds
    the measured ratio rescales every drafting vector (not all rows off),
    and the policy's next optimisation turns speculation off."""
    from specdec_rs.policy.goodput import MEASURED, REPLAN

    policy = Goodput(k_max=4, profile=memory_bound(), hysteresis=0.0, prior=0.0)
    rows = trained(policy, 1, 4)
    first = policy.choose(rows)
    assert ks(first) == [4]
    for i in range(MEASURED):
        choice = policy.choose(rows)
        assert ks(choice) == [4], i  # the model's choice until the measured ratio counts
        policy.observe([(0, FakeRound(4, 4))], 1, 0.0, choice=choice, tokens=5,
                       seconds=5 * choice.seconds / choice.tokens / 0.2)  # fmt: skip
    after = [ks(policy.choose(rows)) for _ in range(REPLAN)]  # the next optimisation
    assert after[-1] == [0], after
    assert policy.report().measured == pytest.approx(0.2 * first.tokens / first.seconds)


def memory_bound_steep() -> ForwardProfile:
    return ForwardProfile({(b, n): float(b * n) for b in (1, 2) for n in range(1, 4)})


def test_goodput_corrects_the_profile_by_the_measured_rounds() -> None:
    """Rounds whose forward takes twice the profiled time at 3 positions
    per row double T there (and for sizes nearest it), not elsewhere."""
    policy = Goodput(k_max=4, profile=memory_bound())
    rows = trained(policy, 8, 2)
    before = policy.forward_seconds(8, 3)
    rounds = [(r.id, FakeRound(2, 1)) for r in rows]  # 3 positions a row
    for _ in range(60):
        policy.observe(rounds, 8, 2.0 * memory_bound().seconds(8, 3))
    assert policy.forward_seconds(8, 3) == pytest.approx(2 * before, rel=1e-3)
    assert policy.forward_seconds(8, 3.2) == pytest.approx(
        2 * memory_bound().seconds(8, 3.2), rel=1e-3
    )


def test_forward_profiles_interpolate_and_refuse_bad_tables() -> None:
    p = ForwardProfile({(1, 1): 1.0, (1, 2): 2.0, (4, 1): 4.0, (4, 2): 6.0})
    assert p.seconds(2, 1) == pytest.approx(2.0) and p.seconds(4, 2) == 6.0
    assert p.v(4, 2) == pytest.approx(1.5)
    assert ForwardProfile.from_json(p.to_json()) == p
    # a second grid at a longer context: linear in the context between them
    both = ForwardProfile({(1, 1): 1.0, (1, 2): 2.0}, 100, {(1, 1): 3.0, (1, 2): 6.0}, 300)
    assert both.seconds(1, 2, 200) == pytest.approx(4.0) and both.seconds(1, 2) == 2.0
    assert ForwardProfile.from_json(both.to_json()) == both
    with pytest.raises(ValueError, match="longer context"):
        ForwardProfile({(1, 1): 1.0}, 100, {(1, 1): 2.0}, 50)
    with pytest.raises(ValueError, match="full grid"):
        ForwardProfile({(1, 1): 1.0, (2, 2): 1.0})
    with pytest.raises(ValueError, match="T > 0"):
        ForwardProfile({(1, 1): 0.0})
    with pytest.raises(ValueError, match="not a forward profile"):
        ForwardProfile.from_json({"table": [[1, "x"]]})


def test_the_engine_measures_its_forward(gguf: Any) -> None:
    engine = BatchEngine(gguf, None, max_batch=3)
    p = profile_forward(engine, [1, 3], context=8, long_context=64, repeats=1, cached=False)
    assert p.batch_sizes == [1, 2, 3] and p.positions == [1, 3]
    assert all(t > 0 for t in [*p.table.values(), *p.long.values()])
    assert (p.context, p.long_context) == (8, 64) and set(p.long) == set(p.table)
    with pytest.raises(ValueError, match="long_context = 8 must exceed context = 8"):
        profile_forward(engine, [1], context=8, long_context=8, cached=False)


def test_the_profile_is_measured_once_and_read_from_the_cache_folder(
    gguf: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cached=True writes cache_dir()/forward-profiles/<key>.json (the folder
    made if missing) and the next call reads it without a forward; a damaged
    file is measured again and replaced."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    engine = BatchEngine(gguf, None, max_batch=2)
    forwards = []
    measure = engine.forward_blocks
    monkeypatch.setattr(
        engine, "forward_blocks", lambda *a, **kw: forwards.append(1) or measure(*a, **kw)
    )
    first = profile_forward(engine, [1, 3], context=8, long_context=16, repeats=1)
    (written,) = (tmp_path / "cache" / "forward-profiles").iterdir()
    measured = len(forwards)
    assert measured > 0 and ForwardProfile.from_json(json.loads(written.read_text())) == first
    assert profile_forward(engine, [1, 3], context=8, long_context=16, repeats=1) == first
    assert len(forwards) == measured  # read, not measured
    written.write_text("{not json")
    again = profile_forward(engine, [1, 3], context=8, long_context=16, repeats=1)
    assert len(forwards) == 2 * measured and again.batch_sizes == [1, 2]
    assert ForwardProfile.from_json(json.loads(written.read_text())) == again


# ---- bounds (issue: hardening) -----------------------------------------------------------
def test_the_profile_follows_the_work_not_max_batch(gguf: Any) -> None:
    """Its rows stop at 64, and at what the cache holds at the longer context."""
    from specdec_rs.engine.profile import MAX_PROFILE_ROWS

    engine = BatchEngine(gguf, None, max_batch=MAX_ROWS, cache_positions=10 * (64 + 3))
    p = profile_forward(engine, [1, 3], context=8, long_context=64, repeats=1, cached=False)
    assert max(p.batch_sizes) == 10 and p.batch_sizes == [1, 2, 4, 8, 10]
    wide = BatchEngine(gguf, None, max_batch=MAX_ROWS)
    p = profile_forward(wide, [1], context=8, long_context=0, repeats=1, cached=False)
    assert max(p.batch_sizes) == MAX_PROFILE_ROWS
    small = BatchEngine(gguf, None, max_batch=4, cache_positions=40)
    with pytest.raises(ValueError, match="needs 67 cache positions"):
        profile_forward(small, [1, 3], context=8, long_context=64, repeats=1, cached=False)


def test_generate_batch_holds_no_more_rows_than_requests(gguf: Any) -> None:
    policy = Goodput(k_max=2)
    out = sd.generate_batch(
        gguf, sd.PromptLookup, prompts()[:3], max_new_tokens=4, max_batch=MAX_ROWS,
        goodput=policy, seed=0,
    )  # fmt: skip
    assert policy.profile is not None and max(policy.profile.batch_sizes) == 3
    assert all(f.result is not None for f in out.rows)


def test_an_engine_outside_run_keeps_no_rounds(gguf: Any) -> None:
    engine = BatchEngine(gguf, sd.PromptLookup, max_batch=2, k=2)
    for p in prompts():
        engine.submit(Request(p, 6, 0.0))
    while engine.active or engine.queued:
        engine.step()
    assert engine.steps is None  # a server's engine steps forever: nothing accumulates
    out = engine.run([Request(p, 4, 0.0) for p in prompts()[:2]])
    assert len(out.steps) > 0 and engine.steps is None


@pytest.mark.parametrize(
    ("budget", "says"),
    [("8", "max_new_tokens"), (None, "max_new_tokens"), (2.5, "max_new_tokens"), (0, ">= 1")],
)
def test_bad_requests_name_their_row_before_any_work(gguf: Any, budget: Any, says: str) -> None:
    rows = [Request([3, 4, 5], 4), Request([3, 4], budget)]
    with pytest.raises(ValueError) as e:
        sd.generate_batch(gguf, None, [], max_new_tokens=4, requests=rows, goodput=Goodput())
    assert "prompt 1" in str(e.value) and says in str(e.value), e.value
    with pytest.raises(ValueError, match="non-empty list"):
        sd.generate_batch(gguf, None, [], max_new_tokens=4, requests=[])


def test_row_i_takes_seed_plus_i_up_to_2_64(gguf: Any) -> None:
    seed = 2**63 + 5  # past 2^63: rows were reduced mod 2^63
    out = sd.generate_batch(gguf, None, prompts()[:2], max_new_tokens=6, seed=seed)
    alone = sd.generate(gguf, None, prompts()[1], max_new_tokens=6, seed=seed + 1)
    assert out.rows[1].result is not None and out.rows[1].result.tokens == alone.tokens
    with pytest.raises(ValueError, match="passes 2\\^64 - 1"):
        sd.generate_batch(gguf, None, prompts()[:2], max_new_tokens=6, seed=2**64 - 1)


# ---- chunked prefill: prompts prefilled inside the rounds, beside running rows


def long_prompts() -> list[list[int]]:
    """Prompts around the chunk sizes below, one past the Rust block (CHUNK)."""
    g = torch.Generator().manual_seed(3)
    return [torch.randint(2, V, (n,), generator=g).tolist() for n in (40, 3, 300, 9, 1, 70, 5)]


def chunked_requests(temperature: float) -> list[Request]:
    return [
        Request(p, 10, temperature, seed=20 + i, eos_token_id=[], k=2)
        for i, p in enumerate(long_prompts())
    ]


class Recording(BatchEngine):
    """The engine, recording each round's (decoding rows, prefill pieces' lengths)."""

    def _prefill_pieces(self, prefilling: Any, ready: Any) -> Any:
        pieces = super()._prefill_pieces(prefilling, ready)
        self.seen = [*getattr(self, "seen", []), (len(ready), [len(t) for _, _, t in pieces])]
        return pieces


@pytest.mark.parametrize("chunk", [1, 7, 64])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_rows_prefilled_in_chunks_equal_the_request_alone(
    gguf: Any, chunk: int, temperature: float
) -> None:
    """Seven prompts of 1..300 tokens through 3 slots, each prefilled in
    pieces of at most `chunk` tokens inside rounds where other rows decode
    and verify: every row's tokens equal the request alone (greedy, and
    sampled with a fixed k and seed), bit for bit; pieces rode beside
    decoding rows, and several rows prefilled in one round."""
    engine = Recording(gguf, sd.PromptLookup, max_batch=3, k=2, prefill_chunk=chunk)
    assert engine.chunked
    out = engine.run(chunked_requests(temperature))
    for r, f in zip(chunked_requests(temperature), out.rows, strict=True):
        assert f.result is not None, f.error
        assert f.result.tokens == alone(gguf, r, 2).tokens
    beside = [pieces for ready, pieces in engine.seen if ready and pieces]
    assert beside and all(sum(p) <= chunk for p in beside)
    assert any(len(pieces) >= 2 for _, pieces in engine.seen)
    assert sum(s.prefill for s in out.steps) == sum(len(p) - 1 for p in long_prompts())


class Ordering(BatchEngine):
    """The engine, recording the request ids of each round's prefill pieces, in order."""

    def _prefill_pieces(self, prefilling: Any, ready: Any) -> Any:
        pieces = super()._prefill_pieces(prefilling, ready)
        self.order = [*getattr(self, "order", []), [row.id for _, row, _ in pieces]]
        return pieces


@pytest.mark.parametrize(("order", "first"), [("shortest", [1, 0, 2]), ("fifo", [0, 1, 2])])
def test_the_prefill_order_picks_which_prompts_go_first(
    gguf: Any, order: str, first: list[int]
) -> None:
    """Prompts of 40, 3 and 300 tokens join at once (the first round's budget
    takes all of the two short ones): "shortest" prefills the 3-token prompt
    first, "fifo" the oldest request; either way each row's tokens equal
    the request alone."""
    rs = chunked_requests(0.8)[:3]
    engine = Ordering(gguf, sd.PromptLookup, max_batch=3, k=2, prefill_chunk=7, prefill_order=order)
    out = engine.run(rs)
    assert engine.order[0] == first
    for r, f in zip(rs, out.rows, strict=True):
        assert f.result is not None and f.result.tokens == alone(gguf, r, 2).tokens


def test_prefill_rank_orders_a_burst_shortest_first_and_ages_the_rest() -> None:
    """`prefill_rank`: rows that waited alike go fewest tokens left first
    (ties to the older request); a row being prefilled keeps its turn over
    an equal one that waited for it; a long prompt that has waited twice
    its length goes before a short one that just joined; "fifo" is the
    request order."""
    from specdec_rs.engine.scheduler import prefill_rank

    def ranked(order: str, rows: list[tuple[int, int, int]]) -> list[int]:
        return [r[0] for r in sorted(rows, key=lambda r: prefill_rank(order, *r))]

    burst = [(0, 300, 0), (1, 3, 0), (2, 40, 0), (3, 3, 0)]  # (id, left, waited)
    assert ranked("shortest", burst) == [1, 3, 2, 0]
    assert ranked("fifo", burst) == [0, 1, 2, 3]
    assert ranked("shortest", [(0, 84, 0), (1, 100, 16)]) == [0, 1]
    assert ranked("shortest", [(0, 300, 600), (1, 8, 0)]) == [0, 1]
    assert ranked("shortest", [(0, 300, 580), (1, 8, 0)]) == [1, 0]


def test_an_unknown_prefill_order_is_a_value_error(gguf: Any) -> None:
    with pytest.raises(ValueError, match="prefill_order.*fifo"):
        BatchEngine(gguf, None, prefill_order="longest")


def prefilled_at(rank: Any, rounds: int = 400) -> int | None:
    """Rounds of 8 prompt tokens, a 200-token prompt waiting at the start
    and an 8-token one joining every round, ranked by `rank(id, left,
    waited)` as the engine does: the round the long prompt finishes (None:
    not within `rounds`)."""
    rows = {0: [200, 0]}  # id: [left, waited]
    for t in range(rounds):
        rows[t + 1] = [8, 0]
        budget, took = 8, {}
        for rid in sorted(rows, key=lambda r: rank(r, *rows[r])):
            if budget == 0:
                break
            took[rid] = min(budget, rows[rid][0])
            budget -= took[rid]
        given = sum(took.values())
        for rid in list(rows):
            rows[rid][1] += given - took.get(rid, 0)
            rows[rid][0] -= took.get(rid, 0)
            if rows[rid][0] == 0:
                del rows[rid]
                if rid == 0:
                    return t
    return None


def test_a_long_prompt_is_not_starved_by_later_short_ones() -> None:
    """Short prompts joining as fast as the rounds prefill them (an
    overloaded queue that grows without bound): under "shortest" the long
    prompt's key falls by half of every piece it waits for, so it waits at
    most 2 x 200 tokens (50 rounds), then keeps its turn: done by round 75
    (73, deterministic); ranked by the tokens left alone (the power check:
    no aging) it is never done while they keep coming; "fifo" finishes it
    first (its own 25 rounds)."""
    from specdec_rs.engine.scheduler import prefill_rank

    shortest = prefilled_at(lambda rid, left, waited: prefill_rank("shortest", rid, left, waited))
    assert shortest is not None and shortest <= 75
    assert prefilled_at(lambda rid, left, waited: (left, rid)) is None
    fifo = prefilled_at(lambda rid, left, waited: prefill_rank("fifo", rid, left, waited))
    assert fifo is not None and fifo <= 25


def test_the_chunk_identity_check_catches_pieces_from_the_wrong_offset(
    gguf: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Power of the check above: a piece read from the prompt's start every
    time (the offset forgotten) parts some row from its lone run."""
    from specdec_rs.generation.decoder import Decoder

    def from_the_start(self: Decoder, limit: int) -> Any:
        return self.seq[: min(limit, self.prefill_left)]

    monkeypatch.setattr(Decoder, "prefill_piece", from_the_start)
    rs = chunked_requests(0.0)
    out = BatchEngine(gguf, sd.PromptLookup, max_batch=3, k=2, prefill_chunk=7).run(rs)
    monkeypatch.undo()
    assert all(f.result is not None for f in out.rows)
    assert any(
        f.result.tokens != alone(gguf, r, 2).tokens for r, f in zip(rs, out.rows, strict=True)
    )


def test_without_chunks_a_row_prefills_as_it_joins(gguf: Any, tiny: Any) -> None:
    """prefill_chunk=0, and a transformers target, prefill alone at the join
    (no round carries prompt tokens); the outputs are the same."""
    rs = chunked_requests(0.8)[:4]
    for target, chunk in ((gguf, 0), (tiny, 16)):
        engine = BatchEngine(target, sd.PromptLookup, max_batch=2, k=2, prefill_chunk=chunk)
        assert not engine.chunked
        out = engine.run(rs)
        assert all(s.prefill == 0 for s in out.steps)
        for r, f in zip(rs, out.rows, strict=True):
            assert f.result is not None and f.result.tokens == alone(target, r, 2).tokens


class StartFails(sd.PromptLookup):
    def start(self, seq: Any, cache: Any, hidden: Any) -> None:
        raise ValueError("this drafter refuses every prompt")


def test_chunked_rows_fail_and_cancel_alone(gguf: Any) -> None:
    """A drafter whose start fails after the last piece fails its row alone;
    a row cancelled mid-prefill frees its slot; the others equal alone."""
    made = iter([sd.PromptLookup(), StartFails(), sd.PromptLookup(), sd.PromptLookup()])
    engine = BatchEngine(gguf, lambda: next(made), max_batch=3, k=2, prefill_chunk=4)
    rs = chunked_requests(0.8)[:4]
    ids = [engine.submit(r) for r in rs]
    done = {f.id: f for f in engine.step()}
    assert engine.rows[2] is not None and engine.rows[2].decoder.prefill_left > 0
    assert engine.cancel(ids[2])
    while engine.active or engine.queued:
        done.update((f.id, f) for f in engine.step())
    assert sorted(done) == [0, 1, 3]
    assert done[1].result is None and "refuses every prompt" in done[1].error
    for i in (0, 3):
        assert done[i].result.tokens == alone(gguf, rs[i], 2).tokens


def test_chunked_prefill_with_a_draft_model_and_hidden_states(gguf: Any, tiny: Any) -> None:
    """Drafters that read the prompt at start: a draft model (its own
    prefill), early exit (the target's cache), and a drafter that reads the
    target's hidden states of the prompt (they reach it in pieces, the same
    values as one prefill's)."""
    seen: dict[str, dict[int, Any]] = {"batch": {}, "alone": {}}  # by prompt length

    class ReadsHidden(sd.PromptLookup):
        needs_target_hidden = True

        def __init__(self, where: str) -> None:
            super().__init__()
            self.where = where

        def start(self, seq: Any, cache: Any, hidden: Any) -> None:
            seen[self.where][len(seq)] = None if hidden is None else hidden.clone()
            super().start(seq, cache, hidden)

        def update(self, seq: Any, num_accepted: int, hidden: Any) -> None:
            super().update(seq, num_accepted, None)

    rs = chunked_requests(0.8)[:3]
    engine = BatchEngine(gguf, lambda: ReadsHidden("batch"), max_batch=3, k=2, prefill_chunk=8)
    out = engine.run(rs)
    for r, f in zip(rs, out.rows, strict=True):
        solo = sd.generate(
            gguf, ReadsHidden("alone"), r.prompt, max_new_tokens=10, k=2,
            temperature=0.8, seed=r.seed, eos_token_id=[],
        )  # fmt: skip
        assert f.result is not None and f.result.tokens == solo.tokens
    assert sorted(seen["batch"]) == sorted(seen["alone"]) == sorted(len(r.prompt) for r in rs)
    for length, b in seen["batch"].items():  # rows start in the prefill order, not by id
        a = seen["alone"][length]
        assert (b is None) == (a is None) and (b is None or torch.equal(b, a))
    for factory in (lambda: sd.DraftModel(tiny), lambda: sd.EarlyExit(gguf, 1)):
        rows = BatchEngine(gguf, factory, max_batch=3, k=2, prefill_chunk=8).run(rs)
        for r, f in zip(rs, rows.rows, strict=True):
            solo = sd.generate(
                gguf, factory(), r.prompt, max_new_tokens=10, k=2,
                temperature=0.8, seed=r.seed, eos_token_id=[],
            )  # fmt: skip
            assert f.result is not None and f.result.tokens == solo.tokens
