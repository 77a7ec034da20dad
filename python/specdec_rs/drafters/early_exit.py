"""Self-speculation from an early layer of the target. p = target, q = draft, k = γ."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specdec_rs import _checks, models, runner
from specdec_rs.drafters.base import ModelDrafter, draft_autoregressive, started
from specdec_rs.drafters.draft import Draft
from specdec_rs.drafters.registry import register
from specdec_rs.processors import Sampler

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel
    from transformers.cache_utils import Cache


@register("early-exit", arg="layers", help="the target's first L layers, sharing its cache")
class EarlyExit(ModelDrafter):
    """The target's first L layers, its final norm and LM head.

    No second model and no second cache. The first L layers' keys and values
    for the accepted text are exactly the target's own (same weights, same
    inputs), so the drafter reads the target's cache for them and writes its
    draft positions into those L layers only; before the target's forward it
    cuts those layers back, so the cache again holds accepted text only.
    Drafting costs k passes through L layers; nothing is ever recomputed for
    accepted tokens (a separate L-layer model would have to catch up on them).
    """

    def __init__(self, target: PreTrainedModel, num_layers: int, *, greedy: bool = False):
        self.view = models.layer_view(target, num_layers)
        self.target = target
        self.num_layers = int(num_layers)
        self.greedy = _checks.boolean(greedy, "greedy")
        self.name = f"early-exit:{self.num_layers}"
        self._cache: Cache | None = None

    @classmethod
    def from_spec(cls, arg: Any, target: Any, tokenizer: Any, greedy: bool) -> EarlyExit:
        return cls(target, arg, greedy=greedy)

    @property
    def scorer(self) -> PreTrainedModel:
        return self.view

    def check_target(self, target: PreTrainedModel) -> None:
        if target is not self.target:
            raise ValueError(
                f"drafter {self.name} was built on another model: an early exit shares the "
                "target's layers and cache; build it from this target: EarlyExit(target, L)"
            )

    def start(
        self, seq: torch.Tensor, target_cache: Cache, target_hidden: torch.Tensor | None = None
    ) -> None:
        self._cache = target_cache

    def propose(self, seq: torch.Tensor, k: int, sampler: Sampler) -> Draft:
        cache = started(self._cache, self.name)
        committed = cache.get_seq_length()
        draft = draft_autoregressive(self.view, cache, seq[committed:], k, sampler, self.greedy)
        runner.crop(cache, committed, layers=range(self.num_layers))
        return draft

    def update(
        self, seq: torch.Tensor, num_accepted: int, target_hidden: torch.Tensor | None = None
    ) -> None:
        pass  # the target's cache is cut by the decoder

    def hf_kwargs(self) -> dict[str, Any] | None:
        return {"assistant_early_exit": self.num_layers}
