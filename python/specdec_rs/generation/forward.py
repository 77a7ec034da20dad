"""The target forward of a batch round: blocks[s] (n_s,) after caches[s]
(each row its own `PreallocatedCache`), every row in one pass.

Three paths, by the target (`batch_path`):
- "gguf": a GGUF model (`gguf.batch.forward_rows`): one Rust call per
  layer, the products over all N = Σ n_s rows, attention per row; every row
  gets the bits it gets alone.
- "llama": a transformers Llama (`LlamaDecoderLayer`s) at any dtype and on
  any device: the model's own modules, the norms, projections and MLP over
  all N rows as one (1, N, H) tensor, RoPE at each row's positions, and
  attention per row over its own cache (`scaled_dot_product_attention`,
  causal within the block). A row's values equal its lone forward's up to
  the products' summation order, which torch may pick by the row count
  (near-ties can part greedy outputs; `generation.divergence` says where).
- "rows": any other model, one row after another (`models.forward_with_hidden`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from specdec_rs import models

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

PATHS = ("gguf", "llama", "rows")


def batch_path(target: Any) -> str:
    """Which of `PATHS` a batch forward of `target` takes (see the module docs)."""
    from specdec_rs.gguf.runner import batchable

    if batchable(target) and models.device_of(target).type == "cpu":
        return "gguf"
    try:
        from transformers.models.llama.modeling_llama import LlamaAttention, LlamaDecoderLayer
    except ImportError:  # pragma: no cover - transformers is a dependency of generation
        return "rows"
    base = getattr(target, "model", None)
    layers = getattr(base, "layers", None)
    if (
        layers is not None
        and len(layers) > 0
        and getattr(target, "lm_head", None) is not None
        and all(
            type(layer) is LlamaDecoderLayer and type(layer.self_attn) is LlamaAttention
            for layer in layers
        )
    ):
        return "llama"
    return "rows"


def forward_blocks(
    target: PreTrainedModel,
    path: str,
    blocks: Sequence[torch.Tensor],
    caches: Sequence[Any],
    *,
    hidden: bool,
    read: int | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """Logits (n_s, V) float32 of each block and, when `hidden`, its last
    hidden states (n_s, H); each cache grows by its block's length.
    read: only the first `read` blocks' logits are wanted (the "gguf" path
    computes no others: their entries are empty; default all)."""
    if path == "gguf":
        from specdec_rs.gguf.batch import forward_rows

        return forward_rows(target, blocks, caches, hidden=hidden, read=read)
    if path == "llama":
        return _llama_rows(target, blocks, caches, hidden=hidden)
    logits, states = [], []
    for block, cache in zip(blocks, caches, strict=True):
        lg, st = models.forward_with_hidden(target, block, cache, keep=len(block), hidden=hidden)
        logits.append(lg)
        states.append(st)
    return logits, (states if hidden else None)  # type: ignore[return-value]


def _llama_rows(
    target: PreTrainedModel,
    blocks: Sequence[torch.Tensor],
    caches: Sequence[Any],
    *,
    hidden: bool,
) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    import torch
    from torch.nn import functional as F
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    base = target.model
    device = models.device_of(target)
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
