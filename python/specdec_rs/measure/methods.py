"""How a measured run drafts: a `Method` (engine, typed γ policy, k) and the
policy object it runs with. p = target, q = draft, k = γ.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from specdec_rs.measure.costs import Costs, window_positions
from specdec_rs.policy import AdaptiveK, AdaptiveTree, BySource, HeuristicK, KPolicy
from specdec_rs.policy import measured_policy as default_policy


class Policy(str, Enum):
    """How a run's γ is chosen: "none" (target only), "fixed" (k drafts a
    round), "adaptive" (AdaptiveK from the measured costs, one per source
    for a drafter made of parts), "adaptive-pooled" (one AdaptiveK for every
    source: the ablation of "adaptive"), "measured" (MeasuredK, its costs
    measured as it runs, at most k drafts), "heuristic" (HeuristicK), "tree"
    (draft trees of k nodes a round), "adaptive-tree" (AdaptiveTree over tree
    sizes up to k), "default" (transformers' own schedule)."""

    NONE = "none"
    FIXED = "fixed"
    ADAPTIVE = "adaptive"
    ADAPTIVE_POOLED = "adaptive-pooled"
    MEASURED = "measured"
    HEURISTIC = "heuristic"
    TREE = "tree"
    ADAPTIVE_TREE = "adaptive-tree"
    DEFAULT = "default"


# the policies `specdec bench --policies` takes (fixed γ and trees have flags of their own)
POLICIES = (Policy.ADAPTIVE, Policy.HEURISTIC, Policy.ADAPTIVE_POOLED, Policy.MEASURED)
DEFAULT_POLICIES = (Policy.ADAPTIVE, Policy.HEURISTIC)
TREE_SIZES = (2, 4, 6, 8, 12, 16)  # the budgets an adaptive tree chooses among (<= k)


@dataclass(frozen=True)
class Method:
    """How a run drafts. engine: "specdec" (this loop) or "transformers"
    (its generate()); policy: a `Policy` (a name is converted); k: the fixed
    γ, the tree size, or the most γ / nodes an adaptive policy may use."""

    engine: str
    policy: Policy
    k: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "policy", Policy(self.policy))

    @property
    def label(self) -> str:
        name = {
            Policy.NONE: "target-only",
            Policy.FIXED: f"k={self.k}",
            Policy.TREE: f"tree={self.k}",
            Policy.MEASURED: f"measured (k <= {self.k})",
            Policy.ADAPTIVE_TREE: f"adaptive tree (<= {self.k} nodes)",
        }.get(self.policy, self.policy.value)
        return name if self.engine == "specdec" else f"transformers {name}".replace(" default", "")

    def k_policy(self, costs: Costs | None, spec: str, drafter: Any, k_max: int) -> int | KPolicy:
        """The `generate(k=...)` of this method for `drafter` (spec `spec`)."""
        if self.policy == Policy.MEASURED:
            return default_policy(drafter, self.k or k_max) if drafter is not None else 1
        if self.policy == Policy.HEURISTIC:
            return HeuristicK()
        if self.policy in (Policy.ADAPTIVE, Policy.ADAPTIVE_POOLED):
            assert costs is not None, "adaptive policies need measured costs"
            pooled = self.policy == Policy.ADAPTIVE_POOLED
            return adaptive_policy(costs, spec, drafter, k_max, pooled=pooled)
        return self.k or 1

    def tree_policy(
        self, costs: Costs | None, spec: str, drafter: Any = None
    ) -> int | AdaptiveTree | None:
        """The `generate(tree=...)` of this method (None: chains)."""
        if self.policy == Policy.TREE:
            return self.k
        if self.policy != Policy.ADAPTIVE_TREE:
            return None
        assert costs is not None, "adaptive trees need measured costs"
        v = drafter_verify_cost(costs, drafter)
        sizes = [b for b in TREE_SIZES if b <= (self.k or 8)]
        usable = [b for b in sizes if b + 1 <= len(v)] or [1]
        return AdaptiveTree(costs.cost_ratio[spec], v, budgets=usable)


def drafter_verify_cost(costs: Costs, drafter: Any) -> list[float]:
    """v(n) as `drafter`'s rounds pay it: v(n + E) for a drafter whose window
    adds E positions to each drafting round (`costs.window_positions`)."""
    return costs.verify_cost[window_positions(drafter) :]


def adaptive_policy(
    costs: Costs, spec: str, drafter: Any, k_max: int, *, pooled: bool = False
) -> KPolicy:
    """AdaptiveK from the measured c and v(n); for a drafter made of parts one
    per source, each with its part's c (unless `pooled`)."""
    parts = costs.part_cost_ratio.get(spec)
    v = drafter_verify_cost(costs, drafter)
    if parts and not pooled and getattr(drafter, "parts", None):
        return BySource({name: AdaptiveK(c, v, k_max=k_max) for name, c in parts.items()})
    return AdaptiveK(costs.cost_ratio[spec], v, k_max=k_max)


TARGET_ONLY = Method("specdec", Policy.NONE)

__all__ = [
    "DEFAULT_POLICIES",
    "POLICIES",
    "TARGET_ONLY",
    "Method",
    "Policy",
    "adaptive_policy",
]
