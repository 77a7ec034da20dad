"""Training the draft heads on a frozen target: self-distilled data
(`data`; its prompts in `specdec_rs.prompts`), the trainer (`train`, on
accelerate) and the two together (`pipeline.train_head`)."""

from specdec_rs.training.data import DataConfig, build_dataset, load_dataset
from specdec_rs.training.pipeline import TrainReport, check_outputs, process_device, train_head
from specdec_rs.training.train import TrainConfig, TrainResult, train_drafter

__all__ = [
    "DataConfig",
    "TrainConfig",
    "TrainReport",
    "TrainResult",
    "build_dataset",
    "check_outputs",
    "load_dataset",
    "process_device",
    "train_drafter",
    "train_head",
]
