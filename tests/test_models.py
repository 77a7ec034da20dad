"""Loading models: the converted-model cache and local folders fail with a
ValueError that says what to delete or set, before any conversion work."""

from __future__ import annotations

from pathlib import Path

import pytest
from specdec_rs import models

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def saved_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny")
    models.tiny_llama(vocab_size=32, num_layers=1).save_pretrained(folder)
    return folder


def test_cache_variable_pointing_at_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a_file = tmp_path / "cache"
    a_file.write_text("not a folder")
    monkeypatch.setenv("SPECDEC_CACHE", str(a_file))
    with pytest.raises(ValueError, match=r"SPECDEC_CACHE = .* is a file, not a folder; set"):
        models.load_smollm2()


def test_cache_folder_that_cannot_be_created(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDEC_CACHE", "/proc/specdec-cache")  # a read-only file system
    with pytest.raises(ValueError, match=r"SPECDEC_CACHE = .* cannot be created .*; set"):
        models.load_smollm2()


def test_incomplete_converted_folder_names_what_to_delete(tmp_path: Path, saved_tiny: Path) -> None:
    folder = tmp_path / "SmolLM2"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes((saved_tiny / "model.safetensors").read_bytes())
    with pytest.raises(ValueError, match=r"incomplete \(no config.json.*delete the folder"):
        models.load_smollm2(folder)


def test_damaged_weights_name_what_to_delete(tmp_path: Path, saved_tiny: Path) -> None:
    folder = tmp_path / "SmolLM2"
    folder.mkdir()
    for name in ("config.json", "tokenizer_config.json", "model.safetensors"):
        source = saved_tiny / name
        data = source.read_bytes() if source.exists() else b"{}"
        (folder / name).write_bytes(data[: len(data) // 2] if name.endswith("tensors") else data)
    with pytest.raises(ValueError, match=r"cannot load the model in .*delete the folder"):
        models.load_smollm2(folder)


def test_local_folders(tmp_path: Path, saved_tiny: Path) -> None:
    with pytest.raises(ValueError, match="is not a folder"):
        models.load_local(tmp_path / "missing")
    with pytest.raises(ValueError, match="no config.json"):
        models.load_local(tmp_path)
    (tmp_path / "config.json").write_bytes((saved_tiny / "config.json").read_bytes())
    with pytest.raises(ValueError, match="holds a config.json but no weights"):
        models.load_local(tmp_path)
    with pytest.raises(ValueError, match="must be a folder path"):
        models.load_local(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cannot load the model in"):
        models.load_local(saved_tiny)  # weights but no tokenizer: one line, not a traceback
