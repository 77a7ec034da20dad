"""Training recipes for the EAGLE-style head, judged on the evaluation prompts.

The target answers the held-out evaluation prompts greedily (chat and code,
`prompts.workloads`; never trained on); each head's argmax agreement with the
target's next tokens is then measured by draft depth, teacher-forced, the
same measure as the training's held-out agreement (`holdout_agreement`),
whose figure on the training-distribution answers is printed beside it.
Recipes train on the data already built by `specdec train-drafter` (the
default data folder), each from scratch with its own TrainConfig settings;
`--heads` adds head files trained before (default: the shipped one).

`--topic-split` asks where the head's agreement is lost: a head trains on the
answers to prompts about half the built-in topics (and the code prompts), then
is measured on held-out answers of those topics, on the answers of the other
half, and on the evaluation prompts.

Run: python benchmarks/bench_training.py [--recipes 'tokens-1ep={"epochs": 1}' ...]
     [--heads PATH ...] [--chat-prompts 20] [--code-prompts 8] [--new-tokens 96]
     [--depth 3] [--out DIR] [--topic-split]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from specdec_rs import heads, models
from specdec_rs.prompts import workloads
from specdec_rs.prompts.training import TOPICS
from specdec_rs.training.data import (
    DataConfig,
    Sequence,
    answer_batch,
    chat_ends,
    load_dataset,
    write_shard,
)
from specdec_rs.training.pipeline import default_data_dir
from specdec_rs.training.train import (
    TrainConfig,
    draft_vocab_index,
    holdout_agreement,
    train_drafter,
)


def evaluation_answers(
    target: Any, tokenizer: Any, counts: dict[str, int], new_tokens: int
) -> dict[str, list[Sequence]]:
    """The target's greedy answers (with features) to the first prompts of each workload."""
    config = DataConfig(max_new_tokens=new_tokens)
    ends = sorted({int(tokenizer.eos_token_id), *chat_ends(tokenizer)})
    return {
        name: answer_batch(target, workloads.prompt_set(tokenizer, name, n), config, True, 0, ends)
        for name, n in counts.items()
    }


def agreement(
    target: Any, path: Path, answers: dict[str, list[Sequence]], depth: int
) -> dict[str, list[float]]:
    """Argmax agreement by draft depth 1..depth on each workload's answers."""
    head = heads.load(path, target, "eagle").float().eval()
    index = draft_vocab_index(head.draft_vocab, models.vocab_of(target))
    config = TrainConfig(depth=depth)
    return {name: holdout_agreement(head, seqs, config, index) for name, seqs in answers.items()}


def topic_split(
    target: Any, tokenizer: Any, args: argparse.Namespace, out: Path
) -> dict[str, list[Sequence]]:
    """Train a head (2 epochs, depth 2) on the answers to prompts about a
    random half of the topics (seed 0) plus the code prompts, one eighth of
    those topics' answers held out; returns the greedy answers to measure it
    on: held-out seen topics, unseen topics (prompts that name both kinds are
    left out). The head goes to out/topic-split.safetensors."""
    topics = list(TOPICS)
    random.Random(0).shuffle(topics)
    seen = set(topics[: len(topics) // 2])
    groups: dict[str, list[Sequence]] = {"seen": [], "unseen": [], "code": []}
    for s in load_dataset(args.data):
        text = tokenizer.decode(s.tokens[: s.prompt_len])
        named = {t for t in TOPICS if t in text}
        if "```python" in text:
            groups["code"].append(s)
        elif named and named <= seen:
            groups["seen"].append(s)
        elif named and not named & seen:
            groups["unseen"].append(s)
    random.Random(1).shuffle(groups["seen"])
    hold = len(groups["seen"]) // 8
    folder = out / "topic-split-data"
    folder.mkdir(exist_ok=True)
    write_shard(
        folder / "shard-00000.safetensors",
        groups["seen"][hold:] + groups["code"],
        target.config.hidden_size,
    )
    config = TrainConfig(depth=2, epochs=2, holdout=0.0)
    ends = sorted({int(tokenizer.eos_token_id), *chat_ends(tokenizer)})
    train_drafter(target, folder, out / "topic-split.safetensors", config, end_ids=ends)
    return {
        "seen topics, held out": [s for s in groups["seen"][:hold] if s.greedy],
        "unseen topics": [s for s in groups["unseen"] if s.greedy],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipes", nargs="*", default=[], help='NAME={"TrainConfig field": value}')
    ap.add_argument("--heads", nargs="*", default=[str(heads.files.shipped("eagle"))])
    ap.add_argument("--data", default=str(default_data_dir()))
    ap.add_argument("--chat-prompts", type=int, default=20)
    ap.add_argument("--code-prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--depth", type=int, default=3, help="draft depths measured")
    ap.add_argument("--out", default="bench-training")
    ap.add_argument("--topic-split", action="store_true", help="only the topic experiment")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target, tokenizer = models.load_smollm2(linear="torch", weights="float32")
    counts = {"chat": args.chat_prompts, "code": args.code_prompts}
    answers = evaluation_answers(target, tokenizer, counts, args.new_tokens)
    if args.topic_split:
        sets = {**topic_split(target, tokenizer, args, out), "evaluation chat": answers["chat"]}
        path = out / "topic-split.safetensors"
        found = agreement(target, path, sets, 2)
        found_tokens = {k: sum(len(s.tokens) - s.prompt_len for s in v) for k, v in sets.items()}
        table = Table(title="topic split: argmax agreement by draft depth (d1 / d2)")
        for column in ("answers", "count", "tokens", "agreement"):
            table.add_column(column)
        for name, values in found.items():
            row = [name, str(len(sets[name])), str(found_tokens[name])]
            table.add_row(*row, " / ".join(f"{v:.3f}" for v in values))
        Console(width=160).print(table)
        report = {"tokens": found_tokens, "agreement": found}
        (out / "topic-split.json").write_text(json.dumps(report, indent=1))
        return
    ends = sorted({int(tokenizer.eos_token_id), *chat_ends(tokenizer)})
    rows: list[dict[str, Any]] = []
    for path in args.heads:
        info = heads.files.read_header(path)["info"]
        result = info.get("result", {})
        rows.append(
            {
                "name": Path(path).name,
                "steps": result.get("steps"),
                "seconds": result.get("seconds"),
                "holdout": result.get("holdout_agreement", []),
                **agreement(target, Path(path), answers, args.depth),
            }
        )
    for recipe in args.recipes:
        name, _, settings = recipe.partition("=")
        config = TrainConfig(**json.loads(settings or "{}"))
        started = time.perf_counter()
        result = train_drafter(target, args.data, out / f"{name}.safetensors", config, end_ids=ends)
        rows.append(
            {
                "name": name,
                "steps": result.steps,
                "seconds": time.perf_counter() - started,
                "holdout": result.holdout_agreement,
                **agreement(target, out / f"{name}.safetensors", answers, args.depth),
            }
        )
    tokens = {k: sum(len(s.tokens) - s.prompt_len for s in v) for k, v in answers.items()}
    table = Table(title="argmax agreement with the target, by draft depth (teacher-forced)")
    for column in (
        "head / recipe",
        "steps",
        "train s",
        "held-out (training kind)",
        f"chat ({tokens['chat']} tokens)",
        f"code ({tokens['code']} tokens)",
    ):
        table.add_column(column)

    def fmt(values: list[float]) -> str:
        return " / ".join(f"{v:.3f}" for v in values)

    for r in rows:
        seconds = f"{r['seconds']:.0f}" if r["seconds"] is not None else "-"
        table.add_row(
            r["name"], str(r["steps"]), seconds, fmt(r["holdout"]), fmt(r["chat"]), fmt(r["code"])
        )
    Console(width=160).print(table)
    (out / "training.json").write_text(json.dumps({"tokens": tokens, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
