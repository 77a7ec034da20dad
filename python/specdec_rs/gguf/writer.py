"""A transformers model written as a GGUF file with the `gguf` package, as
llama.cpp's converter writes one: for the tests, which build tiny random
models, and for a user who wants a model of their own at a file's
precision. Architectures (`architectures`): `LlamaForCausalLM` (query and
key rows permuted for llama.cpp's rotary layout; Llama 3's rope scaling as
a `rope_freqs` tensor), `Qwen2ForCausalLM` (q, k, v biases),
`Qwen3ForCausalLM` (q, k norms), `Phi3ForCausalLM` (fused qkv and gate_up),
`GemmaForCausalLM`, `Gemma2ForCausalLM` and `Gemma3ForCausalLM` (text:
norm weights written as 1 + w, as the converter does; post-norms; Gemma 2's
soft-caps; Gemma 3's q, k norms, linear rope scaling and sliding layers' base).
Linear weights are quantized by gguf-py (the types in `TYPES`; llama.cpp's
own quantizer writes the K-quants from such a file). A tokenizer is copied
from another GGUF file when one is named (`tokenizer=`), else none is written.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")
# transformers' model_type -> the GGUF architecture
WRITABLE = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "phi3": "phi3",
    "gemma": "gemma",
    "gemma2": "gemma2",
    "gemma3_text": "gemma3",
}
GEMMA = ("gemma", "gemma2", "gemma3")


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's permutation of a query or key weight's rows
    (the inverse of `model._unpermute`)."""
    rows = w.shape[0]
    half = rows // heads // 2
    out: np.ndarray = w.reshape(heads, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    return out


def llama3_rope_factors(config: Any) -> np.ndarray | None:
    """The `rope_freqs` (d/2,) float32 of a Llama 3 rope scaling, as
    llama.cpp's converter computes them (1 for short wavelengths, `factor`
    for long ones, smoothed between); None for plain RoPE."""
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type") != "llama3":
        return None
    base, d = float(rope["rope_theta"]), config.head_dim
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    factors = []
    for i in range(0, d, 2):
        wavelen = 2 * math.pi / (1.0 / base ** (i / d))
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(factors, dtype=np.float32)


def permuted_heads(config: Any, arch: str, gguf_name: str) -> int:
    """The head count a tensor's rows are permuted by in a file of `arch`
    (a Llama file's query and key weights: llama.cpp's interleaved
    rotary), else 0."""
    if arch != "llama":
        return 0
    if ".attn_q." in gguf_name:
        return int(config.num_attention_heads)
    if ".attn_k." in gguf_name:
        return int(config.num_key_value_heads)
    return 0


def _names(config: Any, arch: str) -> dict[str, str]:
    """transformers' parameter name -> the GGUF tensor name."""
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
    }
    if not config.tie_word_embeddings:
        names["lm_head.weight"] = "output.weight"
    per_layer = {
        "input_layernorm.weight": "attn_norm.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }
    if arch in ("gemma2", "gemma3"):  # post-norms: ffn_norm is the pre-MLP norm
        per_layer |= {
            "post_attention_layernorm.weight": "post_attention_norm.weight",
            "pre_feedforward_layernorm.weight": "ffn_norm.weight",
            "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
        }
    if arch == "phi3":
        per_layer |= {
            "self_attn.qkv_proj.weight": "attn_qkv.weight",
            "mlp.gate_up_proj.weight": "ffn_up.weight",
        }
    else:
        per_layer |= {
            "self_attn.q_proj.weight": "attn_q.weight",
            "self_attn.k_proj.weight": "attn_k.weight",
            "self_attn.v_proj.weight": "attn_v.weight",
            "mlp.gate_proj.weight": "ffn_gate.weight",
            "mlp.up_proj.weight": "ffn_up.weight",
        }
    if arch == "qwen2":
        per_layer |= {f"self_attn.{x}_proj.bias": f"attn_{x}.bias" for x in "qkv"}
    if arch in ("qwen3", "gemma3"):
        per_layer |= {
            "self_attn.q_norm.weight": "attn_q_norm.weight",
            "self_attn.k_norm.weight": "attn_k_norm.weight",
        }
    for i in range(config.num_hidden_layers):
        for hf, gg in per_layer.items():
            names[f"model.layers.{i}.{hf}"] = f"blk.{i}.{gg}"
    return names


def write_gguf(
    model: Any,
    path: str | Path,
    *,
    linear_type: str = "Q4_1",
    embed_type: str = "Q8_0",
    types: dict[str, str] | None = None,
    tokenizer: str | Path | None = None,
) -> Any:
    """Write the transformers model `model` (a Llama, Qwen2, Qwen3, Phi-3 or Gemma 1-3)
    to `path` with its linear weights in `linear_type`, its embedding (and
    an untied LM head) in `embed_type`, norms and biases in F32 (`types`
    maps a GGUF tensor name to another type), and the `tokenizer.*` keys
    of the GGUF file `tokenizer` if given. Returns the dequantized float32
    twin: a copy of `model` whose weights are the file's values, the model
    the file describes."""
    import copy

    import gguf
    import torch
    from gguf import GGMLQuantizationType, GGUFWriter, dequantize, quantize

    config = model.config
    if config.model_type not in WRITABLE:
        raise ValueError(
            f"write_gguf: model_type {config.model_type!r}; the writer writes {', '.join(WRITABLE)}"
        )
    arch = WRITABLE[config.model_type]
    if arch in GEMMA:
        _check_gemma(config, arch)
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    twin = copy.deepcopy(model).float()
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv)
    if head_dim != config.hidden_size // heads or arch in ("qwen3", *GEMMA):
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    rope = getattr(config, "rope_parameters", None) or {}
    rope = rope.get("full_attention", rope)  # Gemma 3's global layers'
    writer.add_rope_freq_base(float(rope.get("rope_theta", 10000.0)))
    if rope.get("rope_type") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope["factor"]))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_vocab_size(config.vocab_size)
    window = getattr(config, "sliding_window", None)
    if window and arch in ("phi3", "gemma2", "gemma3"):  # Qwen's is off unless use_sliding_window
        writer.add_sliding_window(int(window))
    for key, add in (
        ("attn_logit_softcapping", writer.add_attn_logit_softcapping),
        ("final_logit_softcapping", writer.add_final_logit_softcapping),
    ):
        if arch in GEMMA and getattr(config, key, None):
            add(float(getattr(config, key)))
    if arch == "phi3":
        original = getattr(config, "original_max_position_embeddings", None)
        writer.add_rope_scaling_orig_ctx_len(int(original or config.max_position_embeddings))
    if tokenizer is not None:
        _copy_tokenizer(writer, Path(tokenizer))
    for key, value in (("bos", config.bos_token_id), ("eos", config.eos_token_id)):
        if value is not None and tokenizer is None:
            writer.add_uint32(f"tokenizer.ggml.{key}_token_id", int(value))
    factors = llama3_rope_factors(config) if arch == "llama" else None
    if factors is not None:
        writer.add_tensor("rope_freqs.weight", factors)
    params = dict(twin.named_parameters())
    for hf_name, gguf_name in _names(config, arch).items():
        param = params[hf_name]
        w = param.detach().cpu().numpy().astype(np.float32)
        shift = arch in GEMMA and gguf_name.endswith("norm.weight")
        if shift:  # Gemma's RMSNorm multiplies by 1 + w: the converter writes 1 + w
            w = w + np.float32(1)
        if w.ndim == 1:
            kind = "F32"
        elif gguf_name in ("token_embd.weight", "output.weight"):
            kind = embed_type
        else:
            kind = linear_type
        kind = (types or {}).get(gguf_name, kind)
        group = permuted_heads(config, arch, gguf_name)
        if group:
            w = _permute(w, group)
        qtype = GGMLQuantizationType[kind]
        data = quantize(w, qtype) if kind != "F32" else w
        if data.dtype == np.uint8:  # bytes: the writer needs the type to read their shape
            writer.add_tensor(gguf_name, data, raw_dtype=qtype)
        else:
            writer.add_tensor(gguf_name, data)
        values = dequantize(data, qtype).reshape(w.shape).astype(np.float32)
        if group:
            from specdec_rs.gguf.model import _unpermute

            values = values[_unpermute(w.shape[0], group)]
        if shift:
            values = values - np.float32(1)
        with torch.no_grad():
            param.copy_(torch.from_numpy(np.ascontiguousarray(values)))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return twin.eval()


write_llama = write_gguf  # the name of its first architecture, kept for callers


def gemma_scale_width(config: Any, arch: str) -> int:
    """The width w of a Gemma file's scores' scale 1/√w, as llama.cpp
    decides it (the file does not hold it: `Architecture.score_width`)."""
    from specdec_rs.gguf.architectures import ARCHITECTURES

    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return ARCHITECTURES[arch].score_width(
        config.num_hidden_layers, config.hidden_size, heads, head_dim
    )


def _check_gemma(config: Any, arch: str) -> None:
    """A Gemma config whose function a GGUF file can hold, as llama.cpp
    reads it; else a ValueError naming what it cannot."""
    from specdec_rs.gguf.architectures import ARCHITECTURES

    problems = []
    act = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None)
    if act != "gelu_pytorch_tanh":
        problems.append(f"hidden activation {act!r} (the file's is gelu_pytorch_tanh)")
    scalar = getattr(config, "query_pre_attn_scalar", None)
    if arch != "gemma" and scalar != gemma_scale_width(config, arch):
        problems.append(
            f"query_pre_attn_scalar {scalar} (llama.cpp takes {gemma_scale_width(config, arch)} "
            f"at {config.num_hidden_layers} layers)"
        )
    layer_types = getattr(config, "layer_types", None)
    if arch != "gemma" and layer_types is not None:
        want = ARCHITECTURES[arch].layer_types(config.num_hidden_layers)
        if list(layer_types) != want:
            problems.append(f"layer_types {layer_types} (the file's pattern is {want})")
    rope = getattr(config, "rope_parameters", None) or {}
    local = rope.get("sliding_attention")
    if arch == "gemma3" and local is not None:
        theta = ARCHITECTURES[arch].local_rope_theta
        if local.get("rope_type", "default") != "default" or local.get("rope_theta") != theta:
            problems.append(f"sliding layers' rope {local} (the file's is plain, base {theta:g})")
    if problems:
        raise ValueError(
            f"write_gguf: this {config.model_type} cannot be written as a GGUF file llama.cpp "
            "reads alike: " + "; ".join(problems)
        )


def _copy_tokenizer(writer: Any, source: Path) -> None:
    """Every `tokenizer.*` key of the GGUF file `source`, with its type
    (read by this package's reader: gguf-py's parses every tensor first)."""
    from gguf import GGUFValueType

    from specdec_rs.gguf.reader import read

    f = read(source)
    for name, value in f.metadata.items():
        if not name.startswith("tokenizer."):
            continue
        kind = GGUFValueType(f.types[name])
        if kind != GGUFValueType.ARRAY:
            writer.add_key_value(name, value, kind)
            continue
        sub = GGUFValueType(f.items[name])
        items = f.strings(name) if sub == GGUFValueType.STRING else value.tolist()
        writer.add_key_value(name, items, kind, sub_type=sub)
