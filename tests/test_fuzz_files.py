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
import math
import os
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
# generated examples per test; SPECDEC_FUZZ_EXAMPLES=2000 digs deeper (as in test_fuzz.py)
EXAMPLES = int(os.environ.get("SPECDEC_FUZZ_EXAMPLES", "40"))


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


# ---- training data: shards, manifests, prompts files ---------------------------------------


@pytest.fixture(scope="module")
def data_dir(target: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from heads_fixtures import tiny_data

    folder = tmp_path_factory.mktemp("data")
    return tiny_data(target, folder)


def _shard_copy(data_dir: Path, folder: Path) -> Path:
    out = folder / "data"
    out.mkdir()
    for path in data_dir.glob("shard-*.safetensors"):
        (out / path.name).write_bytes(path.read_bytes())
    return out / "shard-00000.safetensors"


def _edit_shard(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))


SHARD_EDITS = [
    ("truncated", lambda p: p.write_bytes(p.read_bytes()[:-7]), "bytes of data"),
    ("garbage", lambda p: p.write_bytes(b"\x07" * 300), "not a safetensors file"),
    ("empty", lambda p: p.write_bytes(b""), "not a safetensors file"),
    ("no lengths", lambda p: _edit_shard(p, lambda t: t.pop("lengths")), "no tensor lengths"),
    (
        "lengths disagree",
        lambda p: _edit_shard(p, lambda t: t["lengths"].add_(1)),
        "lengths add up to",
    ),
    (
        "features too wide",
        lambda p: _edit_shard(p, lambda t: t.update(features=torch.zeros(3, H + 1).half())),
        "wide",
    ),
    (
        "ids past V",
        lambda p: _edit_shard(p, lambda t: t["tokens"].fill_(V + 4)),
        "token ids span",
    ),
    ("NaN features", lambda p: _edit_shard(p, lambda t: t["features"].fill_(float("nan"))), "NaN"),
    (
        "short answer",
        lambda p: _edit_shard(p, lambda t: t["prompt_lengths"].copy_(t["lengths"])),
        "answer under 2",
    ),
]


@pytest.mark.parametrize(
    ("name", "damage", "message"), SHARD_EDITS, ids=[e[0] for e in SHARD_EDITS]
)
def test_damaged_shards_are_refused_with_the_fix(
    target: Any, data_dir: Path, tmp_path: Path, name: str, damage: Any, message: str
) -> None:
    from specdec_rs.training.data import load_dataset

    shard = _shard_copy(data_dir, tmp_path)
    damage(shard)
    error = refused(load_dataset, shard.parent, vocab=V, hidden=H, match=message)
    assert str(shard) in str(error) and "rebuilt on the next run" in str(error)


def test_an_empty_batch_writes_a_valid_shard(target: Any, tmp_path: Path) -> None:
    """A batch whose answers were all under 2 tokens once stopped with
    torch.cat() of an empty list, on every rerun."""
    from specdec_rs.training.data import load_dataset, read_shard, write_shard

    path = tmp_path / "shard-00000.safetensors"
    write_shard(path, [], H)
    assert read_shard(path, vocab=V, hidden=H) == []
    refused(load_dataset, tmp_path, match="hold no sequences: every answer was under 2")


def test_manifests_name_their_differences_and_ignore_the_path_spelling(
    target: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from specdec_rs.training.data import DataConfig, check_manifest, manifest

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    monkeypatch.chdir(tmp_path)
    relative = manifest(DataConfig(prompts_file="./p.jsonl"), target)
    assert relative == manifest(DataConfig(prompts_file=prompts), target)
    out = tmp_path / "data"
    out.mkdir()
    (out / "manifest.json").write_text("{not json")
    assert check_manifest(out, relative) is False  # no shards yet: replaced, not refused
    (out / "shard-00000.safetensors").write_bytes(b"")
    refused(check_manifest, out, relative, match="manifest.json: the data manifest is not JSON")
    (out / "manifest.json").write_text(json.dumps(manifest(DataConfig(max_new_tokens=64), target)))
    error = str(refused(check_manifest, out, relative, match="other settings"))
    assert "config.max_new_tokens is 128 now, 64 there" in error
    assert len(error) < 400  # the fields that differ, not the manifest dumped whole


PROMPT_FILES = [
    ("lone surrogate", ".jsonl", b'{"prompt": "a\\ud800b"}\n', None, "lone surrogate"),
    (
        "lone surrogate in a turn",
        ".jsonl",
        b'{"messages": [{"role": "user", "content": "\\udfff"}]}\n',
        None,
        "lone surrogate",
    ),
    ("U+2028", ".jsonl", '{"prompt": "a\u2028b"}\n'.encode(), ["a\u2028b"], None),
    ("U+0085", ".jsonl", '{"prompt": "a\u0085b"}\n'.encode(), ["a\u0085b"], None),
    ("byte-order mark", ".jsonl", b'\xef\xbb\xbf{"prompt": "hi"}\r\n', ["hi"], None),
    ("upper-case suffix", ".JSONL", b'{"prompt": "x\\ny"}\n', ["x\ny"], None),
    ("form feed", ".txt", b"one\x0cstill one\ntwo\n", ["one\x0cstill one", "two"], None),
    ("not UTF-8", ".txt", b"caf\xe9\n", None, "not UTF-8"),
    ("empty", ".txt", b"\n\n", None, "holds no prompts"),
]


@pytest.mark.parametrize(
    ("name", "suffix", "body", "prompts", "message"), PROMPT_FILES, ids=[p[0] for p in PROMPT_FILES]
)
def test_prompts_files(
    tmp_path: Path, name: str, suffix: str, body: bytes, prompts: Any, message: Any
) -> None:
    from specdec_rs.prompts.training import read_prompts_file

    path = tmp_path / f"p{suffix}"
    path.write_bytes(body)
    if prompts is None:
        error = refused(read_prompts_file, path, match=message)
        assert str(path) in str(error)
    else:
        assert read_prompts_file(path) == prompts


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from specdec_rs import models

    return models.load_smollm2()[1]


def test_data_is_refused_before_anything_is_written(tokenizer: Any, tmp_path: Path) -> None:
    """Prompts all past max_prompt_tokens once ran to "holds no training
    shards; build them with `specdec train-drafter` first"; a bad prompts
    file once left a manifest that then refused the fixed file."""
    from specdec_rs.training.data import DataConfig, build_dataset

    target = tiny_llama(vocab_size=len(tokenizer), hidden_size=16, num_layers=1)
    long = tmp_path / "long.txt"
    long.write_text("word " * 500 + "\n")
    out = tmp_path / "data"
    config = DataConfig(prompts_file=long, max_new_tokens=2, batch_size=2)
    refused(build_dataset, out, target, tokenizer, config, match="longer than max_prompt_tokens")
    assert list(out.iterdir()) == []
    long.write_text("Say hi.\n")  # fixed: the same folder takes it
    build_dataset(out, target, tokenizer, DataConfig(prompts_file=long, max_new_tokens=3))
    assert (out / "shard-00000.safetensors").exists() and (out / "manifest.json").exists()


# ---- training: output paths, checkpoints, divergence ---------------------------------------


def _config(**kw: Any) -> Any:
    from specdec_rs.training.train import TrainConfig

    base = {"kind": "medusa", "epochs": 2, "batch_size": 4, "draft_vocab": 40, "medusa_heads": 2}
    return TrainConfig(**{**base, **kw})


@pytest.mark.parametrize(
    ("out", "message"),
    [
        ("folder", "is a folder"),
        ("/proc/self/head.safetensors", "cannot be written|not writable"),
        ("", "expected a file name"),
        ("x.ckpt", "ends in '.ckpt'"),
        ("x.partial", "ends in '.partial'"),
    ],
)
def test_output_paths_are_refused_before_any_work(
    target: Any, data_dir: Path, tmp_path: Path, out: str, message: str
) -> None:
    from specdec_rs.cli import main
    from specdec_rs.training import check_outputs
    from specdec_rs.training.train import train_drafter

    (tmp_path / "folder").mkdir()
    path = str(tmp_path / out) if out and not out.startswith("/") else out
    refused(train_drafter, target, data_dir, path, _config(), match=message)
    refused(check_outputs, path, tmp_path / "data", "eagle", match=message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder"]  # nothing written
    argv = ["train-drafter", "--out", path, "--model", str(tmp_path / "no-model")]
    with deadline():
        assert main(argv) == 2  # before the model loads (it does not exist)


@pytest.fixture(scope="module")
def checkpoint(target: Any, data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A head's checkpoint folder after an interrupted run (step 5 of 10)."""
    from specdec_rs.training.train import train_drafter

    folder = tmp_path_factory.mktemp("ckpt")

    def stop_after_six(description: str, total: int) -> Any:
        done = [0]

        def advance() -> None:
            done[0] += 1
            if done[0] == 6:
                raise KeyboardInterrupt

        return advance

    with pytest.raises(KeyboardInterrupt):
        train_drafter(
            target,
            data_dir,
            folder / "head.safetensors",
            _config(checkpoint_every=5),
            progress=stop_after_six,
        )
    return folder / "head.ckpt"


def _progress(edit: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
    def damage(ckpt: Path) -> None:
        marker = ckpt / "progress.json"
        marker.write_text(json.dumps(edit(json.loads(marker.read_text()))))

    return damage


def _truncate(name: str) -> Callable[[Path], None]:
    def damage(ckpt: Path) -> None:
        (path,) = ckpt.glob(name)
        path.write_bytes(path.read_bytes()[:100])

    return damage


def _replace_marker(ckpt: Path, make: Callable[[Path], None]) -> None:
    marker = ckpt / "progress.json"
    marker.unlink()
    make(marker)


CHECKPOINT_DAMAGE = [
    ("model truncated", _truncate("model*.safetensors"), "is damaged"),
    ("optimizer truncated", _truncate("optimizer*.bin"), "is damaged"),
    ("progress a list", _progress(lambda m: [1, 2]), "JSON array; expected an object"),
    ("progress a folder", lambda c: _replace_marker(c, Path.mkdir), "is a folder"),
    ("progress not JSON", lambda c: _replace_marker(c, lambda m: m.write_text("{")), "not JSON"),
    ("progress missing", lambda c: (c / "progress.json").unlink(), "is missing"),
    ("step a string", _progress(lambda m: {**m, "step": "abc"}), "field step"),
    ("step past the end", _progress(lambda m: {**m, "step": 10**6}), "field step"),
    ("step negative", _progress(lambda m: {**m, "step": -3}), "field step"),
    ("other data", _progress(lambda m: {**m, "data": "0" * 64}), "other training data"),
    ("other vocabulary", _progress(lambda m: {**m, "draft_vocab": [1]}), "draft vocabulary"),
]


@pytest.mark.parametrize(
    ("name", "damage", "message"), CHECKPOINT_DAMAGE, ids=[c[0] for c in CHECKPOINT_DAMAGE]
)
def test_damaged_checkpoints_are_refused(
    target: Any,
    data_dir: Path,
    checkpoint: Path,
    tmp_path: Path,
    name: str,
    damage: Any,
    message: str,
) -> None:
    import shutil

    from specdec_rs.training.train import train_drafter

    ckpt = tmp_path / "head.ckpt"
    shutil.copytree(checkpoint, ckpt)
    damage(ckpt)
    error = refused(
        train_drafter,
        target,
        data_dir,
        tmp_path / "head.safetensors",
        _config(checkpoint_every=5),
        match=message,
    )
    assert "delete it to start over" in str(error)
    assert not (tmp_path / "head.safetensors").exists()


def test_a_checkpoint_of_other_data_does_not_resume(
    target: Any, data_dir: Path, checkpoint: Path, tmp_path: Path
) -> None:
    """It once resumed silently, and the head then carried the first data's
    draft vocabulary, trained against the second's LM-head columns."""
    import shutil

    from heads_fixtures import tiny_data
    from specdec_rs.training.train import train_drafter

    (tmp_path / "other-data").mkdir()
    other = tiny_data(target, tmp_path / "other-data", seed=3)
    shutil.copytree(checkpoint, tmp_path / "head.ckpt")
    refused(
        train_drafter,
        target,
        other,
        tmp_path / "head.safetensors",
        _config(checkpoint_every=5),
        match="other training data",
    )


def test_a_failed_checkpoint_leaves_the_last_one_whole(tmp_path: Path) -> None:
    from specdec_rs.training.train import _checkpoint

    class Failing:
        is_main_process = True

        def wait_for_everyone(self) -> None:
            pass

        def save_state(self, folder: str) -> None:
            Path(folder).mkdir(parents=True, exist_ok=True)
            (Path(folder) / "model.safetensors").write_bytes(b"half")
            raise OSError("disk full")

    ckpt = tmp_path / "head.ckpt"
    ckpt.mkdir()
    (ckpt / "progress.json").write_text('{"step": 5}')
    with pytest.raises(OSError, match="disk full"):
        _checkpoint(Failing(), ckpt, {"step": 10})
    assert json.loads((ckpt / "progress.json").read_text()) == {"step": 5}
    assert sorted(p.name for p in ckpt.iterdir()) == ["progress.json"]


def test_training_stops_at_the_first_non_finite_loss(
    target: Any, data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from specdec_rs.training import train

    out = tmp_path / "head.safetensors"
    out.write_bytes(b"the previous head")
    real = train.losses
    calls = [0]

    def diverging(*args: Any, **kwargs: Any) -> Any:
        loss, hits = real(*args, **kwargs)
        calls[0] += 1
        return (loss * float("nan") if calls[0] == 3 else loss), hits

    monkeypatch.setattr(train, "losses", diverging)
    refused(train.train_drafter, target, data_dir, out, _config(), match="diverged at step 3 of")
    assert out.read_bytes() == b"the previous head"


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"kind": "eagle", "depth": 3}, "--depth 3 needs answers of at least 3"),
        ({"medusa_heads": 3}, "--medusa-heads 3 needs"),
    ],
)
def test_answers_too_short_for_the_loss_are_refused(
    target: Any, tmp_path: Path, kw: dict[str, Any], message: str
) -> None:
    """Answers shorter than the depth (or the heads) once gave NaN losses, rc 0."""
    from heads_fixtures import tiny_data
    from specdec_rs.training.train import train_drafter

    short = tiny_data(target, tmp_path, new=2)  # every answer 2 tokens
    out = tmp_path / "h.safetensors"
    refused(train_drafter, target, short, out, _config(**kw), match=message)
    train_drafter(target, short, out, _config(**{**kw, "depth": 2, "medusa_heads": 2}))


def test_a_one_token_draft_vocabulary_trains_to_finite_losses(
    target: Any, data_dir: Path, tmp_path: Path
) -> None:
    """Every label outside the draft vocabulary once made the mean over
    nothing (NaN); the header is strict JSON (no NaN literal)."""
    from specdec_rs.training.train import train_drafter

    out = tmp_path / "h.safetensors"
    result = train_drafter(target, data_dir, out, _config(draft_vocab=1, kind="eagle", depth=2))
    assert math.isfinite(result.first_loss) and math.isfinite(result.last_loss)
    header = heads.files.read_header(out)
    json.loads(json.dumps(header), parse_constant=lambda c: pytest.fail(f"{c} in the header"))
    assert heads.load(out, target, "eagle").draft_vocab.numel() == 1


def test_an_explicit_draft_vocabulary_keeps_its_size(target: Any, data_dir: Path) -> None:
    """--draft-vocab N once silently became the number of distinct answer
    tokens; now N is kept (filled up from the prompts, then by id), and N
    past the target's vocabulary is refused."""
    from specdec_rs.training.data import load_dataset
    from specdec_rs.training.train import choose_draft_vocab

    seqs = load_dataset(data_dir)[:2]
    distinct = len({t for s in seqs for t in s.tokens[s.prompt_len :].tolist()})
    assert distinct < V - 2
    choice = choose_draft_vocab(seqs, _config(draft_vocab=V - 2), [], V)
    assert len(choice.ids) == V - 2 == len(set(choice.ids)) and max(choice.ids) < V
    refused(choose_draft_vocab, seqs, _config(draft_vocab=100_000), [], V, match="at most 48")


# ---- generated cases: files, harness inputs, the CLI ---------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=EXAMPLES)
@given(mutation=_mutations())
def test_damaged_shard_bytes_are_refused(
    data_dir: Path, tmp_path_factory: pytest.TempPathFactory, mutation: tuple[str, int, int]
) -> None:
    from specdec_rs.training.data import load_dataset

    how, at, value = mutation
    shard = sorted(data_dir.glob("shard-*"))[0]
    body = bytearray(shard.read_bytes())
    n = struct.unpack("<Q", body[:8])[0]
    if how == "cut":
        body = body[: at % len(body)]
    elif how == "flip":
        body[at % (8 + n)] ^= value
    elif how == "append":
        body += bytes([value]) * (1 + at % 64)
    else:
        body[:8] = struct.pack("<Q", at * 2**20 + value)
    folder = tmp_path_factory.mktemp("shard")
    (folder / shard.name).write_bytes(bytes(body))
    with deadline():
        try:
            load_dataset(folder, vocab=V, hidden=H)
        except ValueError as e:
            assert "rebuilt on the next run" in str(e)


@settings(max_examples=EXAMPLES)
@given(
    field=st.sampled_from(["step", "config", "processes", "data", "draft_vocab"]), value=JSON_VALUES
)
def test_crafted_checkpoint_progress_is_refused(
    target: Any,
    data_dir: Path,
    checkpoint: Path,
    tmp_path_factory: pytest.TempPathFactory,
    field: str,
    value: Any,
) -> None:
    """Any value in any field of progress.json: a ValueError naming the fix,
    nothing written (or, for another valid step, a resumed run)."""
    import shutil

    from specdec_rs.training.train import train_drafter

    folder = tmp_path_factory.mktemp("progress")
    ckpt = folder / "head.ckpt"
    shutil.copytree(checkpoint, ckpt)
    marker = ckpt / "progress.json"
    saved = json.loads(marker.read_text())
    if saved.get(field) == value:
        return
    marker.write_text(json.dumps({**saved, field: value}))
    out = folder / "head.safetensors"
    with deadline():
        try:
            train_drafter(target, data_dir, out, _config(checkpoint_every=5))
        except ValueError as e:
            assert "delete it to start over" in str(e)
            assert not out.exists() and not list(folder.glob("*.partial*"))
            return
    assert field == "step" and type(value) is int and value >= 1  # another valid step: resumed
    assert out.exists()


@settings(max_examples=EXAMPLES)
@given(
    text=st.lists(
        st.characters(codec="utf-8", exclude_categories=["Cs"])
        | st.sampled_from(["\n", "\r", "{", '"', '{"prompt": "', "\\ud800", '"}']),
        max_size=24,
    ).map("".join),
    suffix=st.sampled_from([".jsonl", ".txt", ".JSONL"]),
    bom=st.booleans(),
)
def test_generated_prompts_files(
    tmp_path_factory: pytest.TempPathFactory, text: str, suffix: str, bom: bool
) -> None:
    """Any UTF-8 text: a list of prompts, each a non-empty string (or a
    conversation) that encodes as UTF-8, or a ValueError naming the file."""
    from specdec_rs.prompts.training import read_prompts_file

    path = tmp_path_factory.mktemp("prompts") / f"p{suffix}"
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))
    with deadline():
        try:
            prompts = read_prompts_file(path)
        except ValueError as e:
            assert str(path) in str(e)
            return
    assert prompts
    for p in prompts:
        texts = [p] if isinstance(p, str) else [t["content"] for t in p]
        for t in texts:
            t.encode("utf-8")
        assert texts[-1].strip()


OUTPUTS = st.one_of(
    st.lists(st.integers(-(2**64), 2**64), max_size=6),
    st.tuples(st.lists(st.integers(0, 4), max_size=3), st.lists(st.integers(0, 4), max_size=3)),
    st.lists(st.floats(), max_size=3),
    st.sampled_from(
        [None, "0 1", b"\x00", 3, 2.5, [[0, 1], [2]], {"tokens": [0]}, np_bool := [True]]
    ),
)


@settings(max_examples=EXAMPLES)
@given(output=OUTPUTS)
def test_the_harness_takes_any_verifier_output(output: Any) -> None:
    """Whatever a verifier returns, the audit gives a verdict (never passing
    a constant or out-of-range answer) or a ValueError; nothing else."""
    from specdec_rs import testing

    def constant(p: Any, q: Any, d: Any, rng: Any) -> Any:
        return output

    with deadline():
        audit = testing.audit_chain(constant, runs=100, cases=testing.default_cases()[:1])
    assert not audit.passed


@settings(max_examples=EXAMPLES)
@given(
    kwargs=st.fixed_dictionaries(
        {},
        optional={
            "runs": st.integers(-5, 2**70) | st.floats() | st.text(max_size=3),
            "seed": st.integers(-5, 2**70),
            "significance": st.floats() | st.integers(-2, 2) | st.none(),
            "cases": st.sampled_from([[], None, [1], "dense", ()]),
        },
    )
)
def test_the_harness_checks_its_own_arguments(kwargs: dict[str, Any]) -> None:
    from specdec_rs import testing

    own = testing.project_verifiers()["chain"]
    small = {"runs": 100, "cases": testing.default_cases()[:1], **kwargs}
    with deadline():
        try:
            audit = testing.audit_chain(own, **small)
        except ValueError as e:
            assert str(e)
            return
    assert audit.passed  # valid arguments: the exact verifier passes


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_the_cli_refuses_damaged_heads_with_one_line(
    kind: str, head_files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through the command: exit 2 and one line naming the file (SmolLM2 is
    the target here, so even a whole head of the tiny target is refused)."""
    from specdec_rs.cli import main

    damaged = tmp_path / "damaged.safetensors"
    damaged.write_bytes(head_files[kind].read_bytes()[:-3])
    for path in (damaged, head_files[kind]):
        assert main(["generate", "hi", "--drafter", f"{kind}:{path}", "--max-new-tokens", "2"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(path) in err


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"prompt": "\\ud800"}\n', "lone surrogate"),
        (b"\xff\n", "not UTF-8"),
        (b"{\n", "not JSON"),
        (b"[" * 100_000 + b"\n", "not strict JSON"),
    ],
)
def test_the_cli_refuses_damaged_prompts_files_with_one_line(
    body: bytes, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from specdec_rs.cli import main

    path = tmp_path / "prompts.jsonl"
    path.write_bytes(body)
    argv = ["train-drafter", "--prompts-file", str(path), "--model", str(tmp_path / "none")]
    assert main(argv) == 2  # before the model loads (it does not exist)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and str(path) in err
