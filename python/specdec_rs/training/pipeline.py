"""Data, then training, for one head: what `specdec train-drafter` runs.
p = target, q = draft."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from specdec_rs import _files
from specdec_rs.training.data import DataConfig, build_dataset, chat_ends
from specdec_rs.training.train import TrainConfig, TrainResult, train_drafter

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass(frozen=True)
class TrainReport:
    """data_dir, the seconds spent on data (this run; near 0 when every
    shard was already there) and the training result."""

    data_dir: str
    data_seconds: float
    result: TrainResult

    @property
    def sequences(self) -> int:
        return self.result.train_sequences + self.result.holdout_sequences

    @property
    def answer_tokens(self) -> int:
        return self.result.answer_tokens


def default_data_dir() -> Path:
    return _files.cache_dir() / "training-data"


def default_out(kind: str) -> Path:
    return _files.cache_dir() / "heads" / f"{kind}.safetensors"


def process_device(device: str) -> str:
    """The device this process loads the target on: under `accelerate launch`
    with several processes, a plain "cuda" becomes this process's own GPU
    ("cuda:RANK"); anything else is kept."""
    from accelerate import PartialState

    state = PartialState()
    if state.num_processes > 1 and device == "cuda":
        return str(state.device)
    return device


def check_outputs(
    out: str | Path | None, data_dir: str | Path | None, kind: str
) -> tuple[Path, Path]:
    """(the head file, the data folder), defaults filled in, checked before
    any work: a writable file name that is not a folder, does not end in
    .ckpt or .partial, and whose checkpoint folder is free; a writable folder."""
    from specdec_rs import _checks, _files
    from specdec_rs.training.train import checkpoint_path

    head = _files.new_output_file(
        out if out is not None else default_out(kind), "out", reserved=(".ckpt", ".partial")
    )
    checkpoint_path(head)
    folder = _checks.writable_dir(
        data_dir if data_dir is not None else default_data_dir(), "data_dir"
    )
    return head, folder


def train_head(
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    data: DataConfig,
    train: TrainConfig,
    data_dir: str | Path | None = None,
    out: str | Path | None = None,
    progress: Callable[[str, int], Callable[[], None]] | None = None,
) -> TrainReport:
    """Build (or resume) the training data, then train and save one head.
    `out` and `data_dir` are checked before any work (see `train_drafter`)."""
    from accelerate import PartialState

    out, data_dir = check_outputs(out, data_dir, train.kind)

    started = time.perf_counter()
    # under `accelerate launch` one process writes the data, then the others read it
    with PartialState().main_process_first():
        build_dataset(data_dir, target, tokenizer, data, progress=progress)
    data_seconds = time.perf_counter() - started
    ends = sorted({int(tokenizer.eos_token_id), *chat_ends(tokenizer)})
    info = {"data": asdict(data), "data_seconds": data_seconds}
    result = train_drafter(target, data_dir, out, train, end_ids=ends, info=info, progress=progress)
    return TrainReport(str(data_dir), data_seconds, result)
