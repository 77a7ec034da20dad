"""The draft vocabulary's rows of the target's LM head, as the module a
head decodes its features with: (..., H) -> (..., N) logits over the draft
vocabulary D. p = target, q = draft.

For a float target it holds the rows transposed (H, N) (a one-token product
with this layout ran 2.8x faster at N = 8,192 on the CPU than the (N, H)
layout: BENCHMARKS.md); for a GGUF target it is a `QuantLinear` of the rows
at the file's precision (the Q8_0 head's rows, read by the same kernel as
the target's own head). Neither is saved with a head: the rows are the
target's, taken at load time.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class VocabRows(nn.Module):
    """f (..., H) -> f · W_Dᵀ (..., N) for float rows W_D (N, H)."""

    head_cols: torch.Tensor

    def __init__(self, rows: torch.Tensor):
        super().__init__()
        self.register_buffer("head_cols", rows.T.contiguous(), persistent=False)
        self.out_features = int(rows.shape[0])

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        return f @ self.head_cols.to(f.dtype)


def draft_vocab_rows(lm_head: Any, draft_vocab: torch.Tensor) -> nn.Module:
    """The module of `draft_vocab`'s rows of `lm_head` (see the module docs)."""
    select = getattr(lm_head, "select_rows", None)
    if callable(select):
        return select(draft_vocab)  # type: ignore[no-any-return]
    weight = lm_head.weight.detach()
    return VocabRows(weight[draft_vocab.to(weight.device)])
