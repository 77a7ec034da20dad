"""Tree policies: how many nodes each round's draft tree may have. p = target, q = draft.

- `FixedTree(budget)`: the same budget every round (``generate(..., tree=8)``).
- `AdaptiveTree(cost_ratio, verify_cost)`: the budget with the most tokens per
  unit time, from what the trees have been yielding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specdec_rs import _checks
from specdec_rs.policy.base import MAX_TREE, Foreign, TreePolicy, is_policy


class FixedTree(TreePolicy):
    """Trees of at most `budget` nodes every round."""

    def __init__(self, budget: int):
        self.k = _checks.integer(budget, "tree", minimum=1, maximum=MAX_TREE)
        self.name = f"tree:{self.k}"

    def reset(self) -> None:
        pass

    def next_budget(self) -> int:
        return self.k

    def observe(self, budget: int, depth: int, emitted: int) -> None:
        pass


class AdaptiveTree(TreePolicy):
    """Nodes per round for tree decoding (`generate(..., tree=AdaptiveTree(...))`),
    from the cost model and what the trees have been yielding.

    A round with a tree of b nodes, drafted in d head steps, costs
    d·c + v(b + 1) target-step units (`verify_cost` = v(1), v(2), ...: the
    measured cost of a target forward over n positions relative to one).
    Its tokens are measured: a decayed mean of the tokens emitted by rounds
    with b nodes. Each budget in `budgets` is tried once first; then the
    budget with the most tokens per unit time is used, and every `probe`
    rounds the budget tried least recently runs once so its estimate can
    recover. Like the γ policies it sees only past rounds, so the output
    stays exact.
    """

    def __init__(
        self,
        cost_ratio: float,
        verify_cost: Sequence[float],
        *,
        budgets: Sequence[int] = (2, 4, 6, 8),
        decay: float = 0.95,
        probe: int = 16,
    ):
        self.c = _checks.real(
            cost_ratio, "cost_ratio", minimum=0.0, hint=" (draft step / target step)"
        )
        self.budgets = sorted(set(_checks.integers(budgets, "budgets", minimum=1)))
        if not self.budgets:
            raise ValueError("budgets is empty; give tree sizes (nodes per round), e.g. (2, 4, 8)")
        self.v = _checks.reals(verify_cost, "verify_cost", above=0.0)
        if len(self.v) < self.budgets[-1] + 1:
            raise ValueError(
                f"verify_cost has {len(self.v)} entries v(1..{len(self.v)}); a tree of "
                f"{self.budgets[-1]} nodes needs v(1..{self.budgets[-1] + 1})"
            )
        self.decay = _checks.real(decay, "decay", above=0.0, maximum=1.0)
        self.probe = _checks.integer(probe, "probe", minimum=1)
        self.name = "adaptive-tree"
        self.reset()

    @property
    def k(self) -> int:
        return self.budgets[-1]

    def reset(self) -> None:
        self.tokens = {b: 0.0 for b in self.budgets}
        self.rounds = {b: 0.0 for b in self.budgets}
        self.depth = {b: 0.0 for b in self.budgets}
        self.last_tried = {b: -1 for b in self.budgets}
        self.round = 0

    def rate(self, b: int) -> float:
        """Estimated tokens per target-step unit with b nodes (inf before any round)."""
        if self.rounds[b] == 0:
            return float("inf")
        tokens = self.tokens[b] / self.rounds[b]
        depth = self.depth[b] / self.rounds[b]
        return tokens / (depth * self.c + self.v[b])

    def next_budget(self) -> int:
        self.round += 1
        if self.round % self.probe == 0:
            return min(self.budgets, key=lambda b: self.last_tried[b])
        return max(self.budgets, key=lambda b: (self.rate(b), -b))

    def observe(self, budget: int, depth: int, emitted: int) -> None:
        for b in self.budgets:
            self.tokens[b] *= self.decay
            self.rounds[b] *= self.decay
            self.depth[b] *= self.decay
        if budget in self.tokens:
            self.tokens[budget] += emitted
            self.rounds[budget] += 1
            self.depth[budget] += depth
            self.last_tried[budget] = self.round


def as_tree_policy(tree: Any) -> Any:
    """An integer budget is FixedTree(budget); a tree policy is checked for
    the methods generate() calls."""
    if is_policy(tree, ("next_budget", "observe", "reset"), "tree policy"):
        return tree if callable(getattr(tree, "observe_round", None)) else Foreign(tree, True)
    return FixedTree(_checks.integer(tree, "tree", minimum=1, maximum=MAX_TREE))
