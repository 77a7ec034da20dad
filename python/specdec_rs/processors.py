"""Sampling processors applied identically to target and draft. p = target, q = draft.

Speculative sampling reproduces whatever distribution the target rows p hold,
so "sample from the target at temperature T with top-k/top-p/min-p" means p
must be the *processed* distribution, and the drafter's q must be the exact
distribution its drafts were drawn from. One function, `logits_to_probs`, makes
both; using it for only one model (or processing q differently from how the
draft was drawn) biases the output.

The order and tie rules follow transformers' warpers (temperature, top-k,
top-p, min-p), so p equals what ``model.generate(do_sample=True, ...)`` samples.
temperature = 0 means greedy: a one-hot row at the first argmax.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class SamplingConfig:
    """How logits become probabilities.

    temperature: 0 (greedy) or > 0.  top_k: keep the k largest logits (ties
    at the k-th value kept) or None.  top_p: keep the smallest set of tokens
    whose mass reaches top_p, in (0, 1], or None.  min_p: keep tokens with
    probability >= min_p * max probability, in [0, 1], or None.
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0:
            raise ValueError(
                f"temperature = {t!r} is invalid; expected a finite number >= 0 (0 means greedy)"
            )
        if self.top_k is not None and (
            isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 1
        ):
            raise ValueError(f"top_k = {self.top_k!r} is invalid; expected an integer >= 1 or None")
        if self.top_p is not None and not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p = {self.top_p!r} is outside (0, 1]; pass e.g. 0.9, or None")
        if self.min_p is not None and not (0.0 <= self.min_p <= 1.0):
            raise ValueError(f"min_p = {self.min_p!r} is outside [0, 1]; pass e.g. 0.05, or None")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def logits_to_probs(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """Processed probabilities, float32, same shape as `logits` (..., V).

    greedy: one-hot at argmax. Otherwise softmax(filter(logits / T)) where the
    filters mask tokens to -inf exactly as transformers' warpers do.
    """
    import torch

    logits = logits.float()
    if config.greedy:
        return one_hot(logits.argmax(dim=-1), logits.shape[-1])
    scores = logits / config.temperature if config.temperature != 1.0 else logits
    neg_inf = float("-inf")
    if config.top_k is not None and config.top_k < scores.shape[-1]:
        kth = torch.topk(scores, config.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, neg_inf)
    if config.top_p is not None and config.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative <= 1 - config.top_p
        drop_sorted[..., -1:] = False
        scores = scores.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), neg_inf)
    if config.min_p is not None and config.min_p > 0:
        probs = scores.softmax(dim=-1)
        drop = probs < config.min_p * probs.amax(dim=-1, keepdim=True)
        scores = scores.masked_fill(drop, neg_inf)
    return scores.softmax(dim=-1)


def one_hot(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """float32 rows (..., V) with a 1 at each token id."""
    import torch

    out = torch.zeros((*tokens.shape, vocab_size), dtype=torch.float32)
    return out.scatter_(-1, tokens.unsqueeze(-1), 1.0)


def sample(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token id per row of `probs` (n, V), drawn exactly from that row."""
    import torch

    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


class Sampler:
    """The one place that turns logits into rows and rows into tokens, for
    target and drafter alike: the first `vocab_size` logits are kept (padded
    LM heads), processed by `config`, and drawn with `generator`."""

    def __init__(self, config: SamplingConfig, vocab_size: int, generator: torch.Generator):
        self.config = config
        self.vocab_size = vocab_size
        self.generator = generator

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """(n, V') logits -> (n, vocab_size) float32 processed probabilities."""
        return logits_to_probs(logits[..., : self.vocab_size], self.config)

    def draw(
        self, probs: torch.Tensor, *, greedy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens (n,), q (n, V)): a sample of each row, and the row it was
        drawn from (one-hot at the argmax when `greedy`)."""
        if greedy or self.config.greedy:
            tokens = probs.argmax(dim=-1)
            return tokens, one_hot(tokens, probs.shape[-1])
        return sample(probs, self.generator), probs
