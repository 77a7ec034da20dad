"""Teacher-forced acceptance, predictions, the γ policies and the toy
experiments. p = target, q = draft, k = γ."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import specdec_rs as sd
from specdec_rs import measure, theory
from specdec_rs.measure import experiments
from specdec_rs.measure.acceptance import replay as replay_expected
from specdec_rs.models import layer_view, tiny_llama
from specdec_rs.policy import AdaptiveK, HeuristicK
from specdec_rs.processors import SamplingConfig

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def pair() -> tuple[Any, Any]:
    t = tiny_llama(num_layers=3, seed=1, dtype=torch.float64)
    d = tiny_llama(num_layers=1, seed=2, dtype=torch.float64)
    return t, d


def replay(a: np.ndarray, k: int) -> list[int]:
    """Kept drafts per round when round starts follow the 0/1 matrix a(t, i)."""
    kept, t = [], 0
    while t < len(a):
        k_round = max(0, min(k, len(a) - t - 1))
        m = 0
        while m < k_round and a[t, m] == 1:
            m += 1
        kept.append(m)
        t += m + 1
    return kept


@pytest.mark.parametrize("kind", ["draft-model", "early-exit", "prompt-lookup"])
def test_greedy_teacher_forcing_replays_the_real_rounds(pair: tuple[Any, Any], kind: str) -> None:
    """At greedy the kept drafts are the target's text, so a(t, i) is the exact
    accept indicator: replaying rounds through it gives the run's kept counts."""
    target, draft = pair
    make = {
        "draft-model": lambda: sd.DraftModel(layer_view(target, 2)),
        "early-exit": lambda: sd.EarlyExit(target, 2),
        "prompt-lookup": lambda: sd.PromptLookup(min_ngram=1),
    }[kind]
    prompt = torch.tensor([3, 4, 5, 6, 3, 4, 5, 6, 3, 4])
    checked = 0
    for k in (1, 3, 5):
        out = sd.generate(
            target, make(), prompt, max_new_tokens=40, k=k, temperature=0, eos_token_id=[]
        )
        a = measure.acceptance_matrix(
            target, make(), prompt, torch.tensor(out.tokens), SamplingConfig(0), k_max=8
        )
        assert set(np.unique(a[np.isfinite(a)])) <= {0.0, 1.0}
        assert replay(a, k) == out.kept_per_round
        rounds, cost = replay_expected(a, k, 0.0, [1.0] * 9)
        assert rounds == pytest.approx(out.rounds) and cost == pytest.approx(out.rounds)
        checked += sum(out.kept_per_round)
    assert checked > 0


def test_sampled_teacher_forcing_is_sum_of_min(pair: tuple[Any, Any]) -> None:
    target, draft = pair
    prompt, answer = torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6, 7, 8])
    config = SamplingConfig(0.8, top_k=10)
    a = measure.acceptance_matrix(target, sd.DraftModel(draft), prompt, answer, config, k_max=3)
    seq = torch.cat([prompt, answer])
    with torch.inference_mode():
        p = sd.logits_to_probs(target(seq[None]).logits[0, 2:-1], config)
        q = sd.logits_to_probs(draft(seq[None]).logits[0, 2:-1], config)
    expected = torch.minimum(p, q).sum(-1).numpy()
    np.testing.assert_allclose(a[:, 0], expected, rtol=1e-9)
    np.testing.assert_allclose(a[:-1, 1], expected[1:], rtol=1e-9)  # depth 2 reads t + 1
    assert np.isnan(a[-1, 1]) and np.isnan(a[-2, 2])  # past the end of the answer


def test_cost_measurements_leave_the_drafters_ready(pair: tuple[Any, Any]) -> None:
    target, draft = pair
    context = torch.arange(2, 40)
    for drafter in (sd.DraftModel(draft), sd.EarlyExit(target, 1), sd.PromptLookup()):
        assert measure.drafter_step_time(drafter, target, context, repeats=5) > 0
        cache = getattr(drafter, "_cache", None)
        if cache is not None:  # back where it started: the context but its last token
            assert cache.get_seq_length() == len(context) - 1
    assert measure.decode_step_time(target, context, repeats=5) > 0
    v = measure.verify_cost_curve(target, context, max_n=4, repeats=3)
    assert len(v) == 4 and v[0] == 1.0 and all(x > 0 for x in v)


def test_replay_prices_each_round() -> None:
    # one answer of 4 tokens; at t = 0 two drafts exist and are kept surely, then t = 3 is last
    a = np.array([[1.0, 1.0, np.nan], [0.5, 0.5, 0.5], [0.5, 0.5, 0.5], [0.5, np.nan, np.nan]])
    rounds, cost = replay_expected(a, 3, 0.25, [1.0, 1.5, 2.0, 2.5])
    assert rounds == pytest.approx(2.0)  # t = 0 keeps both drafts, t = 3 is a plain step
    assert cost == pytest.approx(2 * 0.25 + 2.0 + 1.0)
    half = np.full((3, 1), 0.5)
    rounds, _ = replay_expected(half, 1, 0.0, [1.0, 1.0])  # t=0: 1 or 2 tokens; t=1: 1 or 2; t=2: 1
    assert rounds == pytest.approx(1 + 0.5 * (1 + 0.5 * 1) + 0.5 * 1)
    with pytest.raises(ValueError, match="a has no rows"):  # an empty answer: nothing to price
        replay_expected(np.zeros((0, 3)), 2, 0.1, [1.0, 1.1, 1.2])


def test_constant_acceptance_reduces_to_the_handout_formula() -> None:
    alpha, k_max = 0.7, 6
    acc = measure.summarize([np.full((50, k_max), alpha)])
    assert acc.alpha == pytest.approx(alpha)
    assert acc.position_alpha == pytest.approx([alpha] * k_max)
    pred = measure.forecast(acc, 0.1, [1.0] * (k_max + 1))
    for k in range(1, k_max + 1):
        assert pred.tokens_refined[k - 1] == pytest.approx(theory.expected_tokens(alpha, k))
        assert pred.speedup_refined[k - 1] == pytest.approx(theory.expected_speedup(alpha, k, 0.1))
    assert pred.best_k_refined == pred.best_k_handout == theory.best_k(alpha, 0.1, k_max)
    slow = measure.forecast(acc, 0.1, [1.0 + 0.5 * n for n in range(k_max + 1)])
    assert slow.speedup_refined[2] == pytest.approx(theory.expected_tokens(alpha, 3) / (0.3 + 2.5))


def test_adaptive_policy_follows_the_cost_model() -> None:
    policy = AdaptiveK(0.05, [1.0, 1.1, 1.2, 1.3, 1.4, 1.5], k_max=5)
    for _ in range(200):
        policy.observe(5, 5, 5)  # everything kept: long drafts pay
    assert policy.next_k() == 5
    for _ in range(200):
        policy.observe(5, 5, 0)  # nothing kept lately: speculation does not pay
    assert policy.alphas()[0] < 0.05
    assert policy.next_k() == 0
    ks = [policy.next_k() for _ in range(16)]
    assert ks.count(1) == 2 and set(ks) == {0, 1}  # a probe every 8 rounds
    rates = AdaptiveK(0.2, [1.0, 1.5, 2.0], k_max=2).rates()
    assert rates == pytest.approx([1.0, 1.5 / 1.7, 1.75 / 2.4])  # α_i = 1/2 prior


def test_the_previous_prior_expects_a_position_to_keep_what_the_one_before_keeps() -> None:
    """prior="previous": position i's prior mean is position i - 1's
    estimate (weight 2), so a position never reached takes the estimate
    before it; the uniform prior leaves it at 1/2."""
    from specdec_rs.policy import AdaptiveK

    flat, chained = AdaptiveK(0.0, k_max=3), AdaptiveK(0.0, k_max=3, prior="previous")
    assert flat.alphas() == chained.alphas() == [0.5, 0.5, 0.5]
    for policy in (flat, chained):
        policy.observe(2, 2, 2)  # two drafts, both kept: positions 1 and 2 reached once
    assert flat.alphas() == pytest.approx([2 / 3, 2 / 3, 1 / 2])
    assert chained.alphas() == pytest.approx([2 / 3, 7 / 9, 7 / 9])
    with pytest.raises(ValueError, match="prior = 'flat'; expected one of"):
        AdaptiveK(0.0, prior="flat")


def test_the_measured_policy_learns_its_costs_from_the_rounds() -> None:
    """No calibration: target-only rounds give T(1), the drafted rounds T(n)
    and the draft time; then the cost model decides, off where it does not pay."""
    from specdec_rs.policy import MeasuredK

    policy = MeasuredK(k_max=4, warmup=2, smoothing=1.0)
    policy.reset()
    assert [policy.next_k(), policy.next_k()] == [0, 0]  # warm-up: T(1)
    policy.observe_time(0.0, 0.010, 1)
    policy.observe_time(0.0, 0.010, 1)
    assert policy.next_k() == 1  # one draft first, to measure c
    for _ in range(100):  # cheap drafts, every one kept, a forward over 5 = 1.2 steps
        policy.observe(4, 4, 4)
        policy.observe_time(0.0001 * 4, 0.012, 5)
    c, v = policy.costs()
    assert c == pytest.approx(0.01) and v[0] == 1.0 and v[4] == pytest.approx(1.2)
    assert v[1] == pytest.approx(1.05) and v[2] == pytest.approx(1.1)  # interpolated
    assert policy.next_k() == 4
    for _ in range(200):  # now every draft is rejected and a draft costs a step
        policy.observe(4, 4, 0)
        policy.observe_time(0.010 * 4, 0.012, 5)
    c, v = policy.costs()
    assert c == pytest.approx(1.0)
    # off; a probe costs c + v(2) - 1 steps, so one in ceil(that / 3%) rounds
    interval = math.ceil((c + v[1] - 1) / 0.03)
    ks = [policy.next_k() for _ in range(2 * interval)]
    assert set(ks) == {0, 1} and ks.count(1) == 2 and ks[interval - 1] == 1


def test_the_default_policy_switches_a_useless_drafter_off(pair: tuple[Any, Any]) -> None:
    """A drafter whose drafts are never kept: after the first rounds the
    measured policy stops drafting (a probe every 8 rounds), and the greedy
    output is the target's.

    The rounds' wall-clock is replaced by a fixed cost model (a draft 0.2
    steps, a forward over n positions 1 + 0.3 (n - 1) steps): on the tiny
    model the measured v(2) and c are both near 0, where drafting one token
    is nearly free and the policy rightly keeps it on while its acceptance
    estimate decays, so a real clock makes the count depend on the host's
    noise."""
    from specdec_rs.policy import MeasuredK, measured_policy

    class FixedClock(MeasuredK):
        def observe_time(self, draft_s: float, target_s: float, positions: int) -> None:
            super().observe_time(0.2 * (positions - 1), 1.0 + 0.3 * (positions - 1), positions)

    target, _ = pair

    class Wrong:
        name = "wrong"
        needs_target_hidden = False

        def start(self, seq: Any, cache: Any, hidden: Any) -> None:
            pass

        def propose(self, seq: Any, k: int, sampler: Any) -> Any:
            import torch
            from specdec_rs.drafters.base import one_hot_draft

            return one_hot_draft(torch.full((k,), int(seq[-1]) ^ 1), sampler)

        def update(self, seq: Any, num_accepted: int, hidden: Any) -> None:
            pass

    assert isinstance(measured_policy(Wrong(), 4), MeasuredK)
    policy = FixedClock(k_max=4)
    plain = sd.generate(target, None, [2, 3], max_new_tokens=60, temperature=0, eos_token_id=[])
    out = sd.generate(
        target, Wrong(), [2, 3], max_new_tokens=60, k=policy, temperature=0, eos_token_id=[]
    )
    assert out.tokens == plain.tokens
    assert sum(1 for k in out.k_per_round[10:] if k > 0) <= len(out.k_per_round[10:]) // 8 + 1


def test_the_measured_policy_drafts_only_where_a_catch_up_can_be_repaid() -> None:
    """A drafter that must first run a 399-position prompt, its step 0.8 of
    the target's: over 64 tokens even drafts that are always kept save less
    than the catch-up costs, so none is ever drafted (no probes either);
    over 10,000 tokens, or with a step of 0.1, the first draft is tried, and
    its round (which paid the catch-up) is not taken as the draft cost."""
    from specdec_rs.policy import MeasuredK

    def started(step_s: float, budget: int) -> MeasuredK:
        policy = MeasuredK(k_max=2, warmup=2, smoothing=1.0)
        policy.reset()
        policy.observe_start(0.4, 400, 399, step_s, budget)  # 1 ms a prompt position
        for _ in range(2):
            assert policy.next_k() == 0  # warm-up: T(1) = 10 ms
            policy.observe(0, 0, 0)
            policy.observe_time(0.0, 0.010, 1)
        return policy

    dear = started(0.008, 64)
    ks = []
    for _ in range(60):
        ks.append(dear.next_k())
        dear.observe(0, 0, 0)
        dear.observe_time(0.0, 0.010, 1)
    assert set(ks) == {0}
    for step_s, budget in ((0.008, 10_000), (0.001, 64)):
        policy = started(step_s, budget)
        assert policy.next_k() == 1
        policy.observe(1, 1, 1)
        policy.observe_time(0.4, 0.011, 2)  # the catch-up's round
        assert policy.draft_s is None and policy.next_k() == 1  # c is measured next


@pytest.mark.parametrize(
    ("args", "name"),
    [
        ((-1.0, 400, 399, 0.008, 64), "prefill_s"),
        ((float("nan"), 400, 399, 0.008, 64), "prefill_s"),
        ((0.4, 400.0, 399, 0.008, 64), "prefill_positions"),
        ((0.4, 400, -1, 0.008, 64), "catch_up"),
        ((0.4, 400, 399, float("inf"), 64), "draft_step_s"),
        ((0.4, 400, 399, 0.008, True), "budget"),
    ],
)
def test_the_catch_up_announcement_is_checked(args: tuple[Any, ...], name: str) -> None:
    from specdec_rs.policy import MeasuredK

    with pytest.raises(ValueError, match=name):
        MeasuredK().observe_start(*args)


def test_a_draft_model_pays_its_catch_up_only_when_it_drafts(pair: tuple[Any, Any]) -> None:
    """A separate draft model starts with an empty cache; under the default
    policy told that the catch-up cannot be repaid it never drafts and never
    runs the prompt, and the greedy output is the target's; told it can,
    it drafts, and its cache holds the text."""
    from specdec_rs.policy import MeasuredK

    target, draft = pair

    class Told(MeasuredK):
        """A fixed clock: T(n) = 1 + 0.3 (n - 1), a prompt position 1, a
        draft step `step` (the tiny models' real times are near 0 and noisy)."""

        def __init__(self, step: float):
            super().__init__(k_max=3)
            self.step = step

        def observe_start(self, prefill_s: float, positions: int, *rest: Any) -> None:
            catch_up, _, budget = rest
            super().observe_start(float(positions), positions, catch_up, self.step, budget)

        def observe_time(self, draft_s: float, target_s: float, positions: int) -> None:
            super().observe_time(0.01 * (positions - 1), 1.0 + 0.3 * (positions - 1), positions)

    prompt = list(range(2, 40))
    plain = sd.generate(target, None, prompt, max_new_tokens=12, temperature=0, eos_token_id=[])
    for step, drafts in ((0.8, False), (0.01, True)):
        drafter = sd.DraftModel(draft)
        out = sd.generate(
            target, drafter, prompt, max_new_tokens=12, k=Told(step), temperature=0, eos_token_id=[]
        )
        assert out.tokens == plain.tokens
        assert (out.drafted > 0) == drafts
        assert drafter._cache is not None
        held = drafter._cache.get_seq_length()  # nothing run unless it drafted
        assert held > len(prompt) if drafts else held == 0, step


def test_heuristic_policy_matches_transformers_schedule() -> None:
    h = HeuristicK(4)
    h.observe(4, 4, 4)
    assert h.next_k() == 6
    h.observe(6, 6, 2)
    assert h.next_k() == 5
    for _ in range(10):
        h.observe(5, 5, 0)
    assert h.next_k() == 1


def test_policies_keep_greedy_output(pair: tuple[Any, Any]) -> None:
    target, draft = pair
    plain = sd.generate(target, None, [2, 3], max_new_tokens=30, temperature=0, eos_token_id=[])
    for policy in (HeuristicK(), AdaptiveK(0.1, [1.0 + 0.1 * n for n in range(9)])):
        out = sd.generate(
            target,
            sd.DraftModel(draft),
            [2, 3],
            max_new_tokens=30,
            k=policy,
            temperature=0,
            eos_token_id=[],
        )
        assert out.tokens == plain.tokens and out.policy == policy.name
        assert len(set(out.k_per_round)) > 1  # γ did change between rounds


def test_bad_policy_arguments() -> None:
    with pytest.raises(ValueError, match="cost_ratio = -1"):
        AdaptiveK(-1)
    with pytest.raises(ValueError, match="verify_cost needs k_max"):
        AdaptiveK(0.1, [1.0, 1.2], k_max=4)


# ---- toy experiments ------------------------------------------------------------------------


def test_chain_theory_matches_the_engine() -> None:
    for k in (1, 3, 5):
        t = experiments.chain_round_theory(experiments.CHAIN_P, experiments.CHAIN_Q, k)
        counts = sd.simulate_round_lengths(
            experiments.CHAIN_P, experiments.CHAIN_Q, k=k, rounds=2_000_000, seed=k
        )
        mean = (counts * np.arange(k + 2)).sum() / counts.sum()
        var = (counts * np.arange(k + 2) ** 2).sum() / counts.sum() - mean**2
        # continuing rounds are correlated through the start token; 10 sigma of the
        # independent-rounds error still catches a wrong prediction (≥ 1% here)
        assert abs(mean - t["tokens"]) < 10 * np.sqrt(var / counts.sum()), (k, mean, t["tokens"])


def _drive(rounds: int, round_of: Any) -> tuple[Any, list[int]]:
    """A fresh MeasuredK(k_max=4) over `rounds` rounds, round i at the γ k it
    chose being `round_of(i, k)`: (the policy, each round's γ)."""
    from specdec_rs.policy import MeasuredK

    policy = MeasuredK(k_max=4)
    policy.reset()
    ks = []
    for i in range(rounds):
        k = policy.next_k()
        ks.append(k)
        policy.observe_round(round_of(i, k))
    return policy, ks


def _round(asked: int, accepted: int, target_s: float, verify_s: float = 0.0) -> Any:
    from specdec_rs.rounds import Round

    return Round(
        0, asked, asked, asked, accepted, tuple(range(accepted + 1)), None, False,
        0.0, target_s, verify_s, asked + 1,
    )  # fmt: skip


def test_every_chain_policy_counts_a_lookahead_round_alike() -> None:
    """A round with a lookahead window asked for 4 drafts and got 1 (a draft
    the window did not return counts as one rejected): every chain policy,
    built-in, measured, per source or foreign, hands its `observe` the same
    counts (asked, asked, kept), and ends in the state that `observe` of
    those counts gives it."""
    from specdec_rs.policy import AdaptiveK, BySource, HeuristicK, MeasuredK
    from specdec_rs.policy.chain import as_policy
    from specdec_rs.rounds import Round

    window_round = Round(
        0, 4, 1, 1, 0, (7,), None, False, 0.0, 0.01, 0.0, 1 + 1 + 8, window=8,
    )  # fmt: skip
    assert window_round.policy_drafted == 4

    class Recorder:
        name = "recorder"

        def __init__(self) -> None:
            self.seen: list[tuple[int, int, int]] = []

        def reset(self) -> None:
            self.seen.clear()

        def next_k(self) -> int:
            return 4

        def observe(self, k: int, drafted: int, num_accepted: int) -> None:
            self.seen.append((k, drafted, num_accepted))

    def fresh() -> dict[str, Any]:
        return {
            "heuristic": HeuristicK(4),
            "adaptive": AdaptiveK(0.1),
            "measured": MeasuredK(k_max=4),
            "by source": BySource({"lookahead": HeuristicK(4)}),
        }

    for name, policy in fresh().items():
        policy.reset()
        calls: list[tuple[int, int, int]] = []
        counted = policy.policies["lookahead"] if name == "by source" else policy
        inner_observe = counted.observe
        counted.observe = lambda k, d, a, f=inner_observe, seen=calls: (
            seen.append((k, d, a)),
            f(k, d, a),
        )[1]
        policy.observe_round(window_round)
        assert calls == [(4, 4, 0)], name
        twin = fresh()[name]
        twin.reset()
        twin.observe(4, 4, 0)
        assert twin.next_k() == policy.next_k(), name
    foreign = Recorder()
    as_policy(foreign).observe_round(window_round)
    assert foreign.seen == [(4, 4, 0)]


def test_the_measured_policy_stops_drafting_where_the_clock_says_it_loses() -> None:
    """Every draft kept and forwards as cheap as one step, so the cost model
    says draft; but each drafting round costs 6 steps in verification (a
    cost the model does not see; even 4 drafts, all kept, then cost 1.4
    steps a token): the guard holds speculation off after a
    few rounds, tries again after 16, 32, ... rounds, and a winning drafter
    (the same rounds without that cost) keeps drafting, with a target-only
    round now and then."""

    def run(verify_s: float, rounds: int) -> list[int]:
        return _drive(rounds, lambda i, k: _round(k, k, 0.010, verify_s if k else 0.0))[1]

    losing = run(0.060, 200)
    first_off = next(i for i in range(3, 200) if losing[i] == 0)
    assert first_off <= 10  # within a few drafting rounds
    assert sum(k > 0 for k in losing) <= 40  # mostly off: the trials get rarer
    winning = run(0.0, 200)
    assert sum(k > 0 for k in winning) >= 185 and 0 in winning[10:]  # on, with refresh rounds


def test_one_slow_round_does_not_trip_the_guard() -> None:
    # round 12 stalled by another process
    policy, ks = _drive(60, lambda i, k: _round(k, k, 0.010 + (0.5 if i == 12 else 0.0)))
    assert policy.trips == 0  # no trip: the only target-only rounds are the refreshes
    assert sum(k == 0 for k in ks[4:]) <= 3  # after 6, 12 and 24 drafting rounds


def test_slow_warm_up_rounds_do_not_make_drafting_look_cheap() -> None:
    """The warm-up's two target-only rounds come straight after the prefill,
    on a host still ramping up (1.5 times a settled step here, as SmolLM2's
    first decode steps on a 2-core host); a forward over k + 1 positions
    costs 1 + 0.35 k steps and one draft in four is kept, so drafting loses
    (a 1-draft round: 1.35 steps for 1.25 tokens). With T(1) taken from the
    slow warm-up, a 2-position forward looked cheaper than a step and the
    policy drafted in 85 of the last 86 rounds; the first settled
    target-only round (the refresh after 6 drafting rounds) restarts T(1)
    and the guard's figures, and drafting stops."""

    def round_of(i: int, k: int) -> Any:
        ramp = 1.5 if i < 2 else 1.0
        return _round(k, min(k, 1) if i % 4 == 2 else 0, 0.010 * ramp * (1 + 0.35 * k))

    policy, ks = _drive(96, round_of)
    assert ks[:3] == [0, 0, 1]
    assert policy.forward_s[1] == pytest.approx(0.010)  # settled, not the warm-up's 15 ms
    assert sum(k > 0 for k in ks[16:]) <= 6  # off after the first refresh, probes aside


def test_unmeasured_long_forwards_cost_at_least_what_each_position_did() -> None:
    """Measured T(1) and T(2) = 1.3 T(1): a forward over 5 positions is
    priced at 1.3 + 3 · 0.3 (each position as dear as the one measured), not
    at the 0.1-a-position floor."""
    from specdec_rs.policy import MeasuredK

    policy = MeasuredK(k_max=4)
    policy.reset()
    policy.observe_time(0.0, 0.010, 1)
    policy.observe_time(0.001, 0.013, 2)
    _, v = policy.costs()
    assert v[1] == pytest.approx(1.3) and v[4] == pytest.approx(2.2)


def test_the_demo_warms_the_target_up_untimed(monkeypatch: pytest.MonkeyPatch) -> None:
    """`specdec demo` runs one short target-only generation before its timed
    runs (the process's first forward builds the native stack and touches the
    weights: timed, it would slow target-only's row and flatter every
    drafter); its result is in no row."""
    import importlib

    from specdec_rs import models

    demo_mod = importlib.import_module("specdec_rs.measure.demo")  # the module, not `demo`
    tokenizer = models.load_smollm2()[1]
    target = tiny_llama(vocab_size=len(tokenizer), hidden_size=32, num_layers=2, seed=0)
    job = demo_mod.demo_job(
        target, tokenizer, drafter_specs=["prompt-lookup"], prompts=2, max_new_tokens=12
    )
    calls: list[tuple[Any, int, int]] = []  # (drafter, max_new_tokens, new tokens)
    real = demo_mod.generate

    def recorded(target: Any, drafter: Any, ids: Any, **kw: Any) -> Any:
        out = real(target, drafter, ids, **kw)
        calls.append((drafter, kw["max_new_tokens"], out.new_tokens))
        return out

    monkeypatch.setattr(demo_mod, "generate", recorded)
    report = demo_mod.demo(job)
    assert calls[0][:2] == (None, 8)  # the warm-up: target-only, 8 tokens
    assert [n for _, n, _ in calls[1:]] == [12] * 4  # 2 prompts x (none, prompt lookup)
    rows = {row.totals.drafter: row.totals for row in report.rows}
    assert list(rows) == ["none", "prompt-lookup"]
    assert rows["none"].tokens == calls[1][2] + calls[3][2]  # the warm-up's are in no row
    assert rows["prompt-lookup"].tokens == calls[2][2] + calls[4][2]
