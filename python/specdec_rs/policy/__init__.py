"""γ policies (drafts per round) and tree policies (nodes per round). p = target, q = draft.

A new policy is one file: a class with `name`, `reset`, `next_k` and `observe`
(see `base`), passed as ``generate(..., k=policy)``.
"""

from specdec_rs.policy.base import MAX_K, MAX_TREE, ChainPolicy, KPolicy, TreePolicy
from specdec_rs.policy.chain import AdaptiveK, BySource, FixedK, HeuristicK, as_policy
from specdec_rs.policy.goodput import ForwardProfile, Goodput
from specdec_rs.policy.measured import MeasuredK, measured_policy
from specdec_rs.policy.tree import AdaptiveTree, FixedTree, as_tree_policy

__all__ = [
    "MAX_K",
    "MAX_TREE",
    "AdaptiveK",
    "AdaptiveTree",
    "BySource",
    "ChainPolicy",
    "FixedK",
    "FixedTree",
    "ForwardProfile",
    "Goodput",
    "HeuristicK",
    "KPolicy",
    "MeasuredK",
    "TreePolicy",
    "as_policy",
    "as_tree_policy",
    "measured_policy",
]
