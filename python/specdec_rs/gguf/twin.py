"""The dequantized float32 reference of a GGUF file: transformers' own
model class for its architecture (`LlamaForCausalLM`, `Qwen2ForCausalLM`,
`Qwen3ForCausalLM`, `Phi3ForCausalLM`, `GemmaForCausalLM`,
`Gemma2ForCausalLM`, `Gemma3ForCausalLM`) holding gguf-py's float32 value of
every weight, read and checked by this package's reader (Llama 3's
`rope_freqs` applied, a Llama file's q/k rows put back in transformers'
order, a Gemma file's norms 1 + w read as w; Gemma's config as llama.cpp
reads the file: `architectures`). transformers' own GGUF loader is not used: it ignores `rope_freqs`
and refuses some Qwen3 files.

It is the independent function a file's `load_gguf` model is checked
against (transformers' attention, rotary and norms; `--weights float32`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from specdec_rs.gguf.reader import GGUFFile


def float32_twin(path: str | Path | GGUFFile) -> PreTrainedModel:
    """transformers' model of the GGUF file at `path` (or already read),
    every weight its float32 value (eval mode). ValueError as `load_gguf` for a file it
    cannot read."""
    import torch
    import transformers
    from transformers import GenerationConfig

    from specdec_rs.gguf.model import (
        _unpermute,
        apply_rope_freqs,
        architecture_of,
        check_tensors,
        end_of_generation,
        llama_config,
    )
    from specdec_rs.gguf.reader import read
    from specdec_rs.gguf.writer import _names, permuted_heads

    f = read(path)
    arch = architecture_of(f)
    kw = llama_config(f, arch)
    specdec = {k: kw.pop(k) for k in list(kw) if k.startswith("specdec_")}
    window = specdec["specdec_sliding_window"]
    check_tensors(f, transformers.LlamaConfig(**kw), arch)
    for key in ("attention_bias", "mlp_bias"):
        kw.pop(key)
    names = {
        "llama": ("LlamaConfig", "LlamaForCausalLM"),
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
        "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
        "phi3": ("Phi3Config", "Phi3ForCausalLM"),
        "gemma": ("GemmaConfig", "GemmaForCausalLM"),
        "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
        "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
    }[arch.name]
    config_class, model_class = (getattr(transformers, n) for n in names)
    if arch.name == "phi3":
        kw["sliding_window"] = window or None
    elif arch.name in ("gemma2", "gemma3"):
        kw |= _gemma_config(arch, kw, specdec)
    elif window:
        raise f.fail(f"a sliding window on a {arch.name} file has no transformers twin here")
    config = config_class(**kw)
    model = model_class(config).float()
    state = {}
    for hf_name, gguf_name in _names(config, arch.name).items():
        values = _values(f.tensors[gguf_name])
        heads = permuted_heads(config, arch.name, gguf_name)
        if heads:
            values = values[_unpermute(values.shape[0], heads)]
        if arch.gemma and gguf_name.endswith("norm.weight"):
            values = values - np.float32(1)  # the file holds 1 + w
        state[hf_name] = torch.from_numpy(np.ascontiguousarray(values))
    missing, unexpected = model.load_state_dict(state, strict=False)
    left = [n for n in missing if not (n == "lm_head.weight" and config.tie_word_embeddings)]
    if left or unexpected:
        raise f.fail(
            f"the twin's weights {left[:3]} have no tensor (and {unexpected[:3]} no place)"
        )
    if config.tie_word_embeddings:
        model.tie_weights()
    apply_rope_freqs(f, model.model.rotary_emb, config.head_dim)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=end_of_generation(f, config.vocab_size) or config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    return model.eval()


def _gemma_config(arch: Any, kw: dict[str, Any], specdec: dict[str, Any]) -> dict[str, Any]:
    """Gemma 2's and 3's config keywords beyond Llama's, as llama.cpp reads
    the file (`architectures`): the sliding layers' pattern and window, the
    scores' scale width, the soft-caps, Gemma 3's two rotaries."""
    window = specdec["specdec_sliding_window"]
    out: dict[str, Any] = {
        "layer_types": arch.layer_types(kw["num_hidden_layers"], bool(window)),
        "sliding_window": window or None,
        "query_pre_attn_scalar": round(specdec["specdec_attention_scale"] ** -2),
        "attn_logit_softcapping": specdec["specdec_attn_softcap"] or None,
        "final_logit_softcapping": specdec["specdec_final_softcap"] or None,
        "hidden_activation": kw["hidden_act"],
    }
    if arch.name == "gemma3":
        local = specdec["specdec_local_rope_theta"] or kw["rope_parameters"]["rope_theta"]
        out["rope_parameters"] = {
            "full_attention": kw["rope_parameters"],
            "sliding_attention": {"rope_type": "default", "rope_theta": local},
        }
    return out


def _values(t: Any) -> np.ndarray:
    """A tensor's float32 values (gguf-py's dequantize), (rows, row length) or (n,)."""
    from gguf import GGMLQuantizationType, dequantize

    values = dequantize(t.data, GGMLQuantizationType(t.ggml_type)).astype(np.float32)
    out: np.ndarray = values.reshape(-1) if len(t.shape) == 1 else values.reshape(t.rows, -1)
    return out
