"""transformers' own generation, timed the same way, for like-for-like baselines.

``model.generate`` target-only, with ``assistant_model=`` (a draft model),
``prompt_lookup_num_tokens=`` (prompt lookup) or ``assistant_early_exit=``
(self-speculation from an early layer). Target passes are counted with a
forward pre-hook, so tokens per pass compares directly with ours.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specdec_rs.processors import SamplingConfig
from specdec_rs.timing import Throughput

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel


@dataclass(frozen=True)
class HFResult(Throughput):
    tokens: list[int]
    time_total: float
    target_passes: int

    @property
    def tokens_per_pass(self) -> float:
        """New tokens per target forward, the prefill not counted."""
        decode_passes = self.target_passes - 1
        return self.new_tokens / decode_passes if decode_passes > 0 else float(self.new_tokens)


def sampling_kwargs(config: SamplingConfig) -> dict[str, Any]:
    """generate() keywords for the same processors (greedy at temperature 0)."""
    if config.greedy:
        return {"do_sample": False, "temperature": None, "top_k": None, "top_p": None}
    return {
        "do_sample": True,
        "temperature": config.temperature,
        "top_k": config.top_k or 0,
        "top_p": config.top_p if config.top_p is not None else 1.0,
        "min_p": config.min_p,
    }


def hf_generate(
    target: PreTrainedModel,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    config: SamplingConfig,
    seed: int = 0,
    eos_token_id: list[int] | None = None,
    **strategy: Any,
) -> HFResult:
    """Time ``target.generate`` on one prompt (n,); `strategy` holds e.g.
    ``assistant_model=``, ``prompt_lookup_num_tokens=`` or ``assistant_early_exit=``."""
    import torch

    from specdec_rs import _checks, models

    models.check_model(target, "target")
    if not isinstance(config, SamplingConfig):
        raise ValueError(f"config is a {type(config).__name__}; expected a SamplingConfig")
    max_new_tokens = _checks.integer(max_new_tokens, "max_new_tokens", minimum=1)
    seed = _checks.seed(seed)
    passes = [0]

    def count(*_: Any) -> None:
        passes[0] += 1

    hook = target.register_forward_pre_hook(count)
    eos = list(eos_token_id) if eos_token_id is not None else None
    try:
        torch.manual_seed(seed % 2**63)
        start = time.perf_counter()
        device = models.device_of(target)
        with torch.inference_mode():
            out = target.generate(
                input_ids.to(device).unsqueeze(0),
                attention_mask=torch.ones(1, len(input_ids), dtype=torch.long, device=device),
                max_new_tokens=max_new_tokens,
                eos_token_id=eos or None,
                pad_token_id=(eos or [0])[0],
                **sampling_kwargs(config),
                **strategy,
            )
        elapsed = time.perf_counter() - start
    finally:
        hook.remove()
    return HFResult(out[0, len(input_ids) :].tolist(), elapsed, passes[0])


def strategy(drafter: Any, k: int | None = None) -> dict[str, Any] | None:
    """transformers' generate() keywords for drafting like `drafter` (its own
    `hf_kwargs`); with k, a constant k drafts per round (prompt lookup: k
    tokens). None when transformers has no equivalent."""
    kwargs = drafter.hf_kwargs() if drafter is not None else {}
    if kwargs is None or k is None:
        return kwargs
    if "prompt_lookup_num_tokens" in kwargs:
        return {"prompt_lookup_num_tokens": k}
    return kwargs | {"num_assistant_tokens": k, "num_assistant_tokens_schedule": "constant"}
