"""Damaged and crafted files, through the API and the CLI: head files,
training shards, checkpoints, manifests, prompts files. Every case must give
a ValueError (or, through the CLI, a clean exit 2 with one line), never
another exception, a hang past CALL_SECONDS, a huge allocation or a
half-written file. p = target, q = draft.

Each named case is a fault once found by hand; the generated cases (bytes
cut, flipped or appended; header fields replaced by odd JSON values) dig
around them with hypothesis.
"""

from __future__ import annotations

import copy
import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from specdec_rs import _files, heads
from specdec_rs.models import tiny_llama
from test_fuzz import deadline

torch = pytest.importorskip("torch")

V, H = 48, 32
EXAMPLES = 40


@pytest.fixture(scope="module")
def target() -> Any:
    return tiny_llama(vocab_size=V, hidden_size=H, num_layers=2, seed=5)


@pytest.fixture(scope="module")
def head_files(target: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An untrained head of each kind, saved as `specdec train-drafter` saves one."""
    folder = tmp_path_factory.mktemp("head-files")
    draft_vocab = torch.arange(40)
    out = {}
    for kind, config in (("eagle", {}), ("medusa", {"num_heads": 3})):
        head = heads.files.build(kind, config, target, draft_vocab)
        out[kind] = heads.save(head, folder / f"{kind}.safetensors", target, {"made": "test"})
    return out


def rewrite(
    source: Path,
    dest: Path,
    header: Callable[[dict[str, Any]], Any] | None = None,
    tensors: Callable[[dict[str, Any]], None] | None = None,
) -> Path:
    """A copy of a head file with its header and/or tensors edited."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(source), "pt") as f:
        meta = json.loads(f.metadata()["specdec"])
    body = load_file(str(source))
    if tensors is not None:
        tensors(body)
    new_meta = header(copy.deepcopy(meta)) if header is not None else meta
    save_file(body, str(dest), metadata={"specdec": json.dumps(new_meta)})
    return dest


def refused(fn: Callable[..., Any], *args: Any, match: str = "", **kwargs: Any) -> ValueError:
    """fn(*args, **kwargs) raises a ValueError (matching `match`) within CALL_SECONDS."""
    with deadline(), pytest.raises(ValueError, match=match) as info:
        fn(*args, **kwargs)
    return info.value


# ---- head files ----------------------------------------------------------------------------


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], Any]:
    def edit(header: dict[str, Any]) -> Any:
        *parents, last = path.split(".")
        node = header
        for key in parents:
            node = node[key]
        node[last] = value
        return header

    return edit


def _drop(path: str) -> Callable[[dict[str, Any]], Any]:
    def edit(header: dict[str, Any]) -> Any:
        *parents, last = path.split(".")
        node = header
        for key in parents:
            node = node[key]
        del node[last]
        return header

    return edit


HEADER_EDITS = [
    ("eagle", lambda h: [1, 2], "JSON array; expected an object"),
    ("eagle", _drop("target"), "no field 'target'"),
    ("eagle", _drop("config"), "no field 'config'"),
    ("eagle", _drop("config.shape.heads"), "no field 'config.shape.heads'"),
    ("eagle", _set("config.shape.hidden", "64"), "config.shape.hidden .* must be an integer"),
    ("eagle", _set("config.shape.hidden", 10**7), "config.shape.hidden .* out of range"),
    ("eagle", _set("config.shape.kv_heads", 3), "multiple"),
    ("eagle", _set("config.shape.eps", -1), "config.shape.eps"),
    ("eagle", _set("kind", "lora"), "field kind"),
    ("eagle", _set("target", "zz"), "not a fingerprint"),
    ("eagle", _set("target.samples", {"x": ["a"]}), "samples"),
    ("eagle", _set("config.draft_vocab_size", 7), "draft_vocab_size"),
    ("medusa", _set("config.num_heads", None), "config.num_heads .* must be an integer"),
    ("medusa", _drop("config.num_heads"), "no field 'config.num_heads'"),
    ("medusa", _set("config.num_heads", 300000), "config.num_heads .* out of range"),
    ("medusa", _set("config.num_heads", 2.9), "config.num_heads .* must be an integer"),
    ("medusa", _set("config.num_heads", 2), "do not match"),
    ("medusa", _set("config.hidden", 64), "config.hidden"),
]


@pytest.mark.parametrize(("kind", "edit", "message"), HEADER_EDITS)
def test_edited_headers_are_refused_naming_the_field(
    target: Any, head_files: dict[str, Path], tmp_path: Path, kind: str, edit: Any, message: str
) -> None:
    bad = rewrite(head_files[kind], tmp_path / "edited.safetensors", header=edit)
    error = refused(heads.load, bad, target, kind, match=message)
    assert str(bad) in str(error)


@pytest.mark.parametrize(
    ("kind", "edit", "message"),
    [
        ("eagle", lambda t: t.update(draft_vocab=t["draft_vocab"].float()), "dtype F32"),
        ("eagle", lambda t: t.update(draft_vocab=torch.arange(V + 1)), "draft vocabulary has"),
        ("eagle", lambda t: t.update(draft_vocab=torch.zeros(40, dtype=torch.long)), "repeats"),
        ("eagle", lambda t: t["fc.weight"].fill_(float("nan")), "NaN or inf"),
        ("medusa", lambda t: t.pop("blocks.2.bias"), "do not match"),
        ("medusa", lambda t: t.update(extra=torch.zeros(2)), "unexpected tensor extra"),
    ],
)
def test_edited_tensors_are_refused(
    target: Any, head_files: dict[str, Path], tmp_path: Path, kind: str, edit: Any, message: str
) -> None:
    bad = rewrite(head_files[kind], tmp_path / "edited.safetensors", tensors=edit)
    refused(heads.load, bad, target, kind, match=message)


def test_a_head_without_a_specdec_header_is_refused(target: Any, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    path = tmp_path / "plain.safetensors"
    save_file({"x": torch.zeros(2)}, str(path))
    refused(heads.load, path, target, "eagle", match="no specdec header")


def test_a_head_loads_on_its_target_in_every_dtype(
    target: Any, head_files: dict[str, Path]
) -> None:
    """float16 once refused every head: the fingerprint hashed bfloat16
    roundings of the weights, and float32 -> float16 -> bfloat16 differs
    from float32 -> bfloat16."""
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        copy_ = copy.deepcopy(target).to(dtype)
        for kind, path in head_files.items():
            head = heads.load(path, copy_, kind)
            assert head.draft_vocab.numel() == 40
            assert next(head.parameters()).dtype == dtype


def test_a_target_with_other_decoder_layers_is_refused(
    target: Any, head_files: dict[str, Path]
) -> None:
    """The print covers every weight tensor, not only the embedding and the
    LM head: the same embedding on other decoder layers is another target."""
    other = copy.deepcopy(target)
    with torch.no_grad():
        other.model.layers[1].mlp.down_proj.weight.mul_(1.05)
    for kind, path in head_files.items():
        refused(heads.load, path, other, kind, match="another target .*down_proj")


def test_a_head_file_written_before_the_print_still_loads(
    target: Any, head_files: dict[str, Path], tmp_path: Path
) -> None:
    old = rewrite(
        head_files["eagle"], tmp_path / "old.safetensors", header=_set("target", "0" * 16)
    )
    refused(heads.load, old, target, "eagle", match="fingerprint 0000000000000000")
    legacy = heads.fingerprint(target)
    fine = rewrite(
        head_files["eagle"], tmp_path / "legacy.safetensors", header=_set("target", legacy)
    )
    assert heads.load(fine, target, "eagle").kind == "eagle"


def test_saving_a_non_finite_head_writes_nothing(target: Any, tmp_path: Path) -> None:
    head = heads.files.build("medusa", {"num_heads": 1}, target, torch.arange(8))
    with torch.no_grad():
        head.blocks[0].bias.fill_(float("nan"))
    path = tmp_path / "nan.safetensors"
    refused(heads.save, head, path, target, {}, match="NaN or inf")
    assert list(tmp_path.iterdir()) == []
    refused(
        heads.save,
        heads.files.build("medusa", {"num_heads": 1}, target, torch.arange(8)),
        path,
        target,
        {"loss": float("nan")},
        match="NaN",
    )
    assert list(tmp_path.iterdir()) == []


def _mutations() -> st.SearchStrategy[tuple[str, int, int]]:
    return st.tuples(
        st.sampled_from(["cut", "flip", "append", "header-size"]),
        st.integers(0, 2**20),
        st.integers(1, 255),
    )


@settings(max_examples=EXAMPLES)
@given(mutation=_mutations())
def test_damaged_head_bytes_are_refused(
    target: Any,
    head_files: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
    mutation: tuple[str, int, int],
) -> None:
    """Bytes cut, flipped or appended anywhere, or a header size that lies:
    a ValueError, or (a flipped byte inside a weight) a head that loads."""
    how, at, value = mutation
    body = bytearray(head_files["medusa"].read_bytes())
    n = struct.unpack("<Q", body[:8])[0]
    if how == "cut":
        body = body[: at % len(body)]
    elif how == "flip":
        body[at % (8 + n)] ^= value  # inside the header: the part that is parsed
    elif how == "append":
        body += bytes([value]) * (1 + at % 64)
    else:
        body[:8] = struct.pack("<Q", at * 2**20 + value)
    path = tmp_path_factory.mktemp("damaged") / "head.safetensors"
    path.write_bytes(bytes(body))
    with deadline():
        try:
            heads.load(path, target, "medusa")
        except ValueError as e:
            assert str(path) in str(e) or "head file" in str(e)


def test_layouts_are_read_from_the_header_alone(tmp_path: Path) -> None:
    """A header that promises more data than the file holds is refused
    before any read of the data (no allocation of its size)."""
    path = tmp_path / "huge.safetensors"
    header = json.dumps({"x": {"dtype": "F32", "shape": [2**40], "data_offsets": [0, 2**42]}})
    path.write_bytes(struct.pack("<Q", len(header)) + header.encode())
    refused(_files.safetensors_layout, path, match="bytes of data", what="t", fix="f")
