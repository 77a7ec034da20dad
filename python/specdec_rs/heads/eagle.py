"""The EAGLE-style head: predicts the target's next last-layer feature from
[feature, embedding of the next token], decoded by the target's own LM-head
rows of a reduced draft vocabulary. p = target, q = draft.

Notation: f_j is the target's last hidden state at position j (after its final
norm: the LM head's input), x_j the token at position j. The head's entry at
position j reads (f_j, e(x_{j+1})) and outputs f̂_{j+1}; its logits over the
draft vocabulary, W_D f̂_{j+1}, predict x_{j+2}. At draft depth >= 2 the input
feature is the head's own previous output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from specdec_rs.heads.layer import DecoderLayer, LayerShape, unrolled_mask

if TYPE_CHECKING:
    from specdec_rs.kv_cache import PreallocatedLayer


class EagleHead(nn.Module):
    """fc: [f, e] (2H) -> H, then one decoder layer. Frozen target pieces
    are used, never saved: `embed`, the target's input embedding (a module
    ids -> (..., H), not a submodule of the head), and `vocab_rows`, the
    draft vocabulary's LM-head rows (`heads.vocab.draft_vocab_rows`)."""

    kind = "eagle"
    draft_vocab: torch.Tensor
    embed: Any

    def __init__(
        self,
        shape: LayerShape,
        draft_vocab: torch.Tensor,
        embed: Any,
        vocab_rows: nn.Module,
    ):
        super().__init__()
        self.shape = shape
        self.fc = nn.Linear(2 * shape.hidden, shape.hidden, bias=False)
        self.layer = DecoderLayer(shape)
        self.register_buffer("draft_vocab", draft_vocab.to(torch.long), persistent=True)
        object.__setattr__(self, "embed", embed)  # the target's: not saved, not moved
        self.vocab_rows = vocab_rows

    def inputs(self, features: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
        """(B, L, H) features and (B, L) next tokens -> (B, L, H) layer input."""
        with torch.no_grad():  # the target's embedding is frozen
            e = self.embed(next_tokens).to(self.fc.weight.dtype)
        out: torch.Tensor = self.fc(torch.cat([features.to(e.dtype), e], -1))
        return out

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """(..., H) predicted features -> (..., N) logits over the draft vocabulary."""
        out: torch.Tensor = self.vocab_rows(features)
        return out

    def step(
        self,
        features: torch.Tensor,
        next_tokens: torch.Tensor,
        positions: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Decoding: L new entries after the cache `past` (causal among
        themselves). Returns predicted features (B, L, H) and the new keys/values."""
        return self.layer.forward(self.inputs(features, next_tokens), positions, past)

    def step_into(
        self,
        features: torch.Tensor,
        next_tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: PreallocatedLayer,
        at: int,
    ) -> torch.Tensor:
        """`step` (B = 1) after the first `at` entries of `cache`, the new
        keys and values written in it (`DecoderLayer.forward_into`)."""
        return self.layer.forward_into(self.inputs(features, next_tokens), positions, cache, at)

    def unroll(
        self, features: torch.Tensor, tokens: torch.Tensor, depth: int
    ) -> list[torch.Tensor]:
        """Training and teacher forcing: the drafts of every round at once.

        features (B, L, H) true f_j; tokens (B, L + 1) with tokens[:, j + 1] =
        x_{j+1}. Returns `depth` tensors (B, L, H): element d - 1 holds at
        position j the depth-d prediction f̂_{j+1} of the round whose last
        true position is j - d + 1 (its inputs: true features and keys up to
        that position, then the round's own predictions), so its logits
        predict x_{j+2} as the decoding loop's d-th draft would.
        """
        b, n, _ = features.shape
        positions = torch.arange(n, device=features.device).expand(b, n)
        x = self.inputs(features, tokens[:, 1 : n + 1])
        q, k, v = self.layer.project(x, positions)
        out = self.layer.finish(x, q, k, v, None)
        outputs, keys, values = [out], [k], [v]
        for d in range(2, depth + 1):
            shifted = torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], 1)  # f̂_j at j
            x = self.inputs(shifted, tokens[:, 1 : n + 1])
            q, k, v = self.layer.project(x, positions)
            keys.append(k)
            values.append(v)
            mask = unrolled_mask(n, d, features.device)
            out = self.layer.finish(x, q, torch.cat(keys, 2), torch.cat(values, 2), mask)
            outputs.append(out)
        return outputs

    def config(self) -> dict[str, Any]:
        return {"shape": self.shape.to_dict(), "draft_vocab_size": int(self.draft_vocab.numel())}
