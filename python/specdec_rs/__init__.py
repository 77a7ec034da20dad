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

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

# Names load on first use (PEP 562), so `import specdec_rs` costs nearly
# nothing: the `specdec` command catches Ctrl-C around its own imports.
_EXPORTS = {
    "specdec_rs._core": ("TREE_VARIANTS", "VARIANTS", "__version__"),
    "specdec_rs.drafters": (
        "Draft",
        "Drafter",
        "DraftModel",
        "EarlyExit",
        "Lookahead",
        "PromptLookup",
        "SuffixDrafter",
    ),
    "specdec_rs.engine": ("BatchEngine", "Request", "generate_batch"),
    "specdec_rs.generation": ("GenerationResult", "PrefixCache", "Round", "generate"),
    "specdec_rs.lab": ("speculative_step",),
    "specdec_rs.policy": (
        "AdaptiveK",
        "AdaptiveTree",
        "BySource",
        "FixedK",
        "HeuristicK",
        "KPolicy",
        "Goodput",
        "MeasuredK",
    ),
    "specdec_rs.processors": ("SamplingConfig", "logits_to_probs"),
    "specdec_rs.sim": (
        "simulate",
        "simulate_round_lengths",
        "simulate_tree",
        "simulate_tree_round_lengths",
    ),
    "specdec_rs.theory": (
        "acceptance_rate",
        "best_k",
        "break_even_cost",
        "expected_speedup",
        "expected_tokens",
        "expected_tokens_per_position",
    ),
    "specdec_rs.verify": (
        "row_seed",
        "verify",
        "verify_batch",
        "verify_device",
        "verify_greedy",
        "verify_tree",
    ),
}
_HOME = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name: str) -> Any:
    """An exported name (from its module), or a submodule (`sd.drafters`)."""
    module = _HOME.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
    else:
        try:
            value = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))


class _Package(types.ModuleType):
    """Keeps `generate` and `verify` the functions: importing a submodule
    sets it as its package's attribute, and these two share their modules'
    names (as they did when this file imported them eagerly)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _HOME and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


if TYPE_CHECKING:
    from specdec_rs._core import TREE_VARIANTS, VARIANTS, __version__
    from specdec_rs.drafters import (
        Draft,
        Drafter,
        DraftModel,
        EarlyExit,
        Lookahead,
        PromptLookup,
        SuffixDrafter,
    )
    from specdec_rs.engine import BatchEngine, Request, generate_batch
    from specdec_rs.generation import GenerationResult, PrefixCache, Round, generate
    from specdec_rs.lab import speculative_step
    from specdec_rs.policy import (
        AdaptiveK,
        AdaptiveTree,
        BySource,
        FixedK,
        Goodput,
        HeuristicK,
        KPolicy,
        MeasuredK,
    )
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
    from specdec_rs.verify import (
        row_seed,
        verify,
        verify_batch,
        verify_device,
        verify_greedy,
        verify_tree,
    )


__all__ = [
    "AdaptiveK",
    "AdaptiveTree",
    "BySource",
    "FixedK",
    "HeuristicK",
    "Goodput",
    "KPolicy",
    "MeasuredK",
    "Draft",
    "DraftModel",
    "Drafter",
    "EarlyExit",
    "GenerationResult",
    "Lookahead",
    "PromptLookup",
    "SuffixDrafter",
    "Round",
    "SamplingConfig",
    "BatchEngine",
    "PrefixCache",
    "Request",
    "generate",
    "generate_batch",
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
    "verify_greedy",
    "verify_tree",
]
