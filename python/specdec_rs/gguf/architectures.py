"""The GGUF architectures this loader reads, each a table of differences
over the one Llama decoder layer (`layer.FusedLlamaLayer`, `rust/llama.rs`).

Every supported file has llama.cpp's converter's tensor names and metadata
keys under its `general.architecture` prefix. The differences:

- `llama` (Llama 1-3, SmolLM, Mistral-style dense models): query and key
  rows stored permuted for llama.cpp's interleaved rotary (put back in
  transformers' half-split order at load); Llama 3's rope scaling as the
  converter writes it, a `rope_freqs.weight` tensor of per-frequency
  divisors (d/2: θ_i = pos · base^(-2i/d) / f_i).
- `qwen2` (Qwen2, Qwen2.5): q, k, v biases (`blk.N.attn_{q,k,v}.bias`).
- `qwen3` (dense Qwen3): RMS norms of each query and key head before RoPE
  (`blk.N.attn_{q,k}_norm.weight`, d each); `key_length` sets the head size.
- `phi3` (Phi-3 mini and medium with a 4k/8k context): q, k, v fused in
  `attn_qkv` and gate, up fused in `ffn_up` (gate rows first).

Any of them may name a sliding window (`<arch>.attention.sliding_window`):
a position then sees the window's positions up to itself, as transformers
does (llama.cpp turns Phi-3's window off; texts diverge only past it).

Refused, each with a ValueError naming it: every other architecture
(Gemma's embedding scale, GeGLU, pre/post norms and soft-capping are not
built yet), rope scaling other than Llama 3's (linear, YaRN, LongRoPE: a
Phi-3 128k file's `rope_factors_long`), a rotary over part of the head,
and MoE files.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Architecture:
    """What one `general.architecture` changes in the Llama layer."""

    name: str
    family: str
    permuted: bool = False  # q and k rows stored permuted (llama.cpp's interleaved rotary)
    qkv_bias: bool = False
    qk_norms: bool = False
    fused: bool = False  # attn_qkv and ffn_up (gate and up) are one tensor each


ARCHITECTURES = {
    a.name: a
    for a in (
        Architecture("llama", "Llama, SmolLM, Mistral-style dense models", permuted=True),
        Architecture("qwen2", "Qwen2, Qwen2.5", qkv_bias=True),
        Architecture("qwen3", "Qwen3 (dense)", qk_norms=True),
        Architecture("phi3", "Phi-3 (4k/8k context)", fused=True),
    )
}

# known architectures this loader does not build, with why
REFUSED = {
    "gemma": "Gemma's embedding scale and GeGLU are not built yet",
    "gemma2": "Gemma 2's embedding scale, GeGLU, pre/post norms and soft-capping are not built yet",
    "gemma3": "Gemma 3's embedding scale, GeGLU, pre/post norms and local rotary are not built yet",
    "qwen2moe": "mixture-of-experts layers are not built",
    "qwen3moe": "mixture-of-experts layers are not built",
}


def supported() -> str:
    """The supported list, for messages: "llama (Llama, ...), qwen2 (...), ..."."""
    return ", ".join(f"{a.name} ({a.family})" for a in ARCHITECTURES.values())


def layer_tensors(
    arch: Architecture, hidden: int, heads: int, kv_heads: int, head_dim: int, inter: int
) -> dict[str, tuple[int, ...]]:
    """The tensors of one layer (`blk.N.<key>`) with their ggml shapes (row length first)."""
    h, qd, kvd = hidden, heads * head_dim, kv_heads * head_dim
    shapes: dict[str, tuple[int, ...]] = {"attn_norm.weight": (h,), "ffn_norm.weight": (h,)}
    if arch.fused:
        shapes["attn_qkv.weight"] = (h, qd + 2 * kvd)
    else:
        shapes |= {"attn_q.weight": (h, qd), "attn_k.weight": (h, kvd), "attn_v.weight": (h, kvd)}
    if arch.qkv_bias:
        shapes |= {"attn_q.bias": (qd,), "attn_k.bias": (kvd,), "attn_v.bias": (kvd,)}
    if arch.qk_norms:
        shapes |= {"attn_q_norm.weight": (head_dim,), "attn_k_norm.weight": (head_dim,)}
    shapes["attn_output.weight"] = (qd, h)
    if arch.fused:
        shapes["ffn_up.weight"] = (h, 2 * inter)
    else:
        shapes |= {"ffn_gate.weight": (h, inter), "ffn_up.weight": (h, inter)}
    shapes["ffn_down.weight"] = (inter, h)
    return shapes
