"""The target forward of a batch round: blocks[s] (n_s,) after caches[s]
(each row its own `PreallocatedCache`), every row in one pass.

One `Backend` per kind of target (`backend_of`):
- `StackRows` ("gguf"): a GGUF model on the CPU. One Rust call for the whole
  stack (`runner.stack`), the products over all N = Σ n_s rows at once,
  attention per row over its own cache, so the weights are read once per
  step for the whole batch. Every value of a row is computed from that row
  alone in a fixed order, so a row's logits are the same bits in a batch as
  alone (`runner.forward_with_hidden`).
- `LlamaRows` ("llama"): a transformers Llama (`LlamaDecoderLayer`s) at any
  dtype and on any device: the model's own modules, the norms, projections
  and MLP over all N rows as one (1, N, H) tensor, RoPE at each row's
  positions, and attention per row over its own cache
  (`scaled_dot_product_attention`, causal within the block). A row's values
  equal its lone forward's up to the products' summation order, which torch
  may pick by the row count (near-ties can part greedy outputs;
  `generation.divergence` says where).
- `EachRow` ("rows"): any other model, one row after another.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from specdec_rs.models import device_of
from specdec_rs.runner.lone import forward_with_hidden
from specdec_rs.runner.stack import batchable, stack_of

if TYPE_CHECKING:
    import numpy as np
    import torch
    from transformers import PreTrainedModel

Blocks = tuple[list["torch.Tensor"], list["torch.Tensor"] | None]


class Backend(Protocol):
    """How a target runs the blocks of several rows in one forward."""

    name: str  # "gguf" | "llama" | "rows" (recorded in a forward profile)

    def forward_blocks(
        self,
        blocks: Sequence[torch.Tensor],
        caches: Sequence[Any],
        *,
        hidden: bool,
        read: int | None = None,
        allowed: Sequence[np.ndarray | None] | None = None,
    ) -> Blocks:
        """Logits (n_s, V) float32 of each block and, when `hidden`, its last
        hidden states (n_s, H); each cache grows by its block's length.
        read: only the first `read` blocks' logits are wanted (`StackRows`
        computes no others: their entries are (0, V); default all).
        allowed[s]: None, or (r_s, V) bool, the ids at which block s's first
        r_s logits rows will be read (a grammar's masks): a GGUF model's
        head computes only what they need there, so those rows' other
        logits are unspecified (mask them); other backends compute them all."""


def backend_of(target: Any) -> Backend:
    """The backend of `target` (see the module docs)."""
    if batchable(target) and device_of(target).type == "cpu":
        return StackRows(target)
    if _is_llama(target):
        return LlamaRows(target)
    return EachRow(target)


def _is_llama(target: Any) -> bool:
    """Every decoder layer a plain transformers `LlamaDecoderLayer`, and an LM head."""
    try:
        from transformers.models.llama.modeling_llama import LlamaAttention, LlamaDecoderLayer
    except ImportError:  # pragma: no cover - transformers is a dependency of generation
        return False
    layers = getattr(getattr(target, "model", None), "layers", None)
    return (
        layers is not None
        and len(layers) > 0
        and getattr(target, "lm_head", None) is not None
        and all(
            type(layer) is LlamaDecoderLayer and type(layer.self_attn) is LlamaAttention
            for layer in layers
        )
    )


class EachRow:
    """Any model: one lone forward per row."""

    name = "rows"

    def __init__(self, target: PreTrainedModel):
        self.target = target

    def forward_blocks(
        self,
        blocks: Sequence[torch.Tensor],
        caches: Sequence[Any],
        *,
        hidden: bool,
        read: int | None = None,
        allowed: Sequence[np.ndarray | None] | None = None,
    ) -> Blocks:
        """See `Backend.forward_blocks` (every block's logits are computed)."""
        logits, states = [], []
        masks = [None] * len(blocks) if allowed is None else allowed
        for block, cache, mask in zip(blocks, caches, masks, strict=True):
            lg, st = forward_with_hidden(
                self.target, block, cache, keep=len(block), hidden=hidden, allowed=mask
            )
            logits.append(lg)
            states.append(st)
        return logits, (states if hidden else None)  # type: ignore[return-value]


class StackRows:
    """A GGUF model: every row in one call of its Rust stack."""

    name = "gguf"

    def __init__(self, target: PreTrainedModel):
        self.target = target

    def forward_blocks(
        self,
        blocks: Sequence[torch.Tensor],
        caches: Sequence[Any],
        *,
        hidden: bool,
        read: int | None = None,
        allowed: Sequence[np.ndarray | None] | None = None,
    ) -> Blocks:
        """See `Backend.forward_blocks`."""
        stack = stack_of(self.target, caches[0])
        if stack is None:  # autograd on, or caches without slots: layer by layer
            return self._by_layer(blocks, caches, hidden=hidden)
        lengths = [len(b) for b in blocks]
        heads = sum(lengths[: len(blocks) if read is None else read])
        every, normed = stack.forward(blocks, caches, rows=range(heads), allowed=allowed)
        out_logits, out_states, start = [], [], 0
        for n in lengths:
            out_logits.append(every[min(start, heads) : min(start + n, heads)])
            out_states.append(normed[start : start + n])
            start += n
        return out_logits, (out_states if hidden else None)

    def _by_layer(
        self, blocks: Sequence[torch.Tensor], caches: Sequence[Any], *, hidden: bool
    ) -> Blocks:
        """One Rust call per layer (`FusedLlamaLayer.forward_rows`), the final
        norm per row as a lone forward applies it to its own (1, n, H)."""
        import torch

        from specdec_rs.gguf.layer import local_rotary_of

        model = self.target
        base = model.model
        lengths = [len(b) for b in blocks]
        pasts = [c.get_seq_length() for c in caches]
        ids = torch.cat(list(blocks))[None]
        positions = torch.cat(
            [torch.arange(p, p + n) for p, n in zip(pasts, lengths, strict=True)]
        )[None]
        x = base.embed_tokens(ids)[0].float().contiguous().clone()
        local = local_rotary_of(base.layers)
        tables = []  # the model's rotary, and Gemma 3's sliding layers' where it has them
        for rotary in [base.rotary_emb] + ([local.rotary] if local is not None else []):
            pair = rotary(x[None], positions)
            tables.append(tuple(t[0].float().contiguous().numpy() for t in pair))
        rows = x.numpy()
        for i, layer in enumerate(base.layers):
            cos_rows, sin_rows = tables[layer.rotary]
            layer.forward_rows(rows, cos_rows, sin_rows, [c.layers[i] for c in caches], lengths)
        states, at = [], 0
        for n in lengths:
            states.append(base.norm(x[None, at : at + n])[0])
            at += n
        logits = model.lm_head(torch.cat(states)).float()
        out, at = [], 0
        for n in lengths:
            out.append(logits[at : at + n])
            at += n
        return out, (states if hidden else None)


class LlamaRows:
    """A transformers Llama: its own modules over all rows, attention per row."""

    name = "llama"

    def __init__(self, target: PreTrainedModel):
        self.target = target

    def forward_blocks(
        self,
        blocks: Sequence[torch.Tensor],
        caches: Sequence[Any],
        *,
        hidden: bool,
        read: int | None = None,
        allowed: Sequence[np.ndarray | None] | None = None,
    ) -> Blocks:
        """See `Backend.forward_blocks` (every block's logits are computed)."""
        import torch
        from torch.nn import functional as F
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        target = self.target
        base = target.model
        device = device_of(target)
        lengths = [len(b) for b in blocks]
        pasts = [c.get_seq_length() for c in caches]
        starts = [sum(lengths[:s]) for s in range(len(lengths))]
        ids = torch.cat([b.to(device) for b in blocks])[None]
        positions = torch.cat(
            [torch.arange(p, p + n, device=device) for p, n in zip(pasts, lengths, strict=True)]
        )[None]
        x = base.embed_tokens(ids)
        cos, sin = base.rotary_emb(x, positions)
        for layer in base.layers:
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            shape = (1, h.shape[1], -1, attn.head_dim)
            q = attn.q_proj(h).view(shape).transpose(1, 2)
            k = attn.k_proj(h).view(shape).transpose(1, 2)
            v = attn.v_proj(h).view(shape).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            outs = []
            for cache, start, n, past in zip(caches, starts, lengths, pasts, strict=True):
                rows = slice(start, start + n)
                keys, values = cache.update(k[:, :, rows], v[:, :, rows], attn.layer_idx)
                mask = None
                if n > 1:  # causal within the block, after everything cached
                    mask = torch.ones(n, keys.shape[-2], dtype=torch.bool, device=device).tril(past)
                outs.append(
                    F.scaled_dot_product_attention(
                        q[:, :, rows],
                        keys,
                        values,
                        attn_mask=mask,
                        scale=attn.scaling,
                        enable_gqa=True,
                    )
                )
            att = torch.cat(outs, dim=2).transpose(1, 2).reshape(1, h.shape[1], -1)
            x = x + attn.o_proj(att)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        states = base.norm(x)[0]
        logits = target.lm_head(states).float()
        out_logits = [logits[s : s + n] for s, n in zip(starts, lengths, strict=True)]
        out_states = [states[s : s + n] for s, n in zip(starts, lengths, strict=True)]
        return out_logits, (out_states if hidden else None)
