"""Medusa-style heads: m residual blocks on the target's last hidden state,
head i (1-based) predicting the token i positions past the one the target's
own LM head predicts from the same feature. p = target, q = draft.

From f_j (which the target decodes into x_{j+1}), head i gives
W_D (f_j + SiLU(A_i f_j + b_i)), logits over the draft vocabulary for
x_{j+1+i}. A_i starts at zero, so every head starts as the target's own
LM head restricted to the draft vocabulary.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F


class MedusaHeads(nn.Module):
    kind = "medusa"
    draft_vocab: torch.Tensor

    def __init__(
        self, hidden: int, num_heads: int, draft_vocab: torch.Tensor, vocab_rows: nn.Module
    ):
        super().__init__()
        self.hidden = hidden
        blocks = [nn.Linear(hidden, hidden) for _ in range(num_heads)]
        for block in blocks:
            nn.init.zeros_(block.weight)
            nn.init.zeros_(block.bias)
        self.blocks = nn.ModuleList(blocks)
        self.register_buffer("draft_vocab", draft_vocab.to(torch.long), persistent=True)
        # the draft vocabulary's LM-head rows (heads.vocab.draft_vocab_rows; not saved)
        self.vocab_rows = vocab_rows

    @property
    def num_heads(self) -> int:
        return len(self.blocks)

    def block(self, f: torch.Tensor, i: int) -> torch.Tensor:
        """(..., H) -> (..., H): head i + 1's residual block, f + SiLU(A_i f + b_i)."""
        block: nn.Linear = self.blocks[i]  # type: ignore[assignment]
        f = f.to(block.weight.dtype)
        out: torch.Tensor = f + F.silu(block(f))
        return out

    def features(self, f: torch.Tensor, heads: int | None = None) -> torch.Tensor:
        """(..., H) -> (..., m', H): each head's residual block applied to f
        (the first `heads` heads, all by default)."""
        return torch.stack([self.block(f, i) for i in range(heads or self.num_heads)], -2)

    def logits(self, f: torch.Tensor, heads: int | None = None) -> torch.Tensor:
        """(..., H) -> (..., m', N) logits over the draft vocabulary."""
        out: torch.Tensor = self.vocab_rows(self.features(f, heads))
        return out

    def head_logits(self, f: torch.Tensor, i: int) -> torch.Tensor:
        """(..., H) -> (..., N): head i + 1 alone."""
        out: torch.Tensor = self.vocab_rows(self.block(f, i))
        return out

    def config(self) -> dict[str, Any]:
        return {
            "hidden": self.hidden,
            "num_heads": self.num_heads,
            "draft_vocab_size": int(self.draft_vocab.numel()),
        }
