"""A transformers Llama written as a GGUF file with the `gguf` package, as
llama.cpp's converter writes one (query and key rows permuted for its
rotary layout, linear weights quantized by gguf-py): for the tests, which
build tiny random models, and for a user who wants a model of their own at
a file's precision. A tokenizer is copied from another GGUF file when one
is named (`tokenizer=`), else none is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's permutation of a query or key weight's rows
    (the inverse of `model._unpermute`)."""
    rows = w.shape[0]
    half = rows // heads // 2
    out: np.ndarray = w.reshape(heads, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    return out


def write_llama(
    model: Any,
    path: str | Path,
    *,
    linear_type: str = "Q4_1",
    embed_type: str = "Q8_0",
    types: dict[str, str] | None = None,
    tokenizer: str | Path | None = None,
) -> Any:
    """Write the transformers Llama `model` to `path` with its linear weights
    in `linear_type`, its embedding (and an untied LM head) in `embed_type`,
    norms in F32 (`types` maps a GGUF tensor name to another type), and the
    `tokenizer.*` keys of the GGUF file `tokenizer` if given. Returns
    the dequantized float32 twin: a copy of `model` whose weights are the
    file's values, the model the file describes."""
    import copy

    import torch
    from gguf import GGMLQuantizationType, GGUFWriter, dequantize, quantize

    config = model.config
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    twin = copy.deepcopy(model).float()
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv)
    writer.add_rope_dimension_count(config.head_dim)
    rope = getattr(config, "rope_parameters", None) or {}
    writer.add_rope_freq_base(float(rope.get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_vocab_size(config.vocab_size)
    if tokenizer is not None:
        _copy_tokenizer(writer, Path(tokenizer))
    for key, value in (("bos", config.bos_token_id), ("eos", config.eos_token_id)):
        if value is not None and tokenizer is None:
            writer.add_uint32(f"tokenizer.ggml.{key}_token_id", int(value))
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
    }
    if not config.tie_word_embeddings:
        names["lm_head.weight"] = "output.weight"
    per_layer = {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for i in range(config.num_hidden_layers):
        for hf, gg in per_layer.items():
            names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{gg}.weight"
    params = dict(twin.named_parameters())
    for hf_name, gguf_name in names.items():
        param = params[hf_name]
        w = param.detach().cpu().numpy().astype(np.float32)
        if w.ndim == 1:
            kind = "F32"
        elif gguf_name in ("token_embd.weight", "output.weight"):
            kind = embed_type
        else:
            kind = linear_type
        kind = (types or {}).get(gguf_name, kind)
        if ".attn_q." in gguf_name:
            w = _permute(w, heads)
        elif ".attn_k." in gguf_name:
            w = _permute(w, kv)
        qtype = GGMLQuantizationType[kind]
        data = quantize(w, qtype) if kind != "F32" else w
        if data.dtype == np.uint8:  # bytes: the writer needs the type to read their shape
            writer.add_tensor(gguf_name, data, raw_dtype=qtype)
        else:
            writer.add_tensor(gguf_name, data)
        values = dequantize(data, qtype).reshape(w.shape).astype(np.float32)
        if ".attn_q." in gguf_name or ".attn_k." in gguf_name:
            from specdec_rs.gguf.model import _unpermute

            values = values[_unpermute(w.shape[0], heads if ".attn_q." in gguf_name else kv)]
        with torch.no_grad():
            param.copy_(torch.from_numpy(np.ascontiguousarray(values)))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return twin.eval()


def _copy_tokenizer(writer: Any, source: Path) -> None:
    """Every `tokenizer.*` key of the GGUF file `source`, with its type."""
    from gguf import GGUFReader, GGUFValueType

    for name, field in GGUFReader(str(source)).fields.items():
        if not name.startswith("tokenizer."):
            continue
        kind = GGUFValueType(field.types[0])
        sub = GGUFValueType(field.types[-1]) if kind == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), kind, sub_type=sub)
