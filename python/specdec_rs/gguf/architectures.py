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
- `gemma`, `gemma2`, `gemma3` (Gemma 1, 2 and 3, text): the embedding
  scaled by √hidden (float32), a GELU gate (its tanh form), norm weights
  stored as 1 + w by the converter (read as they are: RMSNorm · (1 + w)).
  Gemma 2 and 3 add post-norms (`blk.N.post_attention_norm`, `post_ffw_norm`:
  the attention's and the MLP's outputs RMS-normed before each residual
  add; `ffn_norm` is then the pre-MLP norm) and sliding-window layers in a
  fixed pattern, as llama.cpp reads these files: Gemma 2's even layers,
  Gemma 3's layers but every sixth (5, 11, ...). Gemma 2 soft-caps the
  attention scores and the logits, c·tanh(x/c)
  (`gemma2.attn_logit_softcapping`, `gemma2.final_logit_softcapping`; a
  Gemma 3 file may cap its logits too). Gemma 3 norms each query and key
  head (as `qwen3`), and its sliding layers take a rotary of their own
  (base 10,000, no scaling) while its global layers take the file's base
  and scaling. The scores' scale is 1/√head_dim, but for the 27B models
  (46 Gemma 2 layers, 62 Gemma 3 layers: 1/√(hidden/heads)), as llama.cpp
  decides it (the file does not say).

Any of them may name a sliding window (`<arch>.attention.sliding_window`):
a position then sees the window's positions up to itself, as transformers
does (llama.cpp turns Phi-3's window off; texts diverge only past it).
Every layer slides, but for Gemma's patterns above.

Rope scaling: Llama 3's (`rope_freqs`) and linear (`rope.scaling.type =
linear`, `rope.scaling.factor`: positions divided by the factor).

Refused, each with a ValueError naming it: every other architecture, rope
scaling other than these (YaRN, LongRoPE: a Phi-3 128k file's
`rope_factors_long`), a rotary over part of the head, and MoE files.
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
    gemma: bool = False  # √hidden embedding scale, GELU gate, norms stored as 1 + w
    post_norms: bool = False  # post_attention_norm and post_ffw_norm
    sliding_every: int = 0  # layer i slides unless i % n == n - 1 (0: every layer)
    local_rope_theta: float = 0.0  # the sliding layers' own rotary base (0: the model's)
    wide_scale_layers: int = 0  # at this layer count the scores' scale is 1/√(hidden/heads)

    def score_width(self, layers: int, hidden: int, heads: int, head_dim: int) -> int:
        """w of the scores' scale 1/√w: head_dim, or hidden/heads for a model
        of `wide_scale_layers` layers (Gemma's 27B models, as llama.cpp decides it)."""
        return hidden // heads if layers == self.wide_scale_layers else head_dim

    def sliding(self, layer: int) -> bool:
        """Whether layer `layer` takes the file's sliding window."""
        n = self.sliding_every
        return n == 0 or layer % n != n - 1

    def layer_types(self, layers: int, window: bool = True) -> list[str]:
        """transformers' `layer_types` of a file of `layers` layers:
        "sliding_attention" where a layer slides (none without a `window`)."""
        return [
            "sliding_attention" if window and self.sliding(i) else "full_attention"
            for i in range(layers)
        ]


ARCHITECTURES = {
    a.name: a
    for a in (
        Architecture("llama", "Llama, SmolLM, Mistral-style dense models", permuted=True),
        Architecture("qwen2", "Qwen2, Qwen2.5", qkv_bias=True),
        Architecture("qwen3", "Qwen3 (dense)", qk_norms=True),
        Architecture("phi3", "Phi-3 (4k/8k context)", fused=True),
        Architecture("gemma", "Gemma", gemma=True),
        Architecture(
            "gemma2", "Gemma 2", gemma=True, post_norms=True, sliding_every=2, wide_scale_layers=46
        ),
        Architecture(
            "gemma3",
            "Gemma 3 (text)",
            gemma=True,
            qk_norms=True,
            post_norms=True,
            sliding_every=6,
            local_rope_theta=10000.0,
            wide_scale_layers=62,
        ),
    )
}

# known architectures this loader does not build, with why
REFUSED = {
    "gemma3n": "Gemma 3n's per-layer embeddings and altered layers are not built",
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
    if arch.post_norms:
        shapes |= {"post_attention_norm.weight": (h,), "post_ffw_norm.weight": (h,)}
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
