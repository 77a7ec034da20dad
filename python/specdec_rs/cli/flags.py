"""The flags the model commands share (--model, --dtype, --device, --weights,
--activations, --cache-type, --linear; the sampling flags), their checks, and `load_target`."""

from __future__ import annotations

import argparse
import functools
from typing import TYPE_CHECKING, Any

from specdec_rs import _checks, kernels, models
from specdec_rs._collector import collector_paused
from specdec_rs.processors import SamplingConfig

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def model_parser(parser_class: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """The parent parser of every command that loads a model."""
    model = parser_class(add_help=False)
    model.add_argument(
        "--model", default=None, help="local transformers model folder (default: SmolLM2)"
    )
    model.add_argument(
        "--dtype", default="float32", help="float32 | bfloat16 | float16 (target and drafters)"
    )
    model.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:1, ...")
    model.add_argument(
        "--weights",
        default="auto",
        choices=models.WEIGHTS,
        help="SmolLM2 (or a .gguf --model): gguf keeps the file's precision (Rust kernels), "
        "float32 the dequantized reference (auto: gguf on the CPU in float32)",
    )
    model.add_argument(
        "--activations",
        default="f32",
        choices=("f32", "q8"),
        help="GGUF weights' products: f32 activations (the reference) or q8 (8-bit blocks as "
        "llama.cpp quantizes them: another target function, much faster over many positions)",
    )
    model.add_argument(
        "--cache-type",
        default="f32",
        choices=("f32", "f16", "q8_0"),
        help="GGUF models' cached keys and values: f32, f16 (half the bytes a step reads "
        "past a long context, llama.cpp's default) or q8_0 (0.53 of f16's; with --activations "
        "q8 its attention scores are integer block products, as llama.cpp's); each another "
        "target function",
    )
    model.add_argument(
        "--linear",
        default="auto",
        choices=kernels.LINEAR_CHOICES,
        help="linear layers over few positions: Rust product on the CPU in float32 "
        "(auto: with <= 2 torch threads) or torch's",
    )
    return model


def add_sampling_arguments(p: argparse.ArgumentParser, temperature: float) -> None:
    p.add_argument("--temperature", type=float, default=temperature)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--min-p", type=float, default=None)


def sampling(args: argparse.Namespace) -> SamplingConfig:
    return SamplingConfig(args.temperature, args.top_k, args.top_p, args.min_p)


def load_target(args: argparse.Namespace) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """--model (a local folder or .gguf file) or SmolLM2-135M-Instruct, in
    --dtype on --device, its weights as --weights and its float linear
    layers as --linear say."""
    weights = getattr(args, "weights", "auto")
    activations = getattr(args, "activations", "f32")
    cache_type = getattr(args, "cache_type", "f32")
    with collector_paused(freeze=getattr(args, "own_process", False)):
        return _load(
            args.model, args.dtype, args.device, args.linear, weights, activations, cache_type
        )


@functools.cache
def _load(
    path: str | None,
    dtype: str,
    device: str,
    linear: str,
    weights: str,
    activations: str,
    cache_type: str = "f32",
) -> tuple[Any, Any]:
    """Loaded once per process (a program calling main() repeatedly, e.g. the tests).
    On the CPU the GPU libraries torch mapped are released first (`_memory`:
    about 150 MiB of resident memory), before the model's memory peaks."""
    from transformers.utils import logging

    from specdec_rs import _memory

    if models.torch_device(device).type == "cpu":
        _memory.release_gpu_libraries()

    logging.disable_progress_bar()
    if path is None:
        return models.load_smollm2(
            dtype=dtype,
            device=device,
            linear=linear,
            weights=weights,
            activations=activations,
            cache_type=cache_type,
        )
    if weights == "float32" and str(path).lower().endswith(".gguf"):
        # the dequantized reference: transformers' own class holding the file's float32 values
        return models.load_gguf_float32(path, dtype=dtype, device=device, linear=linear)
    return models.load_local(
        path,
        dtype=dtype,
        device=device,
        linear=linear,
        activations=activations,
        cache_type=cache_type,
    )


def check_model_flags(args: argparse.Namespace) -> None:
    """--dtype, --device, --weights and --seed, before a model loads."""
    models.torch_dtype(args.dtype)
    models.torch_device(args.device)
    activations = getattr(args, "activations", "f32")
    cache_type = getattr(args, "cache_type", "f32")
    if args.model is None:
        weights = models.weights_choice(getattr(args, "weights", "auto"), args.dtype, args.device)
        models.check_activations(activations, weights == "gguf", "SmolLM2 with --weights float32")
        models.check_cache_type(cache_type, weights == "gguf", "SmolLM2 with --weights float32")
    else:
        gguf = str(args.model).lower().endswith(".gguf")
        reference = gguf and getattr(args, "weights", "auto") == "float32"
        what = f"--model {args.model}" + (" with --weights float32" if reference else "")
        models.check_activations(activations, gguf and not reference, what)
        models.check_cache_type(cache_type, gguf and not reference, what)
    _checks.seed(args.seed, "--seed")
