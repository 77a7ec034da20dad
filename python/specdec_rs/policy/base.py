"""What a γ policy is and how the loop hands it a round. p = target, q = draft, k = γ.

A policy sees only what past rounds did, so changing γ between rounds keeps the
output exact: each round is an exact speculative step whatever k it uses.

A chain policy has a `name`, `reset()`, `next_k()` and `observe(k, drafted,
num_accepted)`; a tree policy `name`, `reset()`, `next_budget()` and
`observe(budget, depth, emitted)`. The loop hands each finished round, a
`generation.Round`, to the policy's `observe_round(round)`: the built-in
policies derive from `ChainPolicy` / `TreePolicy`, which map the round onto
`observe`; `chain.as_policy` and `tree.as_tree_policy` give any other object
with the methods above the same `observe_round` (`Foreign`). A chain policy
sees a round through one rule, `chain_counts`, and a tree policy through
`tree_counts`, whichever kind it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from specdec_rs.rounds import Round

MAX_K = 1024  # the most drafts a policy may ask for in one round
MAX_TREE = 4096  # the most nodes of a draft tree


class KPolicy(Protocol):
    name: str

    def reset(self) -> None:
        """Forget past rounds: generate() calls it first, so one policy object
        reused across calls gives the same output for the same seed."""
        ...

    def next_k(self) -> int:
        """Drafts to request this round (the decoder caps it by the budget)."""
        ...

    def observe(self, k: int, drafted: int, num_accepted: int) -> None:
        """The round asked for k, got `drafted` proposals, kept `num_accepted`."""
        ...

    def observe_round(self, r: Round) -> None:
        """What the round did (`as_policy` supplies it where a policy has none)."""
        ...


def chain_counts(r: Round) -> tuple[int, int, int]:
    """What a round tells a chain policy's `observe`: (k asked, the drafts it
    counts (`Round.policy_drafted`: with a lookahead window, asked), drafts kept)."""
    return r.asked, r.policy_drafted, r.accepted


def tree_counts(r: Round) -> tuple[int, int, int]:
    """What a round tells a tree policy's `observe`: (node budget, the tree's
    depth, tokens emitted)."""
    return r.asked, r.depth, len(r.emitted)


class ChainPolicy:
    """Base of the built-in γ policies: a round reaches `observe` as
    `chain_counts(round)`."""

    name: str

    def observe(self, k: int, drafted: int, num_accepted: int) -> None:
        raise NotImplementedError

    def observe_round(self, r: Round) -> None:
        self.observe(*chain_counts(r))


class TreePolicy:
    """Base of the built-in tree policies: a round reaches `observe` as
    `tree_counts(round)`."""

    name: str

    def observe(self, budget: int, depth: int, emitted: int) -> None:
        raise NotImplementedError

    def observe_round(self, r: Round) -> None:
        self.observe(*tree_counts(r))


class Foreign:
    """Another object with a policy's methods, seen through `observe_round`
    (its own attributes, e.g. `use` or `k`, stay reachable)."""

    def __init__(self, inner: Any, tree: bool):
        self.inner, self.tree = inner, tree

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "tree"):  # not set yet (e.g. while unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def observe_round(self, r: Round) -> None:
        if self.tree:
            self.inner.observe(*tree_counts(r))
            return
        self.inner.observe(*chain_counts(r))
        timed = getattr(self.inner, "observe_time", None)  # a policy that measures its costs
        if callable(timed):
            timed(r.draft_s, r.target_s, r.policy_positions)


def is_policy(obj: Any, methods: tuple[str, ...], what: str) -> bool:
    if not all(callable(getattr(obj, m, None)) for m in methods):
        return False
    if not isinstance(getattr(obj, "name", None), str):
        raise ValueError(f"the {what} {obj!r} needs a `name` string attribute")
    return True
