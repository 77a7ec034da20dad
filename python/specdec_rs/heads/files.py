"""Trained heads on disk: one safetensors file each, with the target it was
trained for. p = target, q = draft.

The file holds the trained weights (bfloat16 by default), the draft vocabulary
(int64 ids) and a JSON header: the kind, the shape, the target's fingerprint
and how the head was trained. Frozen target pieces (embedding, LM-head rows)
are taken from the target at load time, never stored.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from specdec_rs import kernels
from specdec_rs.heads.eagle import EagleHead
from specdec_rs.heads.layer import LayerShape
from specdec_rs.heads.medusa import MedusaHeads

if TYPE_CHECKING:
    from transformers import PreTrainedModel

Head = EagleHead | MedusaHeads

SHIPPED = Path(__file__).parent / "smollm2"
KINDS = ("eagle", "medusa")
_CONFIG_KEYS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
)


def fingerprint(target: PreTrainedModel) -> str:
    """16 hex digits naming the target: its config's sizes and a sample of its
    embedding and LM-head rows rounded to bfloat16 (so the float32 and the
    bfloat16 load of one model agree, and another model differs)."""
    config = {key: getattr(target.config, key, None) for key in _CONFIG_KEYS}
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode())
    for weight in (target.get_input_embeddings().weight, target.get_output_embeddings().weight):
        rows = weight.detach()[:: max(1, weight.shape[0] // 16)].to("cpu", torch.bfloat16)
        digest.update(rows.view(torch.int16).numpy().tobytes())
    return digest.hexdigest()[:16]


def shipped(kind: str) -> Path:
    """The head that ships with the package for SmolLM2-135M-Instruct."""
    return SHIPPED / f"{kind}.safetensors"


def save(
    head: Head,
    path: str | Path,
    target: PreTrainedModel,
    info: dict[str, Any],
    dtype: torch.dtype = torch.bfloat16,
) -> Path:
    """Write `head` (its trained weights in `dtype`, the draft vocabulary and
    the header) to `path`, atomically (a temporary file, then a rename)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {
        name: (
            t.detach().to("cpu", dtype) if t.is_floating_point() else t.detach().cpu()
        ).contiguous()
        for name, t in head.state_dict().items()
    }
    header = {
        "kind": head.kind,
        "config": head.config(),
        "target": fingerprint(target),
        "info": info,
    }
    partial = path.with_suffix(path.suffix + ".partial")
    save_file(tensors, str(partial), metadata={"specdec": json.dumps(header)})
    partial.replace(path)
    return path


def read_header(path: str | Path) -> dict[str, Any]:
    """The JSON header of a head file (ValueError if it is not one)."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise ValueError(
            f"head file {path} does not exist; "
            "train one with `specdec train-drafter` or omit the path"
        )
    try:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
        header: dict[str, Any] = json.loads(meta["specdec"])
    except Exception as exc:  # safetensors raises its own error types
        raise ValueError(
            f"head file {path} is not a readable specdec head ({exc}); delete it and train it again"
        ) from exc
    if header.get("kind") not in KINDS:
        raise ValueError(
            f"head file {path} has kind {header.get('kind')!r}; expected one of {KINDS}"
        )
    return header


def load(path: str | Path, target: PreTrainedModel, kind: str) -> Head:
    """The head in `path`, built on `target`'s embedding and LM head, in the
    target's dtype and device. ValueError (and nothing built) for another
    kind, another target, a draft vocabulary out of range, or a file whose
    weights do not match its header."""
    from safetensors.torch import load_file

    header = read_header(path)
    if header["kind"] != kind:
        raise ValueError(f"head file {path} holds a {header['kind']} head; expected {kind}")
    if header["target"] != fingerprint(target):
        raise ValueError(
            f"head file {path} was trained for another target "
            f"(fingerprint {header['target']}, this target's is "
            f"{fingerprint(target)}); train a head for this target with `specdec train-drafter`"
        )
    try:
        tensors = load_file(str(path))
    except Exception as exc:
        raise ValueError(
            f"head file {path} is corrupt ({exc}); delete it and train it again"
        ) from exc
    vocab = target.get_output_embeddings().weight.shape[0]
    draft_vocab = tensors.get("draft_vocab")
    if draft_vocab is None or draft_vocab.ndim != 1 or len(draft_vocab) == 0:
        raise ValueError(f"head file {path} has no draft vocabulary")
    if int(draft_vocab.min()) < 0 or int(draft_vocab.max()) >= vocab:
        raise ValueError(
            f"head file {path}: draft vocabulary ids span "
            f"[{int(draft_vocab.min())}, {int(draft_vocab.max())}]; "
            f"expected ids in [0, {vocab}) for this target"
        )
    if len(torch.unique(draft_vocab)) != len(draft_vocab):
        raise ValueError(f"head file {path}: the draft vocabulary repeats ids")
    head = build(header["kind"], header["config"], target, draft_vocab)
    dtype = target.get_output_embeddings().weight.dtype
    try:
        head.load_state_dict(tensors, strict=True)
    except RuntimeError as exc:
        raise ValueError(
            f"head file {path}: weights do not match its header ({exc}); train it again"
        ) from exc
    head = head.to(dtype).eval()
    kernels.follow(head, target)  # the same linear product as the target's
    return head


def build(
    kind: str, config: dict[str, Any], target: PreTrainedModel, draft_vocab: torch.Tensor
) -> Head:
    """A new (untrained) head of `kind` on `target`'s frozen pieces."""
    embed = target.get_input_embeddings().weight.detach()
    lm_head = target.get_output_embeddings().weight.detach()
    draft_vocab = draft_vocab.to(lm_head.device)
    if kind == "eagle":
        shape = LayerShape(**config["shape"]) if "shape" in config else LayerShape.of(target.config)
        return EagleHead(shape, draft_vocab, embed, lm_head).to(lm_head.device)
    return MedusaHeads(lm_head.shape[1], int(config["num_heads"]), draft_vocab, lm_head).to(
        lm_head.device
    )
