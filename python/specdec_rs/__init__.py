"""specdec_rs: exact speculative decoding with a Rust core.

p = target, q = draft, k = γ (drafts per round).

>>> import numpy as np, specdec_rs as sd
>>> p = np.array([[0.5, 0.3, 0.2], [0.5, 0.3, 0.2]])
>>> q = np.array([[0.3, 0.3, 0.4]])
>>> out = sd.verify(p, q, np.array([1]), seed=0)   # draft 1 has p = q: always accepted
>>> int(out[0]), 1 <= len(out) <= 2
(1, True)
>>> round(sd.expected_tokens(0.8, 4), 4)
3.3616
"""

from specdec_rs._core import TREE_VARIANTS, VARIANTS, __version__
from specdec_rs.drafters import Draft, Drafter, DraftModel, EarlyExit, PromptLookup
from specdec_rs.generate import GenerationResult, generate
from specdec_rs.lab import speculative_step
from specdec_rs.policy import AdaptiveK, AdaptiveTree, BySource, FixedK, HeuristicK, KPolicy
from specdec_rs.processors import SamplingConfig, logits_to_probs
from specdec_rs.sim import (
    simulate,
    simulate_round_lengths,
    simulate_tree,
    simulate_tree_round_lengths,
)
from specdec_rs.theory import (
    acceptance_rate,
    best_k,
    break_even_cost,
    expected_speedup,
    expected_tokens,
    expected_tokens_per_position,
)
from specdec_rs.verify import row_seed, verify, verify_batch, verify_device, verify_tree

__all__ = [
    "AdaptiveK",
    "AdaptiveTree",
    "BySource",
    "FixedK",
    "HeuristicK",
    "KPolicy",
    "Draft",
    "DraftModel",
    "Drafter",
    "EarlyExit",
    "GenerationResult",
    "PromptLookup",
    "SamplingConfig",
    "generate",
    "logits_to_probs",
    "TREE_VARIANTS",
    "VARIANTS",
    "__version__",
    "acceptance_rate",
    "best_k",
    "break_even_cost",
    "expected_speedup",
    "expected_tokens",
    "expected_tokens_per_position",
    "row_seed",
    "simulate",
    "simulate_round_lengths",
    "simulate_tree",
    "simulate_tree_round_lengths",
    "speculative_step",
    "verify",
    "verify_batch",
    "verify_device",
    "verify_tree",
]
