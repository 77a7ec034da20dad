"""specdec train-drafter: build the self-distilled data and train a head.

specdec train-drafter --kind eagle|medusa [--data DIR] [--out PATH] [--prompts 1200]
                      [--prompts-file F] [--max-new-tokens 128] [--batch-size 64]
                      [--epochs 4] [--depth 2]
                      [--depth1-share 0] [--labels tokens|target]
                      [--medusa-heads 3] [--draft-vocab 0] [--lr 1e-3]
                      [--model PATH] [--dtype float32] [--device cpu] [--seed 0] [--json]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, TypeVar

from rich.console import Console

from specdec_rs import limits
from specdec_rs.cli.flags import check_model_flags, load_target
from specdec_rs.cli.show import fmt, progress_bars, table
from specdec_rs.training import (
    DataConfig,
    TrainConfig,
    TrainReport,
    check_outputs,
    process_device,
    train_head,
)

T = TypeVar("T")


def add_parsers(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    t = sub.add_parser(
        "train-drafter", parents=parents, help="train an EAGLE-style or Medusa head on the target"
    )
    t.add_argument("--kind", default="eagle", help="eagle | medusa")
    t.add_argument(
        "--data", default=None, help="folder of the training data (default: the model cache)"
    )
    t.add_argument(
        "--out",
        default=None,
        help="the head's file (default: the model cache's heads/KIND.safetensors)",
    )
    d, c = DataConfig(), TrainConfig()
    t.add_argument(
        "--prompts",
        type=int,
        default=d.prompts,
        help=f"how many prompts (at most; 1..{limits.MAX_PROMPTS:,})",
    )
    t.add_argument(
        "--prompts-file",
        default=None,
        help='your own prompts instead of the built-in ones: .jsonl ({"prompt": ...} a line) '
        "or text (one a line)",
    )
    t.add_argument(
        "--max-new-tokens", type=int, default=d.max_new_tokens, help=f"2..{limits.MAX_TOKENS:,}"
    )
    t.add_argument(
        "--batch-size",
        type=int,
        default=d.batch_size,
        help=f"prompts answered together (1..{limits.MAX_BATCH})",
    )
    t.add_argument("--epochs", type=float, default=c.epochs, help=f"> 0, <= {limits.MAX_EPOCHS:g}")
    t.add_argument(
        "--train-batch-size", type=int, default=c.batch_size, help=f"1..{limits.MAX_BATCH}"
    )
    t.add_argument("--lr", type=float, default=c.lr, help=f"> 0, <= {limits.MAX_LR:g}")
    t.add_argument(
        "--depth", type=int, default=c.depth, help="unrolled draft depth of the EAGLE loss (1..8)"
    )
    t.add_argument(
        "--depth1-share",
        type=float,
        default=c.depth1_share,
        help="share of the steps (the first) that train the EAGLE head at depth 1 only",
    )
    t.add_argument(
        "--labels",
        default=c.labels,
        choices=("tokens", "target"),
        help="tokens (the data's next tokens) | target (the target's distribution: distillation)",
    )
    t.add_argument(
        "--medusa-heads", type=int, default=c.medusa_heads, help=f"1..{limits.MAX_MEDUSA_HEADS}"
    )
    t.add_argument(
        "--draft-vocab",
        type=int,
        default=c.draft_vocab,
        help="N (at most the target's vocabulary); 0 = by coverage",
    )
    t.set_defaults(run=run_train, show=show_train)


# the configs' fields and the flags that set them (errors name the flag)
DATA_FLAGS = {
    "prompts": "--prompts",
    "prompts_file": "--prompts-file",
    "max_new_tokens": "--max-new-tokens",
    "batch_size": "--batch-size",
}
TRAIN_FLAGS = {
    "kind": "--kind",
    "epochs": "--epochs",
    "batch_size": "--train-batch-size",
    "lr": "--lr",
    "depth": "--depth",
    "depth1_share": "--depth1-share",
    "labels": "--labels",
    "medusa_heads": "--medusa-heads",
    "draft_vocab": "--draft-vocab",
}


def configured(build: Callable[[], T], flags: dict[str, str]) -> T:
    """build(), its ValueError naming the flag where it named a config field."""
    try:
        return build()
    except ValueError as e:
        text = str(e)
        for field, flag in flags.items():
            if text.startswith(f"{field} = "):
                raise ValueError(flag + text[len(field) :]) from None
        raise


def run_train(args: argparse.Namespace, console: Console) -> TrainReport:
    check_model_flags(args)
    data = configured(
        lambda: DataConfig(
            prompts=args.prompts,
            prompts_file=args.prompts_file,
            max_new_tokens=args.max_new_tokens,
            batch_size=args.batch_size,
            seed=args.seed,
        ),
        DATA_FLAGS,
    )
    train = configured(
        lambda: TrainConfig(
            kind=args.kind,
            epochs=args.epochs,
            batch_size=args.train_batch_size,
            lr=args.lr,
            depth=args.depth,
            depth1_share=args.depth1_share,
            labels=args.labels,
            medusa_heads=args.medusa_heads,
            draft_vocab=args.draft_vocab,
            seed=args.seed,
        ),
        TRAIN_FLAGS,
    )
    configured(
        lambda: check_outputs(args.out, args.data, train.kind),
        {"out": "--out", "data_dir": "--data"},
    )
    args.device = process_device(args.device)  # under `accelerate launch`: one GPU each
    target, tokenizer = load_target(args)
    with progress_bars(console) as progress:
        return train_head(
            target,
            tokenizer,
            data=data,
            train=train,
            data_dir=args.data,
            out=args.out,
            progress=progress,
        )


def show_train(r: TrainReport, console: Console) -> None:
    res = r.result
    console.print(
        f"data: {r.sequences} answers, {r.answer_tokens} answer tokens in {r.data_dir} "
        f"({r.data_seconds:.0f} s this run)"
    )
    console.print(
        f"{res.kind} head: {res.steps} steps in {res.seconds:.0f} s "
        f"on {res.train_sequences} answers; "
        f"draft vocabulary {res.draft_vocab} tokens; saved to {res.path}"
    )
    cover = [[str(n), f"{c:.3f}"] for n, c in res.coverage.items()]
    console.print(table("coverage of the training answers' tokens", ["N", "coverage"], cover))
    label = "draft depth" if res.kind == "eagle" else "head"
    rows = [[str(i + 1), fmt(a, ".3f")] for i, a in enumerate(res.holdout_agreement)]
    console.print(
        table(
            f"argmax agreement on {res.holdout_sequences} held-out answers",
            [label, "agreement"],
            rows,
        )
    )
