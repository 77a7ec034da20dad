"""Trained heads on disk: one safetensors file each, with the target it was
trained for. p = target, q = draft.

The file holds the trained weights (bfloat16 by default), the draft vocabulary
(int64 ids) and a JSON header (strict JSON): the kind, the shape, the
target's print (`identity.TargetPrint`) and how the head was trained. Frozen
target pieces (embedding, LM-head rows) are taken from the target at load
time, never stored.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from specdec_rs import _files, kernels, models
from specdec_rs.heads.eagle import EagleHead
from specdec_rs.heads.identity import TargetPrint, fingerprint
from specdec_rs.heads.layer import LayerShape
from specdec_rs.heads.medusa import MedusaHeads
from specdec_rs.heads.vocab import draft_vocab_rows
from specdec_rs.limits import MAX_LAYER_SIZE, MAX_MEDUSA_HEADS

if TYPE_CHECKING:
    from transformers import PreTrainedModel

Head = EagleHead | MedusaHeads

SHIPPED = Path(__file__).parent / "smollm2"
KINDS = ("eagle", "medusa")
FIX = (
    "it is not a readable specdec head of this target: delete it and train it again with "
    "`specdec train-drafter`"
)

__all__ = ["KINDS", "SHIPPED", "Head", "build", "fingerprint", "load", "read_header", "save"]


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
    the header, strict JSON) to `path`, atomically (a temporary file, then a
    rename). A head with a non-finite weight is a ValueError, and nothing is
    written."""
    from safetensors.torch import save_file

    path = Path(path)
    tensors = {
        name: (
            t.detach().to("cpu", dtype) if t.is_floating_point() else t.detach().cpu()
        ).contiguous()
        for name, t in head.state_dict().items()
    }
    bad = next(
        (n for n, t in tensors.items() if t.is_floating_point() and not t.isfinite().all()), None
    )
    if bad is not None:
        raise ValueError(
            f"the {head.kind} head's {bad} holds NaN or inf; nothing was saved to {path}"
        )
    header = {
        "kind": head.kind,
        "config": head.config(),
        "target": TargetPrint.of(target).to_json(),
        "info": info,
    }
    text = _files.to_json(header, what=f"the header of {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with _files.atomic_file(path) as tmp:
        save_file(tensors, str(tmp), metadata={"specdec": text})
    return path


def _layout(path: str | Path) -> _files.Layout:
    path = Path(path)
    if not path.is_file():
        raise ValueError(
            f"head file {path} does not exist; "
            "train one with `specdec train-drafter` or omit the path"
        )
    return _files.safetensors_layout(path, what="head file", fix=FIX)


def _header(layout: _files.Layout) -> _files.Fields:
    """The head's JSON header, its kind checked."""
    if "specdec" not in layout.metadata:
        raise layout.fail("the file has no specdec header (a safetensors file of something else)")
    raw = _files.parse_json(
        layout.metadata["specdec"], where=layout.path, what="head header", fix=FIX
    )
    header = _files.Fields(raw, layout.path, "head header", FIX)
    header.string("kind", KINDS)
    header.mapping("config")
    target = header.raw("target")
    if not isinstance(target, str):
        header.mapping("target")
    return header


def read_header(path: str | Path) -> dict[str, Any]:
    """The JSON header of a head file, its fields checked (ValueError if it
    is not a head file)."""
    return _header(_layout(path)).obj


def _target_print(header: _files.Fields) -> TargetPrint | str:
    """The head's record of its target: a `TargetPrint`, or the 16 hex
    digits of `fingerprint` in files written before it."""
    target = header.raw("target")
    if isinstance(target, str):
        if len(target) != 16 or any(c not in "0123456789abcdef" for c in target):
            raise _files.problem(
                header.path, f"field target = {target!r} is not a fingerprint", FIX
            )
        return target
    return TargetPrint.from_json(header.mapping("target"))


def target_mismatch(recorded: TargetPrint | str, target: PreTrainedModel) -> str | None:
    """Why `target` is not the model a head recorded, or None."""
    if isinstance(recorded, str):
        mine = fingerprint(target)
        return None if mine == recorded else f"fingerprint {recorded}, this target's is {mine}"
    return recorded.mismatch(TargetPrint.of(target))


def _shape(config: _files.Fields, target: PreTrainedModel) -> LayerShape:
    """An EAGLE head's layer shape from its header (the target's by default)."""
    if not config.has("shape"):
        return LayerShape.of(target.config)
    s = config.mapping("shape")
    size = {"minimum": 1, "maximum": MAX_LAYER_SIZE}
    shape = LayerShape(
        hidden=s.integer("hidden", **size),
        heads=s.integer("heads", **size),
        kv_heads=s.integer("kv_heads", **size),
        head_dim=s.integer("head_dim", **size),
        intermediate=s.integer("intermediate", **size),
        rope_theta=s.real("rope_theta", above=0.0),
        eps=s.real("eps", above=0.0, below=1.0),
    )
    if shape.heads % shape.kv_heads or shape.head_dim % 2:
        raise _files.problem(
            config.path,
            f"field config.shape has {shape.heads} heads over {shape.kv_heads} key-value heads "
            f"of size {shape.head_dim}; expected a multiple, and an even size (rotary halves)",
            FIX,
        )
    return shape


def _medusa_heads(config: _files.Fields) -> int:
    return config.integer("num_heads", minimum=1, maximum=MAX_MEDUSA_HEADS)


def _construct(
    kind: str,
    config: _files.Fields,
    target: PreTrainedModel,
    draft_vocab: torch.Tensor,
    embed: Any,
    vocab_rows: torch.nn.Module,
) -> Head:
    if kind == "eagle":
        return EagleHead(_shape(config, target), draft_vocab, embed, vocab_rows)
    hidden = models.lm_head_shape(target)[1]  # type: ignore[index]
    return MedusaHeads(hidden, _medusa_heads(config), draft_vocab, vocab_rows)


def _check_layout(
    layout: _files.Layout, kind: str, config: _files.Fields, target: PreTrainedModel
) -> int:
    """The file's tensors against what its header and the target make them
    (names, dtypes, shapes), from the header alone: nothing is allocated.
    Returns the size of the draft vocabulary."""
    vocab, hidden = models.lm_head_shape(target)  # type: ignore[misc]
    dv = layout.tensor("draft_vocab", dtypes=_files.INTEGER_DTYPES, ndim=1)
    n = dv.shape[0]
    if not 1 <= n <= vocab:
        raise layout.fail(f"the draft vocabulary has {n} ids; expected 1..{vocab} for this target")
    if config.has("draft_vocab_size") and config.integer("draft_vocab_size") != n:
        raise layout.fail(
            f"field config.draft_vocab_size = {config.obj['draft_vocab_size']} but tensor "
            f"draft_vocab holds {n} ids"
        )
    with torch.device("meta"):  # shapes only: no memory
        none = torch.nn.Identity()  # the target's pieces: never in a head's state
        empty = _construct(kind, config, target, torch.zeros(n, dtype=torch.long), none, none)
    want = {k: tuple(v.shape) for k, v in empty.state_dict().items()}
    try:
        layout.exactly(set(want))
        for name, shape in want.items():
            if name != "draft_vocab":
                layout.tensor(name, dtypes=_files.FLOAT_DTYPES, shape=shape)
    except ValueError as e:
        raise ValueError(
            f"head file {layout.path}: weights do not match its header ({e})"
        ) from None
    if kind == "eagle" and _shape(config, target).hidden != hidden:
        raise layout.fail(
            f"field config.shape.hidden = {_shape(config, target).hidden}, but the target's "
            f"features have {hidden}"
        )
    if kind == "medusa" and config.has("hidden") and config.integer("hidden") != hidden:
        raise layout.fail(
            f"field config.hidden = {config.obj['hidden']}, but the target's features have {hidden}"
        )
    return n


def load(path: str | Path, target: PreTrainedModel, kind: str) -> Head:
    """The head in `path`, built on `target`'s embedding and LM head, in the
    target's dtype and device. Every field of the header and every tensor's
    name, dtype and shape are checked before anything is allocated; then the
    weights must be finite and the draft vocabulary distinct ids of this
    target. ValueError (and nothing built) for another kind, another target
    (see `identity.TargetPrint`), or a file that fails a check."""
    layout = _layout(path)
    header = _header(layout)
    if header.obj["kind"] != kind:
        raise ValueError(f"head file {path} holds a {header.obj['kind']} head; expected {kind}")
    why = target_mismatch(_target_print(header), target)
    if why is not None:
        raise ValueError(
            f"head file {path} was trained for another target ({why}); train a head for "
            "this target with `specdec train-drafter`"
        )
    config = header.mapping("config")
    _check_layout(layout, kind, config, target)
    tensors = _files.load_tensors(layout)
    for name, t in tensors.items():
        if t.is_floating_point() and not bool(t.isfinite().all()):
            raise layout.fail(f"tensor {name!r} holds NaN or inf (a diverged training)")
    draft_vocab = tensors["draft_vocab"].long()
    vocab = models.vocab_of(target)
    if int(draft_vocab.min()) < 0 or int(draft_vocab.max()) >= vocab:
        raise ValueError(
            f"head file {path}: draft vocabulary ids span "
            f"[{int(draft_vocab.min())}, {int(draft_vocab.max())}]; "
            f"expected ids in [0, {vocab}) for this target"
        )
    if len(torch.unique(draft_vocab)) != len(draft_vocab):
        raise ValueError(f"head file {path}: the draft vocabulary repeats ids")
    tensors["draft_vocab"] = draft_vocab
    head = _build(kind, config, target, draft_vocab)
    head.load_state_dict(tensors, strict=True)  # names and shapes were checked above
    head = head.to(models.dtype_of(target)).eval()
    kernels.follow(head, target)  # the same linear product as the target's
    return head


def _build(
    kind: str, config: _files.Fields, target: PreTrainedModel, draft_vocab: torch.Tensor
) -> Head:
    device = models.device_of(target)
    draft_vocab = draft_vocab.to(device)
    rows = draft_vocab_rows(target.get_output_embeddings(), draft_vocab)
    head = _construct(kind, config, target, draft_vocab, target.get_input_embeddings(), rows)
    return head.to(device)


def build(
    kind: str, config: dict[str, Any], target: PreTrainedModel, draft_vocab: torch.Tensor
) -> Head:
    """A new (untrained) head of `kind` on `target`'s frozen pieces; config
    as a head's header holds it ({} for the target's own shape / defaults)."""
    return _build(
        kind,
        _files.Fields(config, "<config>", "head config", "fix the config"),
        target,
        draft_vocab,
    )
