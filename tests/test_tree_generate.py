"""Tree decoding with transformers: the tree forward (attention mask and
position ids), the cache compacted to the accepted path, lookup trees of
several matches, and the checks on a drafter's trees. p = target, q = draft.
The trained heads' trees are tested in test_heads.py, the output law of tree
decoding in test_law.py."""

from __future__ import annotations

from typing import Any

import pytest
import specdec_rs as sd
from specdec_rs import models, runner, trees
from specdec_rs.drafters.draft import TreeDraft
from specdec_rs.drafters.lookup import lookup_all
from specdec_rs.trees import confident_tree, trie

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")


@pytest.fixture(scope="module")
def target() -> Any:
    return models.tiny_llama(num_layers=2)


PROMPT = [5, 6, 7, 5, 6, 8, 5, 6, 7, 9, 5, 6]


def test_a_tree_forward_equals_each_path_run_alone(target: Any) -> None:
    prompt = torch.tensor(PROMPT)
    parents = [-1, -1, 0, 0, 1, 2]
    tokens = torch.tensor([11, 12, 13, 14, 15, 16])
    with torch.inference_mode():
        cache = runner.new_cache(target)
        runner.forward(target, prompt[:-1], cache, keep=1)
        logits, _ = runner.forward_tree(target, prompt[-1:], tokens, parents, cache)
        for i in range(-1, len(parents)):
            path, j = [], i
            while j >= 0:
                path.insert(0, int(tokens[j]))
                j = parents[j]
            alone = runner.forward(
                target,
                torch.cat([prompt, torch.tensor(path, dtype=torch.long)]),
                runner.new_cache(target),
                keep=1,
            )
            torch.testing.assert_close(logits[i + 1], alone[0], atol=1e-5, rtol=1e-5)
        # keep the path root -> node 0 -> node 2, then continue from it
        n = len(prompt)
        runner.keep_positions(cache, torch.tensor([*range(n), n + 0, n + 2]))
        assert cache.get_seq_length() == n + 2
        nxt = runner.forward(target, torch.tensor([15]), cache, keep=1)
        alone = runner.forward(
            target, torch.tensor([*PROMPT, 11, 13, 15]), runner.new_cache(target), keep=1
        )
    torch.testing.assert_close(nxt, alone, atol=1e-5, rtol=1e-5)


def test_the_tree_mask_lets_each_node_see_only_its_path() -> None:
    mask = trees.tree_mask([-1, -1, 0], past=2, dtype=torch.float32, device="cpu")[0, 0]
    seen = (mask == 0).int().tolist()
    assert seen == [
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 0, 1, 0],
        [1, 1, 1, 1, 0, 1],
    ]
    assert trees.tree_depths([-1, -1, 0, 2]) == [1, 1, 2, 3]
    with pytest.raises(ValueError, match="not an earlier node"):
        trees.tree_depths([-1, 1])


def greedy_with_lookup_tree(target: Any, tree: Any) -> tuple[Any, Any]:
    """(target-only, prompt lookup with `tree`) greedy results, 30 tokens after PROMPT."""
    plain = sd.generate(target, None, PROMPT, max_new_tokens=30, temperature=0, eos_token_id=[])
    out = sd.generate(
        target,
        sd.PromptLookup(),
        PROMPT,
        max_new_tokens=30,
        temperature=0,
        eos_token_id=[],
        tree=tree,
    )
    return plain, out


@pytest.mark.parametrize("budget", [1, 3, 8, 16])
def test_lookup_trees_keep_the_greedy_output(target: Any, budget: int) -> None:
    plain, out = greedy_with_lookup_tree(target, budget)
    assert out.tokens == plain.tokens
    assert out.new_tokens == 30 and out.drafted > 0


def test_lookup_finds_several_matches_and_merges_them() -> None:
    seq = np.array([1, 2, 3, 9, 7, 1, 2, 4, 4, 1, 2])
    found = [c.tolist() for c in lookup_all(seq, 3, 2, 8)]
    assert found == [[3, 9, 7], [4, 4, 1]]
    assert trie(found, 8) == ([3, 9, 7, 4, 4, 1], [-1, 0, 1, -1, 3, 4])
    assert trie([[1, 2], [1, 3]], 8) == ([1, 2, 3], [-1, 0, 0])
    assert trie(found, 4) == ([3, 9, 7, 4], [-1, 0, 1, -1])


def test_confident_trees_keep_the_most_confident_candidates() -> None:
    ranked = [([5, 7, 8], [0.5, 0.3, 0.2]), ([6, 1], [0.9, 0.1]), ([2], [1.0])]
    tokens, parents = confident_tree(ranked, 4)
    # confidences: 5: .5, 7: .3, 8: .2, 6: .45, 1: .05, 2: .45
    assert tokens == [5, 7, 6, 2] and parents == [-1, -1, 0, 2]


class BadTrees:
    """A drafter whose trees break one rule each."""

    name = "bad-trees"
    needs_target_hidden = False

    def __init__(self, tree: TreeDraft) -> None:
        self.tree = tree

    def start(self, seq: Any, cache: Any, hidden: Any) -> None:
        pass

    def propose(self, seq: Any, k: int, sampler: Any) -> Any:
        raise AssertionError("chains are not used here")

    def propose_tree(self, seq: Any, budget: int, sampler: Any) -> TreeDraft:
        return self.tree

    def update(self, seq: Any, num_accepted: int, hidden: Any) -> None:
        pass


@pytest.mark.parametrize(
    ("tree", "match"),
    [
        (TreeDraft(torch.tensor([1, 2, 3, 4, 5]), [-1, 0, 1, 2, 3], None), "at most 4"),
        (TreeDraft(torch.tensor([1, 2]), [-1, 5], None), "not an earlier node"),
        (TreeDraft(torch.tensor([1, 999]), [-1, 0], None), "outside the vocabulary"),
        (TreeDraft(torch.tensor([1, 2]), [-1, 0], None, "iid"), "expected \\(3, 64\\)"),
        (TreeDraft(torch.tensor([1, 2]), [-1, 0], None, "beam"), "children"),
        (TreeDraft(torch.tensor([1, 2]), [-1, 0.0], None), "parents\\[1\\] = 0.0"),  # type: ignore[list-item]
        (TreeDraft(torch.tensor([1, 2]), "ab", None), "parents = 'ab' is a string"),  # type: ignore[arg-type]
        (TreeDraft(torch.tensor([True, False]), [-1, 0], None), "dtype torch.bool"),
        (
            TreeDraft(torch.tensor([1, 2]), [-1, 0], np.full((3, 64), 1 / 64), "iid"),  # type: ignore[arg-type]
            "returned q as a ndarray",
        ),
    ],
)
def test_bad_trees_are_value_errors_before_the_target_runs(
    target: Any, tree: TreeDraft, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        sd.generate(target, BadTrees(tree), PROMPT, max_new_tokens=4, tree=4, eos_token_id=[])


def test_tree_decoding_needs_a_tree_drafter(target: Any) -> None:
    with pytest.raises(ValueError, match="drafts trees"):
        sd.generate(target, None, PROMPT, max_new_tokens=4, tree=4)
    with pytest.raises(ValueError, match="tree = 0"):
        sd.generate(target, sd.PromptLookup(), PROMPT, max_new_tokens=4, tree=0)


def test_the_adaptive_tree_follows_the_cost_model() -> None:
    free = sd.AdaptiveTree(0.0, [1.0] * 9, budgets=(2, 4, 8), probe=1000)
    steep = sd.AdaptiveTree(0.0, [1.0 + n for n in range(9)], budgets=(2, 4, 8), probe=1000)
    for policy in (free, steep):
        tried = []
        for _ in range(3):  # each size once first, smallest first
            tried.append(policy.next_budget())
            policy.observe(tried[-1], depth=tried[-1] // 2, emitted=1 + tried[-1] // 4)
        assert tried == [2, 4, 8]
    # free verification: the biggest tree yields most; steep v(n): the smallest pays best
    free.tokens = {2: 1.5, 4: 2.0, 8: 3.0}
    free.rounds = {2: 1.0, 4: 1.0, 8: 1.0}
    steep.tokens, steep.rounds = dict(free.tokens), dict(free.rounds)
    assert free.next_budget() == 8
    assert steep.next_budget() == 2  # 1.5/3 = 0.5 against 2/5 and 3/9
    probing = sd.AdaptiveTree(0.0, [1.0] * 9, budgets=(2, 8), probe=2)
    probing.tokens, probing.rounds = {2: 1.0, 8: 5.0}, {2: 1.0, 8: 1.0}
    probing.last_tried = {2: 0, 8: 1}
    assert [probing.next_budget() for _ in range(2)] == [8, 2]  # round 2 probes the stale one
    with pytest.raises(ValueError, match="needs v\\(1..9\\)"):
        sd.AdaptiveTree(0.1, [1.0] * 4, budgets=(8,))


def test_adaptive_trees_keep_the_greedy_output(target: Any) -> None:
    policy = sd.AdaptiveTree(0.0, [1.0 + 0.1 * n for n in range(9)], budgets=(1, 4, 8), probe=4)
    plain, out = greedy_with_lookup_tree(target, policy)
    assert out.tokens == plain.tokens
    assert out.policy == "adaptive-tree" and out.k == 8
    assert sum(policy.rounds.values()) > 0
