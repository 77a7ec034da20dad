"""A separate, smaller causal LM with its own KV cache. p = target, q = draft, k = γ."""

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


@register(
    "model",
    arg="path",
    help="a local transformers folder or GGUF file with the target's tokenizer",
)
class DraftModel(ModelDrafter):
    """Its cache holds a prefix of `seq`; each round feeds what it has not seen
    (the last token, or the last two after a round that accepted every draft),
    then drafts. After the round the cache is cut to the accepted length.

    The cache starts empty: the first propose() runs the prompt (its
    catch-up), so a generation whose γ policy never drafts never pays for
    it. `catch_up(seq)` says how many positions that is and
    `step_seconds()` what one draft step costs, for the policy to judge
    whether the drafts can repay it (`policy.MeasuredK.observe_start`).
    """

    def __init__(self, model: PreTrainedModel, *, greedy: bool = False, name: str = "model"):
        self.model = models.check_model(model, "DraftModel's model")
        self.greedy = _checks.boolean(greedy, "greedy")
        if not isinstance(name, str) or not name:
            raise ValueError(f"name = {name!r} must be a non-empty string")
        self.name = name
        self.vocab_size = models.vocab_of(model)
        self._cache: Cache | None = None

    @classmethod
    def from_spec(cls, arg: Any, target: Any, tokenizer: Any, greedy: bool) -> DraftModel:
        """``model:PATH``: a local transformers folder, or a GGUF file at its
        own precision (`gguf.load_gguf`, the target's activation mode), with
        the target's tokenizer (the same string for every id; checked when
        the target's tokenizer is given; the LM heads' sizes are checked
        when the generation starts)."""
        from pathlib import Path

        if isinstance(arg, str) and Path(arg).suffix.lower() == ".gguf":
            from specdec_rs.gguf import load_gguf
            from specdec_rs.gguf.model import activations_of, cache_type_of

            models.weights_choice("gguf", models.dtype_of(target), models.device_of(target))
            draft, draft_tokenizer = load_gguf(
                arg,
                tokenizer=tokenizer is not None,
                activations=activations_of(target),
                cache_type=cache_type_of(target),
            )
        else:
            draft, draft_tokenizer = models.load_local(
                arg, dtype=models.dtype_of(target), device=models.device_of(target)
            )
        if tokenizer is not None:
            models.check_same_tokenizer(tokenizer, draft_tokenizer)
        return cls(draft, greedy=greedy, name=f"model:{arg}")

    @property
    def scorer(self) -> PreTrainedModel:
        return self.model

    def check_target(self, target: PreTrainedModel) -> None:
        if models.device_of(self.model) != models.device_of(target):
            raise ValueError(
                f"drafter {self.name} is on {models.device_of(self.model)} but the target on "
                f"{models.device_of(target)}; move both to one device"
            )

    def start(
        self, seq: torch.Tensor, target_cache: Cache, target_hidden: torch.Tensor | None = None
    ) -> None:
        self._cache = runner.new_cache(self.model)

    def catch_up(self, seq: torch.Tensor) -> int:
        """Positions of `seq` the next propose() runs beyond a round's usual
        one or two (the prompt, before the first draft)."""
        seen = started(self._cache, self.name).get_seq_length()
        return max(0, len(seq) - 2 - int(seen))

    def step_seconds(self, repeats: int = 2) -> float:
        """Seconds of one draft step (one position into a fresh cache), the
        fastest of `repeats`: the draft cost before any catch-up is paid."""
        import time

        import torch

        token = torch.zeros(1, dtype=torch.long, device=models.device_of(self.model))
        best = float("inf")
        with torch.inference_mode():
            for _ in range(repeats):
                cache = runner.new_cache(self.model)
                started_at = time.perf_counter()
                runner.forward(self.model, token, cache, keep=1)
                best = min(best, time.perf_counter() - started_at)
        return best

    def propose(self, seq: torch.Tensor, k: int, sampler: Sampler) -> Draft:
        cache = started(self._cache, self.name)
        seen = cache.get_seq_length()
        return draft_autoregressive(self.model, cache, seq[seen:], k, sampler, self.greedy)

    def update(
        self, seq: torch.Tensor, num_accepted: int, target_hidden: torch.Tensor | None = None
    ) -> None:
        cache = started(self._cache, self.name)
        runner.crop(cache, min(cache.get_seq_length(), len(seq) + num_accepted))

    def hf_kwargs(self) -> dict[str, Any] | None:
        return {"assistant_model": self.model}


@register("truncated", arg="layers", help="a separate model made of the target's first L layers")
class Truncated(DraftModel):
    """``truncated:L``: a `DraftModel` sharing the target's first L layers,
    final norm and LM head (no copy), with a cache of its own."""

    @classmethod
    def from_spec(cls, arg: Any, target: Any, tokenizer: Any, greedy: bool) -> Truncated:
        return cls(models.layer_view(target, arg), greedy=greedy, name=f"truncated:{arg}")
