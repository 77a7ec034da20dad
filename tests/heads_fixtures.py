"""Tiny trained heads for the tests: a random tiny target answers random
prompts (the training data path of `specdec_rs.training`), then an EAGLE-style
head and Medusa heads train for a few steps on it. p = target, q = draft."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from specdec_rs.training.data import DataConfig, answer_batch, write_shard
from specdec_rs.training.train import TrainConfig, train_drafter


def tiny_data(
    target: Any, folder: Path, *, prompts: int = 24, new: int = 12, seed: int = 0
) -> Path:
    """Two shards (greedy, sampled) of the target's answers to random prompts."""
    vocab = target.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    config = DataConfig(prompts=prompts, max_new_tokens=new, batch_size=prompts // 2)
    for shard, greedy in enumerate((True, False)):
        batch = [
            torch.randint(0, vocab, (int(torch.randint(3, 7, (1,), generator=g)),), generator=g)
            for _ in range(prompts // 2)
        ]
        seqs = answer_batch(target, batch, config, greedy, seed + shard, eos=[vocab + 7])
        write_shard(folder / f"shard-{shard:05d}.safetensors", seqs, target.config.hidden_size)
    return folder


def tiny_head(
    target: Any, folder: Path, kind: str, *, draft_vocab: int, steps_epochs: float = 6.0, **kw: Any
) -> Path:
    """Train a `kind` head for a few steps on `tiny_data`; returns its file."""
    data = folder / "data"
    if not data.exists():
        data.mkdir(parents=True)
        tiny_data(target, data)
    out = folder / f"{kind}.safetensors"
    kw.setdefault("depth1_share", 0.0)  # every step unrolled: the training graph the tests check
    config = TrainConfig(
        kind=kind, epochs=steps_epochs, batch_size=4, draft_vocab=draft_vocab, holdout=0.1, **kw
    )
    train_drafter(target, data, out, config)
    return out
