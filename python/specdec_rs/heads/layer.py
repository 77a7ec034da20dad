"""One Llama-style decoder layer with an explicit KV cache and masks, the body
of the EAGLE-style head: RMSNorm -> grouped-query attention with RoPE ->
residual -> RMSNorm -> gated SiLU MLP -> residual.

Written out (instead of borrowing transformers' layer) so the drafter owns its
cache as two tensors (crop = slice), and so training can attend along the
diagonals of an unrolled draft ("training-time test", `unrolled_mask`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn import functional as F

if TYPE_CHECKING:
    from specdec_rs.kv_cache import PreallocatedLayer


@dataclass(frozen=True)
class LayerShape:
    """The sizes of one decoder layer (copied from the target's config)."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    rope_theta: float
    eps: float

    @classmethod
    def of(cls, config: Any) -> LayerShape:
        """The shape of one layer of a transformers Llama-like config."""
        rope = getattr(config, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        heads = config.num_attention_heads
        return cls(
            hidden=config.hidden_size,
            heads=heads,
            kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            intermediate=config.intermediate_size,
            rope_theta=float(theta),
            eps=float(getattr(config, "rms_norm_eps", 1e-6)),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def rope_tables(
    positions: torch.Tensor, d: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (B, 1, L, d) of the rotary embedding at `positions` (B, L),
    computed in float32, then cast to `dtype`; shared by queries and keys."""
    inv = theta ** (-torch.arange(0, d, 2, device=positions.device, dtype=torch.float32) / d)
    angles = positions.to(torch.float32)[:, None, :, None] * inv  # (B, 1, L, d/2)
    angles = torch.cat([angles, angles], -1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (the half-split convention of Llama).
    x: (B, heads, L, d); cos, sin: `rope_tables` at x's positions."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


class DecoderLayer(nn.Module):
    """x (B, L, H) -> (B, L, H). `forward` returns the layer's new keys and
    values (B, kv_heads, L, d) beside its output; the caller keeps the cache."""

    def __init__(self, shape: LayerShape):
        super().__init__()
        self.shape = shape
        h, d = shape.hidden, shape.head_dim
        self.input_norm = nn.RMSNorm(h, eps=shape.eps)
        self.q_proj = nn.Linear(h, shape.heads * d, bias=False)
        self.k_proj = nn.Linear(h, shape.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, shape.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(shape.heads * d, h, bias=False)
        self.post_norm = nn.RMSNorm(h, eps=shape.eps)
        self.gate_proj = nn.Linear(h, shape.intermediate, bias=False)
        self.up_proj = nn.Linear(h, shape.intermediate, bias=False)
        self.down_proj = nn.Linear(shape.intermediate, h, bias=False)

    def project(
        self, x: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rotated queries (B, heads, L, d) and keys, values (B, kv_heads, L, d)."""
        b, n, _ = x.shape
        s = self.shape
        h = self.input_norm(x)
        q = self.q_proj(h).view(b, n, s.heads, s.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(b, n, s.kv_heads, s.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(b, n, s.kv_heads, s.head_dim).transpose(1, 2)
        cos, sin = rope_tables(positions, s.head_dim, s.rope_theta, q.dtype)
        return rope(q, cos, sin), rope(k, cos, sin), v

    def finish(
        self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any
    ) -> torch.Tensor:
        """Attention of q over (k, v) under `mask` (bool, True = attend, or
        None = causal with q at the end of k), then the MLP; residuals."""
        b, n, _ = x.shape
        causal = mask is None and n > 1
        if causal and k.shape[2] != n:  # queries at the end of a longer cache
            mask = torch.ones(n, k.shape[2], dtype=torch.bool, device=x.device).tril(k.shape[2] - n)
            causal = False
        att = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True
        )
        x = x + self.o_proj(att.transpose(1, 2).reshape(b, n, -1))
        h = self.post_norm(x)
        out: torch.Tensor = x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))
        return out

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None = None,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """x (B, L, H) at `positions` (B, L), attending to `past` keys/values
        (B, kv_heads, P, d) and causally to itself unless `mask` (L, P + L)
        says otherwise. Returns (output, (keys, values) of the L new positions)."""
        q, k, v = self.project(x, positions)
        keys, values = (
            (k, v) if past is None else (torch.cat([past[0], k], 2), torch.cat([past[1], v], 2))
        )
        return self.finish(x, q, keys, values, mask), (k, v)

    def forward_into(
        self, x: torch.Tensor, positions: torch.Tensor, cache: PreallocatedLayer, at: int
    ) -> torch.Tensor:
        """`forward` (causal) after the first `at` entries of `cache` (a
        `kv_cache.PreallocatedLayer`: written in place, its capacity doubled
        when full), its L new keys and values written at at..at + L (entries
        past `at` are dropped first): the output only."""
        cache.rewind(at, "forward_into")
        q, k, v = self.project(x, positions)
        keys, values = cache.update(k, v)
        return self.finish(x, q, keys, values, None)


def unrolled_mask(length: int, depth: int, device: Any = None) -> torch.Tensor:
    """Attention mask of depth `depth` >= 2 of an unrolled draft, (L, depth * L)
    over the keys [depth 1 | depth 2 | ... | depth `depth`], each L long.

    Depth d's query at position j belongs to the round whose last true
    position is s = j - d + 1: it sees the true (depth-1) keys at positions
    <= s and that round's own depth-d' keys at j - (d - d') for 2 <= d' <= d,
    exactly what the decoding cache holds when it drafts there.
    """
    j = torch.arange(length, device=device)
    blocks = [j[None, :] <= (j[:, None] - depth + 1)]
    for d2 in range(2, depth + 1):
        blocks.append(j[None, :] == (j[:, None] - (depth - d2)))
    return torch.cat(blocks, 1)
