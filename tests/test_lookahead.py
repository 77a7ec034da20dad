"""The lookahead drafter: its pool, its Jacobi window (the combined mask of
the verification forward), its drafts, greedy identity with target-only
generation alone and in a batch, and its teacher-forced acceptance. (Its
output law at T > 0: `tests/test_law.py`.) p = target, q = draft, k = γ."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import specdec_rs as sd
from greedy_fixtures import greedy_runs
from specdec_rs.drafters.draft import Draft, Window
from specdec_rs.drafters.lookahead import NgramPool
from specdec_rs.measure.acceptance import acceptance_matrix
from specdec_rs.models import tiny_llama
from specdec_rs.processors import Sampler, SamplingConfig
from specdec_rs.runner import forward, forward_tree, new_cache

torch = pytest.importorskip("torch")

PROMPTS = ([1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 4, 5, 4], [1, 2, 3, 1], [9])


@pytest.fixture(scope="module")
def target() -> Any:
    return tiny_llama(num_layers=2, vocab_size=16, seed=1)  # greedy text that varies


def test_the_pool_keeps_the_most_recent_continuations_per_key() -> None:
    pool = NgramPool(size=3, max_entries=2)
    pool.add_text([5, 1, 2, 5, 3, 4, 5, 1, 2])
    # 5 -> (1, 2), (3, 4), (1, 2) again (now the most recent); 1 -> (2, 5), (2, None...)
    assert pool.continuations(5) == [(3, 4), (1, 2)]
    pool.add([5, 6, 7])
    assert pool.continuations(5) == [(1, 2), (6, 7)]  # (3, 4), the least recent, evicted
    assert pool.continuations(8) == []
    with pytest.raises(ValueError, match="3"):
        pool.add([5, 6])


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"window": 0}, "window"),
        ({"ngram": 1}, "ngram"),
        ({"pool": 0}, "pool"),
        ({"window": 2.5}, "window"),
        ({"prompt_pool": "yes"}, "prompt_pool"),
    ],
)
def test_bad_options_are_value_errors(options: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        sd.Lookahead(**options)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("lookahead:0,3,4", "window"),
        ("lookahead:4,1,4", "ngram"),
        ("lookahead:4,3,0", "pool"),
        ("lookahead:4,3", "W,N,G"),
        ("lookahead:a,b,c", "W,N,G"),
        ("lookahead:", "not understood"),
    ],
)
def test_bad_cli_options_are_value_errors(target: Any, spec: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        sd.drafters.from_spec(spec, target)


def test_the_cli_name_builds_it(target: Any) -> None:
    default = sd.drafters.from_spec("lookahead", target)
    assert isinstance(default, sd.Lookahead) and default.name == "lookahead"
    shaped = sd.drafters.from_spec("lookahead:5,4,2", target)
    assert (shaped.window, shaped.ngram, shaped.pool_size) == (5, 4, 2)
    assert shaped.name == "lookahead:5,4,2"


def test_the_window_nodes_see_their_own_jacobi_context(target: Any) -> None:
    """In one forward with drafts before it, each window node's logits are the
    target's after the cache, the root, level 0 up to its column and its own
    column below it (the combined mask and positions)."""
    drafter = sd.Lookahead(window=3, ngram=4)
    prompt = torch.tensor([1, 2, 3, 4, 5, 6])
    drafter.start(prompt, new_cache(target), None)
    drafter.levels = [[7, 8, 9], [10, 11, 12], [13, 14, 15]]
    window = drafter.window_nodes()
    assert window.tokens.tolist() == [7, 8, 9, 10, 11, 12, 13, 14, 15]
    assert window.parents == [-1, 0, 1, 0, 1, 2, 3, 4, 5]
    drafts = [2, 3]
    cache = new_cache(target)
    with torch.inference_mode():
        forward(target, prompt[:-1], cache, keep=1)
        tokens = torch.cat([torch.tensor(drafts), window.tokens])
        parents = [-1, 0, *(p if p < 0 else 2 + p for p in window.parents)]
        logits, _ = forward_tree(target, prompt[-1:], tokens, parents, cache)
        for node in range(9):
            level, column = divmod(node, 3)
            context = [*prompt.tolist(), *drafter.levels[0][: column + 1]]
            context += [drafter.levels[m][column] for m in range(1, level + 1)]
            alone = forward(target, torch.tensor(context), new_cache(target), keep=1)[0]
            assert torch.allclose(logits[3 + node], alone, atol=1e-4), node
        for i, _ in enumerate(drafts):  # the drafts' rows do not see the window
            alone = forward(
                target,
                torch.tensor([*prompt.tolist(), *drafts[: i + 1]]),
                new_cache(target),
                keep=1,
            )[0]
            assert torch.allclose(logits[1 + i], alone, atol=1e-4)


def test_the_levels_fill_then_each_round_pools_one_ngram_per_column(target: Any) -> None:
    drafter = sd.Lookahead(window=3, ngram=4, pool=8, prompt_pool=False)
    prompt = torch.tensor([1, 2, 3, 4, 5])
    drafter.start(prompt, new_cache(target), None)
    assert [len(row) for row in drafter.levels] == [3 + 4 - 2]
    vocab = 16
    sampler = Sampler(SamplingConfig(0.0), vocab, torch.Generator().manual_seed(0))
    for round_, widths in enumerate(([4, 4], [3, 3, 3], [3, 3, 3], [3, 3, 3])):
        before = [list(row) for row in drafter.levels]
        draft = drafter.propose(prompt, 3, sampler)
        assert draft.window is not None and len(draft.window.tokens) == sum(map(len, before))
        top = len(before[-1])
        assert draft.window.read == list(
            range(len(draft.window.tokens) - top, len(draft.window.tokens))
        )
        new = [(round_ * 3 + i) % vocab for i in range(top)]
        logits = torch.zeros(top, vocab)
        logits[torch.arange(top), torch.tensor(new)] = 1.0
        drafter.observe_window(logits)
        assert [len(row) for row in drafter.levels] == widths
        if round_ >= 2:  # full: column i gave the n-gram down its levels, then the new token
            assert drafter.levels[-1] == new and drafter.levels[:-1] == before[1:]
            for i in range(3):
                assert tuple([*(row[i] for row in before[1:]), new[i]]) in (
                    drafter.pool.continuations(before[0][i])
                )
    with pytest.raises(ValueError, match="without a window"):
        drafter.observe_window(logits)


@pytest.mark.parametrize("tree", [None, 6])
@pytest.mark.parametrize("shape", [(4, 3, 4), (1, 2, 1), (3, 5, 2)])
def test_greedy_output_is_the_targets_own(target: Any, tree: int | None, shape: tuple) -> None:
    runs = greedy_runs(
        target, lambda: sd.Lookahead(*shape), PROMPTS, max_new_tokens=24, k=4, tree=tree
    )
    assert sum(out.drafted for out in runs) > 0


def test_the_window_alone_finds_drafts(target: Any) -> None:
    """Without the committed text's n-grams the pool holds only the window's:
    drafts still come, and some are kept."""
    (out,) = greedy_runs(
        target, lambda: sd.Lookahead(4, 3, 4, prompt_pool=False), [[9]], max_new_tokens=40, k=2
    )
    assert out.drafted > 0 and sum(out.kept_per_round) > 0


def test_a_seed_gives_its_sample_again(target: Any) -> None:
    runs = [
        sd.generate(
            target,
            sd.Lookahead(),
            PROMPTS[0],
            max_new_tokens=20,
            k=3,
            temperature=1.0,
            top_p=0.9,
            seed=7,
            eos_token_id=[],
        ).tokens
        for _ in range(2)
    ]
    assert runs[0] == runs[1]


def test_it_drafts_in_a_batch_beside_other_rows(target: Any) -> None:
    prompts = [list(p) for p in PROMPTS]
    out = sd.generate_batch(
        target,
        sd.drafters.copies(sd.Lookahead()),
        prompts,
        max_new_tokens=12,
        temperature=0,
        eos_token_id=[],
        k=3,
    )
    drafted = 0
    for prompt, row in zip(prompts, out.rows, strict=True):
        plain = sd.generate(target, None, prompt, max_new_tokens=12, temperature=0, eos_token_id=[])
        assert row.result is not None and row.result.tokens == plain.tokens
        drafted += row.result.drafted
    assert drafted > 0


def test_teacher_forced_acceptance_replays_its_greedy_rounds(target: Any) -> None:
    """At greedy the forced answer is the generation, so each round of a real
    generation at γ = k_max keeps exactly the leading ones of a[t] at its start."""
    prompt = PROMPTS[0]
    out = sd.generate(
        target, sd.Lookahead(), prompt, max_new_tokens=30, k=3, temperature=0, eos_token_id=[]
    )
    a = acceptance_matrix(
        target,
        sd.Lookahead(),
        torch.tensor(prompt),
        torch.tensor(out.tokens),
        SamplingConfig(0.0),
        k_max=3,
    )
    assert a.shape == (30, 3)
    t = 0
    for kept in out.kept_per_round:
        row = np.nan_to_num(a[t], nan=0.0)
        leading = int(np.cumprod(row).sum())  # the last round drafts one fewer (the budget)
        assert min(leading, len(out.tokens) - t - 1) == kept, t
        t += kept + 1
    assert sum(out.kept_per_round) > 0


class NoObserver:
    """A drafter that proposes a window but cannot read it back."""

    name = "no-observer"
    needs_target_hidden = False

    def __init__(self, window: Window) -> None:
        self.window = window

    def check_target(self, target: Any) -> None:
        pass

    def start(self, *args: Any) -> None:
        pass

    def propose(self, seq: Any, k: int, sampler: Any) -> Draft:
        empty = sd.drafters.base.empty_draft(sampler)
        return Draft(empty.tokens, empty.q, window=self.window)

    def update(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize(
    ("window", "says"),
    [
        (Window(torch.tensor([1, 2]), [-1, 0]), "observe_window"),
        (Window(torch.tensor([1, 99]), [-1, 0]), "outside the vocabulary"),
        (Window(torch.tensor([1, 2]), [-1, 1]), "earlier node"),
        (Window(torch.tensor([1.0, 2.0]), [-1, 0]), "integer ids"),
        (Window(torch.tensor([1, 2]), [-1, 0], [1, 0]), "ascending"),
        (Window(torch.tensor([1, 2]), [-1, 0], [2]), "below 2"),
        ("window", "Window"),
    ],
)
def test_a_bad_window_is_a_value_error(target: Any, window: Any, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        sd.generate(
            target,
            NoObserver(window),
            [1, 2],
            max_new_tokens=4,
            k=2,
            temperature=0,
            eos_token_id=[],
        )


def test_rounds_costs_and_policies_price_its_window(target: Any) -> None:
    """A round reports the window's nodes among its forward's positions; γ
    policies price it at asked + 1 and count the drafts it did not return
    as rejected (the window came with asking for drafts);
    the measured v(n) reaches past γ + 1 by the window, and the forecasts
    read v(γ + 1 + W·(N − 1))."""
    from specdec_rs.measure.costs import measure_costs
    from specdec_rs.measure.methods import drafter_verify_cost

    rounds: list[Any] = []
    sd.generate(
        target,
        sd.Lookahead(4, 3, 4),
        PROMPTS[0],
        max_new_tokens=12,
        k=2,
        temperature=0,
        eos_token_id=[],
        on_round=rounds.append,
    )
    assert rounds and all(r.window > 0 for r in rounds[:-1])
    for r in rounds:
        assert r.positions == r.drafted + 1 + r.window
        assert r.policy_drafted == (r.asked if r.window else r.drafted)  # misses count rejected
        assert r.policy_positions == r.policy_drafted + 1
    drafter = sd.Lookahead(4, 3, 4)
    costs = measure_costs(
        target, torch.tensor(PROMPTS[0]), {"lookahead": drafter}, k_max=3, repeats=2
    )
    assert drafter.window_positions == 8 and len(costs.verify_cost) == 3 + 1 + 8
    assert drafter_verify_cost(costs, drafter) == costs.verify_cost[8:]
    assert drafter_verify_cost(costs, sd.PromptLookup()) == costs.verify_cost
