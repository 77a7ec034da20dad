"""A transformers Llama whose weights stay at a GGUF file's precision.

`load_gguf(path)` reads the file (`reader`), checks its metadata and every
tensor against the layout its architecture (`architectures`: llama, qwen2,
qwen3, phi3, gemma, gemma2, gemma3) describes, and builds a
`LlamaForCausalLM` on the meta device whose decoder layers are
`FusedLlamaLayer`s (the architecture's differences: biases, q/k norms,
fused tensors, Gemma's post-norms, GELU gate, scores' scale and
soft-capping, sliding windows and local rotary) and whose
linear layers are `QuantLinear`s over the file's own bytes (no copy, but for
a Llama file's query and key rows, which llama.cpp's converter stored
permuted for its rotary layout: they are put back in transformers' order,
as transformers' GGUF loader does) and whose input embedding is a
`QuantEmbedding` (scaled by √hidden for Gemma; Gemma 2's LM head soft-caps
its logits). Llama 3's `rope_freqs` divide the rotary's frequencies. The norms are
float32. Formats without a native kernel (Q2_K, Q3_K, the IQ formats but
IQ4_NL, and the others gguf-py can read) are dequantized to float32 with a
one-line notice naming the type. Everything else the project does (the loop, the
drafters, layer views, tree masks, the heads, `measure`) sees the same
transformers model as with float32 weights.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from specdec_rs._collector import paused_while_loading
from specdec_rs.gguf.architectures import (
    ARCHITECTURES,
    REFUSED,
    Architecture,
    layer_tensors,
    supported,
)
from specdec_rs.gguf.arena import gather_weights
from specdec_rs.gguf.layer import FusedLlamaLayer, LocalRotary
from specdec_rs.gguf.modules import NATIVE_TYPES, QuantEmbedding, QuantLinear
from specdec_rs.gguf.reader import INTEGER_TYPES, GGUFFile, Tensor, read

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

FIX = (
    "the file does not describe a model this loader can build; use a GGUF file of a supported "
    "architecture as llama.cpp's converter writes it"
)
MAX_SIZE = 1 << 20
ARCHITECTURE = "general.architecture"  # the metadata key naming the model's architecture


def architecture_of(f: GGUFFile) -> Architecture:
    """The file's `general.architecture`, if supported (ValueError naming it and the list)."""
    name = f.text(ARCHITECTURE, fix=FIX)
    if name in ARCHITECTURES:
        return ARCHITECTURES[name]
    why = f" ({REFUSED[name]})" if name in REFUSED else ""
    raise f.fail(
        f"general.architecture is {name!r}{why}; this loader reads {supported()}",
        "convert the model to one of these architectures, or run it with llama.cpp",
    )


def llama_config(f: GGUFFile, arch: Architecture | None = None) -> dict[str, Any]:
    """The `LlamaConfig` keywords of a file of a supported architecture,
    checked (its differences are the layer's: `architectures`), with the
    `specdec_*` keys of those differences: the sliding window (0: none) and
    its layers, the sliding layers' rotary base (0: the model's), the
    scores' scale, the soft-caps (0: none), the embedding's scale."""
    arch = arch or architecture_of(f)
    prefix = arch.name

    def get(key: str, default: Any = None, kind: type = int) -> Any:
        """<arch>.<key>, of its type (ValueError naming the file and the key)."""
        if kind is int:
            return f.integer(f"{prefix}.{key}", default, minimum=1, maximum=MAX_SIZE - 1, fix=FIX)
        return f.real(f"{prefix}.{key}", default, fix=FIX)

    hidden, heads = get("embedding_length"), get("attention.head_count")
    kv_heads = get("attention.head_count_kv", heads)
    head_dim = get("attention.key_length", hidden // heads)
    value_dim = get("attention.value_length", head_dim)
    rope_dim = get("rope.dimension_count", head_dim)
    if (
        heads % kv_heads
        or rope_dim != head_dim
        or value_dim != head_dim
        or hidden % heads
        and f"{prefix}.attention.key_length" not in f.metadata
    ):
        raise f.fail(
            f"{heads} heads over {kv_heads} key-value heads, key and value head sizes {head_dim} "
            f"and {value_dim}, rotary size {rope_dim}: expected whole groups, one head size and "
            "the rotary over the whole head",
            FIX,
        )
    base = float(get("rope.freq_base", 10000.0, kind=float))
    rope: dict[str, Any] = {"rope_theta": base, "rope_type": "default"}
    scaling = f.text(f"{prefix}.rope.scaling.type", "none", fix=FIX)
    if scaling == "linear":  # positions divided by a factor > 0
        factor = float(get("rope.scaling.factor", kind=float))
        rope = {"rope_theta": base, "rope_type": "linear", "factor": factor}
    elif scaling != "none":
        raise f.fail(
            f"rope scaling {scaling!r} is not supported (plain RoPE, linear, and Llama 3's "
            "rope_freqs)"
        )
    for name in f.tensors:
        if name.startswith("rope_factors_"):
            raise f.fail(
                f"tensor {name}: LongRoPE (a 128k-context Phi-3) is not supported",
                "use the 4k-context model",
            )
    window = f.integer(
        f"{prefix}.attention.sliding_window", 0, minimum=0, maximum=MAX_SIZE - 1, fix=FIX
    )
    embed = f.tensors.get("token_embd.weight")
    vocab = get("vocab_size", embed.rows if embed is not None else None)
    layers = get("block_count")

    def cap(key: str) -> float:
        """A soft-cap c > 0 of the file (0: none)."""
        if not arch.gemma or f"{prefix}.{key}" not in f.metadata:
            return 0.0
        return float(get(key, kind=float))

    width = arch.score_width(layers, hidden, heads, head_dim)
    # float32, as llama.cpp computes it (the same bits as 1/√d in the Rust layer)
    scale = float(np.float32(1) / np.sqrt(np.float32(width)))

    def token(key: str) -> int | None:
        """A special token's id; None when absent, of another type or past the vocabulary."""
        name = f"tokenizer.ggml.{key}"
        if name not in f.metadata or f.types.get(name) not in INTEGER_TYPES:
            return None
        value = int(f.metadata[name])
        return value if 0 <= value < vocab else None

    return {
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": get("feed_forward_length"),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "max_position_embeddings": get("context_length", 2048),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", kind=float)),
        "rope_parameters": rope,
        "tie_word_embeddings": "output.weight" not in f.tensors,
        "bos_token_id": token("bos_token_id"),
        "eos_token_id": token("eos_token_id"),
        "pad_token_id": token("padding_token_id"),
        "unk_token_id": token("unknown_token_id"),
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "gelu_pytorch_tanh" if arch.gemma else "silu",
        "specdec_sliding_window": window,  # not `sliding_window`: transformers' caches read that
        # which layers slide (the window's, where it is not 0)
        "specdec_sliding_layers": [arch.sliding(i) for i in range(layers)],
        "specdec_local_rope_theta": arch.local_rope_theta if window else 0.0,
        "specdec_attention_scale": scale,
        "specdec_attn_softcap": cap("attn_logit_softcapping"),
        "specdec_final_softcap": cap("final_logit_softcapping"),
        # the embedding's scale (Gemma: √hidden in float32; 1: none)
        "specdec_embed_scale": float(np.float32(np.sqrt(hidden))) if arch.gemma else 1.0,
    }


def _expect(f: GGUFFile, name: str, shape: tuple[int, ...]) -> Tensor:
    """Tensor `name`, with ggml shape `shape` (row length first)."""
    t = f.tensors.get(name)
    if t is None:
        raise f.fail(f"tensor {name} is missing", FIX)
    if t.shape != shape:
        raise f.fail(
            f"tensor {name} has shape {list(t.shape)}; the metadata's sizes make it {list(shape)}",
            FIX,
        )
    return t


_NOTICED: set[str] = set()


def _linear(f: GGUFFile, t: Tensor, rows: np.ndarray | None = None) -> QuantLinear:
    """A QuantLinear over tensor t (out, in), its rows reordered by `rows`;
    a format without a kernel is dequantized to float32 (with a notice)."""
    data = t.data if rows is None else t.data[rows]
    ggml_type = t.ggml_type
    if ggml_type not in NATIVE_TYPES:
        data = _dequantized(f, t, data)
        ggml_type = 0
    return QuantLinear.from_rows(data, ggml_type, t.row_length)


def _dequantized(f: GGUFFile, t: Tensor, data: np.ndarray) -> np.ndarray:
    """Tensor bytes of a format without a kernel, as float32 bytes (gguf-py's dequantize)."""
    from gguf import GGMLQuantizationType, dequantize

    try:
        values = dequantize(data, GGMLQuantizationType(t.ggml_type))
    except (NotImplementedError, ValueError, KeyError) as e:
        raise f.fail(
            f"tensor {t.name} has type {t.type_name}, which cannot be read ({e})"
        ) from None
    if t.type_name not in _NOTICED:
        _NOTICED.add(t.type_name)
        print(
            f"specdec_rs: {t.type_name} has no native kernel yet; its tensors are dequantized to "
            "float32 (slower, more memory)",
            file=sys.stderr,
        )
    out: np.ndarray = np.ascontiguousarray(values.astype(np.float32).reshape(data.shape[0], -1))
    return out.view(np.uint8)


def _float(f: GGUFFile, t: Tensor) -> Any:
    """A 1-D norm weight as a float32 torch tensor."""
    import torch

    if t.type_name == "F32":
        values = t.data.view(np.float32).reshape(-1)
    else:
        values = _dequantized(f, t, t.data).view(np.float32).reshape(-1)
    if not np.isfinite(values).all():
        raise f.fail(f"tensor {t.name} holds NaN or inf")
    return torch.from_numpy(values.copy())


def _unpermute(rows: int, heads: int) -> np.ndarray:
    """The row order transformers uses for a query or key weight that
    llama.cpp's converter stored permuted (n_head, 2, dim/2 -> n_head, dim/2, 2)."""
    half = rows // heads // 2
    order: np.ndarray = np.arange(rows).reshape(heads, half, 2).swapaxes(1, 2).reshape(rows)
    return order


def check_tensors(f: GGUFFile, config: Any, arch: Architecture) -> None:
    """Every tensor the metadata's sizes call for is in the file with its
    shape (the file's tensors bound the layer count first)."""
    h, vocab = config.hidden_size, config.vocab_size
    shapes = _layer_shapes(config, arch)
    if len(shapes) * config.num_hidden_layers + 2 > len(f.tensors):
        raise f.fail(
            f"metadata {arch.name}.block_count = {config.num_hidden_layers}, but the file holds "
            f"only {len(f.tensors)} tensors ({len(shapes)} a layer)",
            FIX,
        )
    _expect(f, "token_embd.weight", (h, vocab))
    _expect(f, "output_norm.weight", (h,))
    if "output.weight" in f.tensors:
        _expect(f, "output.weight", (h, vocab))
    if "rope_freqs.weight" in f.tensors:
        _expect(f, "rope_freqs.weight", (config.head_dim // 2,))
    for i in range(config.num_hidden_layers):
        for key, shape in shapes.items():
            _expect(f, f"blk.{i}.{key}", shape)


def _layer_shapes(config: Any, arch: Architecture) -> dict[str, tuple[int, ...]]:
    return layer_tensors(
        arch,
        config.hidden_size,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
        config.intermediate_size,
    )


def build(f: GGUFFile) -> PreTrainedModel:
    """The transformers `LlamaForCausalLM` of a read GGUF file (eval mode):
    its layers `FusedLlamaLayer`s with the architecture's differences."""
    import torch
    from torch import nn
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    arch = architecture_of(f)
    config = LlamaConfig(**llama_config(f, arch))
    config.specdec_architecture = arch.name
    h, hd = config.hidden_size, config.head_dim
    check_tensors(f, config, arch)  # before any model is built: a wrong count fails in microseconds
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    embed = _linear(f, _expect(f, "token_embd.weight", (h, config.vocab_size)))
    model.model.embed_tokens = QuantEmbedding(embed, scale=config.specdec_embed_scale)
    out = f.tensors.get("output.weight")
    model.lm_head = (
        embed if out is None else _linear(f, _expect(f, "output.weight", (h, config.vocab_size)))
    )
    model.lm_head.softcap = config.specdec_final_softcap
    shapes = _layer_shapes(config, arch)
    layers = []
    for i in range(config.num_hidden_layers):

        def tensor(key: str, i: int = i) -> Tensor:
            return _expect(f, f"blk.{i}.{key}", shapes[key])

        parts, extras = _layer_parts(f, config, arch, tensor)
        norms = [_float(f, tensor(f"{key}.weight")) for key in ("attn_norm", "ffn_norm")]
        layers.append(FusedLlamaLayer(config, i, parts, *norms, extras=extras))
    model.model.layers = nn.ModuleList(layers)
    model.model.norm.weight = nn.Parameter(
        _float(f, _expect(f, "output_norm.weight", (h,))), requires_grad=False
    )
    model.model.rotary_emb = LlamaRotaryEmbedding(config=config)
    apply_rope_freqs(f, model.model.rotary_emb, hd)
    if config.specdec_local_rope_theta:  # Gemma 3's sliding layers: a rotary of their own
        local = LocalRotary(local_rotary(config))
        model.model.rotary_local = local.rotary
        for layer in layers:
            if layer.window:
                layer.local_rotary = local
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise f.fail(f"no tensor for {left[:3]}", FIX)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=end_of_generation(f, config.vocab_size) or config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    return model.eval()


# the token texts llama.cpp's vocabulary ends a generation at (`llama-vocab.cpp`)
EOG_TEXTS = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|eom_id|>",
        "<EOT>",
        "_<EOT>",
        "<|end_of_text|>",
        "<end_of_utterance>",
    }
)


def end_of_generation(f: GGUFFile, vocab: int) -> list[int]:
    """The ids a generation stops at, as llama.cpp reads the file: its eos,
    eot and eom tokens (`tokenizer.ggml.*_token_id`) and every token whose
    text llama.cpp takes as an end (`EOG_TEXTS`: a Gemma file's
    `<end_of_turn>`, whose eos is `<eos>`; a Phi-3 file's `<|end|>`); sorted,
    within the vocabulary; empty for a file without a tokenizer."""
    ids = set()
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        name = f"tokenizer.ggml.{key}"
        if f.types.get(name) in INTEGER_TYPES and 0 <= int(f.metadata[name]) < vocab:
            ids.add(int(f.metadata[name]))
    if "tokenizer.ggml.tokens" in f.metadata:
        tokens = f.strings("tokenizer.ggml.tokens")
        ids.update(i for i, text in enumerate(tokens[:vocab]) if text in EOG_TEXTS)
    return sorted(ids)


def local_rotary(config: Any) -> Any:
    """The rotary module of Gemma 3's sliding layers: plain RoPE of base
    `config.specdec_local_rope_theta` (llama.cpp's 10,000, no scaling)."""
    import copy

    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    local = copy.deepcopy(config)
    local.rope_parameters = {"rope_theta": config.specdec_local_rope_theta, "rope_type": "default"}
    return LlamaRotaryEmbedding(config=local)


def apply_rope_freqs(f: GGUFFile, rotary: Any, head_dim: int) -> None:
    """Llama 3's rope scaling as the file holds it (`rope_freqs.weight`,
    d/2 positive divisors): the rotary module's frequencies θ_i / f_i; a
    file without the tensor leaves them."""
    if "rope_freqs.weight" not in f.tensors:
        return
    factors = _float(f, _expect(f, "rope_freqs.weight", (head_dim // 2,)))
    if not bool((factors > 0).all()):
        raise f.fail("tensor rope_freqs.weight holds a factor that is not positive")
    rotary.inv_freq = rotary.original_inv_freq = rotary.inv_freq / factors


def _layer_parts(
    f: GGUFFile, config: Any, arch: Architecture, tensor: Any
) -> tuple[dict[str, QuantLinear], dict[str, Any]]:
    """One layer's products under transformers' names (q_proj, ..., or
    qkv_proj and gate_up_proj where the file fuses them) and its extras
    (qkv_bias (qd + 2·kvd), q_norm and k_norm (d), post_attn_norm and
    post_ffw_norm (hidden)) for `FusedLlamaLayer`."""
    import torch

    heads, kv, hd = config.num_attention_heads, config.num_key_value_heads, config.head_dim

    def part(key: str, rows: np.ndarray | None = None) -> QuantLinear:
        return _linear(f, tensor(f"{key}.weight"), rows)

    parts = {"o_proj": part("attn_output"), "down_proj": part("ffn_down")}
    if arch.fused:
        parts |= {"qkv_proj": part("attn_qkv"), "gate_up_proj": part("ffn_up")}
    else:
        q_rows = _unpermute(heads * hd, heads) if arch.permuted else None
        k_rows = _unpermute(kv * hd, kv) if arch.permuted else None
        parts |= {
            "q_proj": part("attn_q", q_rows),
            "k_proj": part("attn_k", k_rows),
            "v_proj": part("attn_v"),
            "gate_proj": part("ffn_gate"),
            "up_proj": part("ffn_up"),
        }
    extras: dict[str, Any] = {}
    if arch.qkv_bias:
        extras["qkv_bias"] = torch.cat([_float(f, tensor(f"attn_{x}.bias")) for x in "qkv"])
    if arch.qk_norms:
        extras["q_norm"] = _float(f, tensor("attn_q_norm.weight"))
        extras["k_norm"] = _float(f, tensor("attn_k_norm.weight"))
    if arch.post_norms:
        extras["post_attn_norm"] = _float(f, tensor("post_attention_norm.weight"))
        extras["post_ffw_norm"] = _float(f, tensor("post_ffw_norm.weight"))
    return parts, extras


def tokenizer_folder(file: GGUFFile | Path, cache: Path) -> Path:
    """Where `tokenizer_for` keeps a file's tokenizer under `cache`: keyed by
    all that transformers builds it from (the file's `general.architecture`
    and `tokenizer.*` values, as the file's bytes) and transformers'
    version, so copies, moves and other quantizations of one model share
    one folder, and a changed tokenizer gets a new one."""
    import transformers

    f = read(file)
    digest = hashlib.sha256(f"transformers {transformers.__version__}".encode())
    for key in sorted(k for k in f.metadata if k == ARCHITECTURE or k.startswith("tokenizer.")):
        value = f.raw(key)
        for part in (key.encode(), f.types[key].to_bytes(4, "little"), value):
            digest.update(len(part).to_bytes(8, "little") + part)
    architecture = f.metadata.get(ARCHITECTURE)
    name = architecture if isinstance(architecture, str) and architecture else "tokenizer"
    name = re.sub(r"[^A-Za-z0-9_-]", "_", name)[:40]  # a plain folder name, never a path
    return cache / "gguf-tokenizers" / f"{name}-{digest.hexdigest()[:16]}"


def tokenizer_for(file: GGUFFile | Path, cache: Path) -> PreTrainedTokenizerBase:
    """The file's tokenizer, built by transformers from the GGUF once (a few
    seconds) and then read from a folder under `cache` (see `tokenizer_folder`)."""
    from transformers import AutoTokenizer

    f = read(file)
    path = f.path
    folder = tokenizer_folder(f, cache)
    if folder.exists():
        try:
            return AutoTokenizer.from_pretrained(folder, local_files_only=True)
        except Exception as e:  # noqa: BLE001 - a damaged cache: rebuilt from the file below
            print(
                f"specdec_rs: the cached tokenizer {folder} cannot be read ({type(e).__name__}); "
                "it is built again from the GGUF file",
                file=sys.stderr,
            )
            shutil.rmtree(folder, ignore_errors=True)
            if folder.exists():
                raise ValueError(
                    f"the cached tokenizer {folder} is damaged and cannot be removed; delete "
                    "it (it is rebuilt from the GGUF file)"
                ) from None
    try:
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - transformers' GGUF tokenizer raises many types
        raise ValueError(f"GGUF file {path}: its tokenizer cannot be built ({e})") from None
    from specdec_rs import _checks, _files

    tmp = _files.partial_path(folder)
    try:
        _checks.writable_dir(folder.parent, "the tokenizer cache")
        tok.save_pretrained(tmp)
        # a damaged folder was removed above; one another process placed
        # meanwhile is as good as this one (the same key) and may be read now
        _files.place_dir(tmp, folder)
    except (OSError, ValueError):
        shutil.rmtree(tmp, ignore_errors=True)  # no cache: it is built again next time
    return tok


THREADS_VARIABLE = "SPECDEC_KERNEL_THREADS"


def set_activations(model: Any, activations: str) -> None:
    """Run every GGUF product of `model` with "f32" or "q8" activations
    (`modules.QuantLinear`): two target functions, each exact by itself."""
    from specdec_rs import _checks
    from specdec_rs.gguf.modules import ACTIVATIONS

    _checks.choice(activations, "activations", ACTIVATIONS)
    for module in model.modules():
        if isinstance(module, QuantLinear):
            module.activations = activations
    model.config.specdec_activations = activations  # `identity` and the profiles read it


def set_cache_type(model: Any, cache_type: str) -> None:
    """Cache the keys and values of every GGUF layer of `model` as "f32",
    "f16" (IEEE half: half the bytes a step reads past a long context,
    llama.cpp's default) or "q8_0" (ggml's blocks of 32: a float16 scale and
    32 int8 codes, 34 bytes; rows stored as uint8, head sizes a multiple of
    32). Each key and value is rounded once, when its position is written,
    and read back exactly (`rust/kv.rs`); attention reads a block's own keys
    from the cache too, so the forward stays one function of the tokens
    (batch-, chunk- and split-invariant): each type another target
    function, exact by itself. Caches already filled keep their type (a
    ValueError when the model writes to one of another type)."""
    import torch

    from specdec_rs import _checks
    from specdec_rs.gguf.layer import FusedLlamaLayer
    from specdec_rs.gguf.modules import CACHE_TYPES

    _checks.choice(cache_type, "cache_type", CACHE_TYPES)
    dtype = {"f32": torch.float32, "f16": torch.float16, "q8_0": torch.uint8}[cache_type]
    layers = [m for m in model.modules() if isinstance(m, FusedLlamaLayer)]
    for module in layers:
        if cache_type == "q8_0" and module.head_dim % 32:
            raise ValueError(
                f"cache_type='q8_0' stores blocks of 32 values; layer {module.layer_idx}'s "
                f"heads have {module.head_dim}: use cache_type='f16' or 'f32'"
            )
    for module in layers:
        module.cache_dtype = dtype
    model.config.specdec_cache_type = cache_type  # `identity` and the profiles read it


def cache_type_of(model: Any) -> str:
    """The type a GGUF model caches its keys and values in ("f32" for any other model)."""
    return str(getattr(getattr(model, "config", None), "specdec_cache_type", "f32"))


def activations_of(model: Any) -> str:
    """The activations a GGUF model's products take ("f32" for any other model)."""
    return str(getattr(getattr(model, "config", None), "specdec_activations", "f32"))


def set_threads(model: Any, threads: int) -> None:
    """Run every GGUF product of `model` on `threads` threads."""
    for module in model.modules():
        if isinstance(module, QuantLinear):
            module.threads = threads


# a verification block of k = 4 drafts: engine.build.DEFAULT_K + 1 (not imported: gguf
# sits below the engine)
BLOCK_ROWS = 5


def choose_threads(model: Any, *, repeats: int = 7) -> int:
    """The kernels' thread count for this host, by measurement: the
    largest products of a decode step and of a verification block (the LM
    head and the widest layer weight, at one row and at `BLOCK_ROWS`, all
    four in every sample) on 1 and on 2 threads, interleaved after one
    warm-up each, medians; 2 when they win by more than 10%.
    $SPECDEC_KERNEL_THREADS overrides it.

    One row alone is not enough: those two products are bound by the
    memory's bandwidth, which the second core barely raises (measured on a
    quiet Zen 4: 2.7 against 2.3 ms once the clock settles, so 1 thread was
    chosen in 5 to 9 of 20 loads), while the whole step, whose attention,
    norms and smaller products scale, ran 1.3 to 1.6 times faster on 2
    threads at one position and 1.4 to 1.8 times at five."""
    import statistics
    import time

    import torch

    from specdec_rs import _checks

    forced = os.environ.get(THREADS_VARIABLE)
    if forced:
        return _checks.integer(
            int(forced) if forced.isdigit() else forced, THREADS_VARIABLE, minimum=1, maximum=64
        )
    if (os.cpu_count() or 1) < 2:
        return 1
    weights = [m for m in model.modules() if isinstance(m, QuantLinear)]
    probes = sorted(weights, key=lambda m: m.nbytes)[-2:]  # the head and the widest layer weight
    rows = [(p, torch.randn(n, p.in_features)) for p in probes for n in (1, BLOCK_ROWS)]

    def sample(threads: int) -> float:
        started = time.perf_counter()
        for probe, x in rows:
            probe.threads = threads
            probe.product(x)
        return time.perf_counter() - started

    times: dict[int, list[float]] = {1: [], 2: []}
    for threads in (1, 2):
        sample(threads)  # warm-up (the first 2-thread call starts the kernels' worker)
    for _ in range(repeats):
        for threads in (1, 2):
            times[threads].append(sample(threads))
    return 2 if statistics.median(times[2]) < 0.9 * statistics.median(times[1]) else 1


@paused_while_loading
def load_gguf(
    path: Any, *, tokenizer: bool = True, activations: str = "f32", cache_type: str = "f32"
) -> tuple[PreTrainedModel, Any]:
    """(model, tokenizer or None) of a GGUF file of a supported architecture
    (`architectures`: llama, qwen2, qwen3, phi3, gemma, gemma2, gemma3), its
    weights at the file's precision (see the module docs), its products
    with `activations` "f32" (the reference) or "q8" (`set_activations`), its
    keys and values cached as `cache_type` "f32" or "f16" (`set_cache_type`). ValueError for a
    file that is not one, is truncated or corrupt, or holds a tensor of an
    unknown type or a shape its metadata does not give; nothing is
    half-loaded.

    The kernels' thread count is chosen by measurement (`choose_threads`).
    With 2 kernel threads torch is set to one thread (torch's own threads
    and the kernels' spinning worker would take turns on the same cores)."""
    import torch

    from specdec_rs import _checks
    from specdec_rs._files import cache_dir
    from specdec_rs.gguf.modules import ACTIVATIONS, CACHE_TYPES

    _checks.choice(activations, "activations", ACTIVATIONS)
    _checks.choice(cache_type, "cache_type", CACHE_TYPES)
    f = read(path)
    if tokenizer and "tokenizer.ggml.tokens" not in f.metadata:
        raise f.fail(
            "it holds no tokenizer (no tokenizer.ggml.tokens)",
            "use a GGUF file with its tokenizer, or load_gguf(path, tokenizer=False)",
        )
    model = build(f)
    gather_weights(model)
    set_activations(model, activations)
    set_cache_type(model, cache_type)
    threads = choose_threads(model)
    set_threads(model, threads)
    if threads > 1:
        torch.set_num_threads(1)
    tok = tokenizer_for(f, cache_dir()) if tokenizer else None
    return model, tok
