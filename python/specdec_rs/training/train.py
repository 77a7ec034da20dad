"""Training the heads on the frozen target's features (written on
`accelerate`: the same code runs on the CPU, one GPU or several).
p = target, q = draft.

EAGLE-style head, at output position j (inputs f_j, x_{j+1}): a regression of
the next feature, SmoothL1(f̂_{j+1}, f_{j+1}), plus cross-entropy of x_{j+2}
over the draft vocabulary, at each unrolled depth d = 1 .. `depth` (EAGLE-3's
training-time test: depth d >= 2 reads the head's own depth d - 1 outputs),
weighted 0.8^(d - 1); the first `depth1_share` of the steps train depth 1 only.
With labels="target" the cross-entropy is against the target's own
distribution at that position (from the stored features), not the data's
token. Medusa head i at position j: cross-entropy of x_{j+1+i}. Losses count
answer tokens only (the prompt is context). Tokens outside the draft
vocabulary are left out of the token cross-entropy.

Over 400 lines: the loss of each head kind, the loop, checkpoints and the
resume logic are one training run's steps, kept together so a change to one
step is read beside the others it must agree with.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specdec_rs import _checks, _files
from specdec_rs.limits import (
    MAX_BATCH,
    MAX_EPOCHS,
    MAX_LAYER_SIZE,
    MAX_LR,
    MAX_MEDUSA_HEADS,
    MAX_TOKENS,
)
from specdec_rs.training.data import Sequence, load_dataset

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

    from specdec_rs.heads import EagleHead, MedusaHeads
    from specdec_rs.heads.files import Head


@dataclass(frozen=True)
class TrainConfig:
    """kind: 'eagle' or 'medusa'. depth: unrolled draft depth of the EAGLE
    loss; depth1_share: the share of the steps (the first ones) that train
    the EAGLE head at depth 1 only (steps cost about half; the first draft
    learns fastest there) before the depth-`depth` loss; labels: "tokens"
    (cross-entropy of the data's next tokens) or "target" (of the target's
    own distribution there: distillation); medusa_heads: m. draft_vocab: N,
    or 0 to take the smallest size in `vocab_sizes` covering `coverage` of
    the training answers' tokens."""

    kind: str = "eagle"
    epochs: float = 4.0
    batch_size: int = 8
    lr: float = 1e-3
    depth: int = 2
    depth1_share: float = 0.0
    medusa_heads: int = 3
    max_len: int = 512
    draft_vocab: int = 0
    coverage: float = 0.97
    vocab_sizes: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384)
    reg_weight: float = 1.0
    labels: str = "tokens"
    holdout: float = 0.05
    checkpoint_every: int = 200
    seed: int = 0

    def __post_init__(self) -> None:
        _checks.choice(self.kind, "kind", ("eagle", "medusa"))
        _checks.choice(self.labels, "labels", ("tokens", "target"))
        _checks.real(self.epochs, "epochs", above=0.0, maximum=MAX_EPOCHS)
        _checks.integer(self.batch_size, "batch_size", minimum=1, maximum=MAX_BATCH)
        _checks.real(self.lr, "lr", above=0.0, maximum=MAX_LR)
        _checks.integer(self.depth, "depth", minimum=1, maximum=8)
        _checks.real(self.depth1_share, "depth1_share", minimum=0.0, maximum=1.0)
        _checks.integer(self.medusa_heads, "medusa_heads", minimum=1, maximum=MAX_MEDUSA_HEADS)
        _checks.integer(self.max_len, "max_len", minimum=4, maximum=MAX_TOKENS)
        _checks.integer(self.draft_vocab, "draft_vocab", minimum=0, maximum=MAX_LAYER_SIZE)
        _checks.real(self.coverage, "coverage", minimum=0.0, maximum=1.0)
        _checks.real(self.reg_weight, "reg_weight", minimum=0.0, maximum=1e6)
        _checks.real(self.holdout, "holdout", minimum=0.0, maximum=0.5)
        _checks.integer(self.checkpoint_every, "checkpoint_every", minimum=1)
        _checks.seed(self.seed)


@dataclass(frozen=True)
class VocabChoice:
    """The draft vocabulary (ids, most frequent first) and the share of the
    training answers' tokens each candidate size covers."""

    ids: list[int]
    coverage: dict[int, float]


@dataclass(frozen=True)
class TrainResult:
    """The saved head's path and how its training went: losses are means over
    the first and the last tenth of this run's steps; holdout_agreement is
    the argmax agreement with the target on held-out greedy answers, by draft
    depth (EAGLE) or head (Medusa)."""

    path: str
    kind: str
    seconds: float
    steps: int
    train_sequences: int
    holdout_sequences: int
    answer_tokens: int  # in all the data's answers (training and held out)
    draft_vocab: int
    coverage: dict[int, float]
    first_loss: float
    last_loss: float
    holdout_agreement: list[float] = field(default_factory=list)


def choose_draft_vocab(
    seqs: list[Sequence], config: TrainConfig, always: list[int], vocab: int | None = None
) -> VocabChoice:
    """The draft vocabulary: `always` (e.g. end-of-turn ids), then the most
    frequent answer tokens, N in all (config.draft_vocab, or by coverage).
    An explicit N is kept exactly: when the answers hold fewer distinct
    tokens, the most frequent prompt tokens, then the lowest other ids of
    the target's `vocab`, fill it up. N past `vocab` is a ValueError."""
    counts: Counter[int] = Counter()
    for s in seqs:
        counts.update(s.tokens[s.prompt_len :].tolist())
    ranked = [t for t, _ in counts.most_common()]
    total = sum(counts.values())
    coverage = {n: sum(counts[t] for t in ranked[:n]) / total for n in config.vocab_sizes}
    size = config.draft_vocab or next(
        (n for n in config.vocab_sizes if coverage[n] >= config.coverage), config.vocab_sizes[-1]
    )
    ids = [t for t in always if t not in ranked[:size]] + ranked[:size]
    ids = ids[:size]
    if vocab is not None and size > vocab:
        raise ValueError(
            f"draft_vocab = {size}, but the target's vocabulary has {vocab} ids; pass at "
            f"most {vocab}, or 0 to choose the size by coverage"
        )
    if config.draft_vocab and len(ids) < size:
        if vocab is None:
            raise ValueError(
                f"draft_vocab = {size} needs the target's vocabulary size (vocab=) to fill "
                f"up the {len(ids)} distinct answer tokens"
            )
        prompt: Counter[int] = Counter()
        for s in seqs:
            prompt.update(s.tokens[: s.prompt_len].tolist())
        taken = set(ids)
        fill = [t for t, _ in prompt.most_common() if t not in taken]
        fill += [t for t in range(vocab) if t not in taken and t not in prompt]
        ids += fill[: size - len(ids)]
    return VocabChoice(ids, coverage)


def split(seqs: list[Sequence], holdout: float, seed: int) -> tuple[list[Sequence], list[Sequence]]:
    import random

    order = list(range(len(seqs)))
    random.Random(seed).shuffle(order)
    n_hold = int(len(seqs) * holdout)
    return [seqs[i] for i in order[n_hold:]], [seqs[i] for i in order[:n_hold]]


def collate(batch: list[Sequence], max_len: int) -> dict[str, torch.Tensor]:
    """Right-padded tensors: tokens (B, L + 1), features (B, L, H) float32,
    lengths (B,) in tokens, prompt_len (B,); sequences longer than max_len
    lose their first tokens."""
    import torch

    cut = [max(0, len(s.tokens) - max_len) for s in batch]
    width = max(len(s.tokens) - c for s, c in zip(batch, cut, strict=True))
    h = batch[0].features.shape[1]
    tokens = torch.zeros(len(batch), width, dtype=torch.long)
    feats = torch.zeros(len(batch), width - 1, h)
    for i, (s, c) in enumerate(zip(batch, cut, strict=True)):
        n = len(s.tokens) - c
        tokens[i, :n] = s.tokens[c:]
        feats[i, : n - 1] = s.features[c:].float()
    lengths = torch.tensor([len(s.tokens) - c for s, c in zip(batch, cut, strict=True)])
    prompt_len = torch.tensor([max(2, s.prompt_len - c) for s, c in zip(batch, cut, strict=True)])
    return {"tokens": tokens, "features": feats, "lengths": lengths, "prompt_len": prompt_len}


def target_mask(batch: dict[str, torch.Tensor], offset: int, first: int) -> torch.Tensor:
    """(B, L) valid output positions j: token j + offset lies inside the
    sequence and at least `first` tokens into the answer (so the round that
    drafts it started in the answer)."""
    import torch

    j = torch.arange(batch["features"].shape[1])[None]
    tok = j + offset
    return (tok < batch["lengths"][:, None]) & (tok >= batch["prompt_len"][:, None] + first)


def losses(
    head: Head,
    batch: dict[str, torch.Tensor],
    config: TrainConfig,
    vocab_index: torch.Tensor,
    depth: int | None = None,
) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """The training loss and, per depth (EAGLE; `depth`, default
    config.depth) or head (Medusa), the (correct argmax, count) of the
    cross-entropy's positions."""
    from specdec_rs.heads import EagleHead

    if isinstance(head, EagleHead):
        return eagle_losses(head, batch, config, vocab_index, depth or config.depth)
    return medusa_losses(head, batch, config, vocab_index)


def eagle_losses(
    head: EagleHead,
    batch: dict[str, torch.Tensor],
    config: TrainConfig,
    vocab_index: torch.Tensor,
    depth: int,
) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """Σ_d 0.8^(d-1) (CE_d + reg_weight · SmoothL1_d) / Σ_d 0.8^(d-1)."""
    from torch.nn import functional as F

    tokens, feats = batch["tokens"], batch["features"]
    terms, weights, hits = [], [], []
    label = vocab_index[tokens[:, 2:]]  # (B, L - 1): output j predicts x_{j+2}
    width = label.shape[1]
    true_next = feats[:, 1 : width + 1]  # f_{j+1}, what output j predicts
    for d, out in enumerate(head.unroll(feats, tokens, depth), start=1):
        m = target_mask(batch, 2, d - 1)[:, :width]  # rounds that start in the answer
        pred, truth = out[:, :width][m], true_next[m]
        logits = head.logits(pred)
        hits.append(_hits(logits, label[m]))
        if not len(pred):  # answers too short for this depth in this batch
            continue
        teacher = teacher_logits(head, truth) if config.labels == "target" else None
        ce = _cross_entropy(logits, label[m], teacher)
        reg = F.smooth_l1_loss(pred, truth)
        terms.append(0.8 ** (d - 1) * (ce + config.reg_weight * reg))
        weights.append(0.8 ** (d - 1))
    return _weighted(head, terms, weights), hits


def medusa_losses(
    head: MedusaHeads,
    batch: dict[str, torch.Tensor],
    config: TrainConfig,
    vocab_index: torch.Tensor,
) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """The mean over heads of CE(head i at j, x_{j+1+i})."""

    tokens, feats = batch["tokens"], batch["features"]
    terms, hits = [], []
    for i in range(head.num_heads):
        label = vocab_index[tokens[:, 2 + i :]]  # head i + 1 at j predicts x_{j+2+i}
        m = target_mask(batch, 2 + i, i)[:, : label.shape[1]]
        logits = head.head_logits(feats[:, : label.shape[1]][m], i)
        hits.append(_hits(logits, label[m]))
        if not len(logits):  # answers too short for this head in this batch
            continue
        truth = feats[:, 1 + i : 1 + i + label.shape[1]]  # f_{j+1+i}: the target's view
        teacher = teacher_logits(head, truth[m]) if config.labels == "target" else None
        terms.append(_cross_entropy(logits, label[m], teacher))
    return _weighted(head, terms, [1.0] * len(terms)), hits


def _weighted(head: Head, terms: list[torch.Tensor], weights: list[float]) -> torch.Tensor:
    """Σ terms / Σ weights over the terms a batch has; with none (every
    answer too short, or every label outside the draft vocabulary), a zero
    that still reaches every parameter (so a step of several processes
    stays in step), never the NaN of a mean over nothing."""
    import torch

    if not terms:
        return torch.stack([p.sum() for p in head.parameters() if p.requires_grad]).sum() * 0.0
    return torch.stack(terms).sum() / sum(weights)


def teacher_logits(head: Head, truth: torch.Tensor) -> torch.Tensor:
    """(..., H) -> (..., N): the target's own logits over the draft vocabulary
    (its LM-head rows) at the true features f_{j+a}: the distillation target
    of an output that predicts x_{j+a+1}."""
    import torch

    with torch.no_grad():
        out: torch.Tensor = head.vocab_rows(truth)
    return out


def draft_vocab_index(draft_vocab: torch.Tensor, vocab: int) -> torch.Tensor:
    """(vocab,) the position of each token id in the draft vocabulary, -100
    (cross-entropy's ignore index) for the ids outside it."""
    import torch

    index = torch.full((vocab,), -100, dtype=torch.long)
    index[draft_vocab] = torch.arange(len(draft_vocab))
    return index


def _cross_entropy(
    logits: torch.Tensor, label: torch.Tensor, teacher: torch.Tensor | None
) -> torch.Tensor:
    """Cross-entropy of the head's logits (M, N) against the data's next
    tokens `label` (M,) (-100 = outside the draft vocabulary, left out), or,
    given the target's logits `teacher` (M, N), against the target's own
    distribution renormalized over the draft vocabulary, softmax(teacher)
    (distillation; every position counts)."""
    from torch.nn import functional as F

    if teacher is not None:
        return F.cross_entropy(logits, teacher.softmax(-1))
    if not bool((label != -100).any()):  # every token outside the draft vocabulary
        return logits.sum() * 0.0  # (a mean over nothing would be NaN)
    return F.cross_entropy(logits, label, ignore_index=-100)


def _hits(logits: torch.Tensor, label: torch.Tensor) -> tuple[int, int]:
    """(argmax == label, count), counting tokens outside the draft vocabulary as misses."""
    return int((logits.argmax(-1) == label).sum()), int(label.numel())


def _objective(head: Head, config: TrainConfig, vocab_index: torch.Tensor) -> Any:
    """The head and its loss as one module, so `accelerate` (DDP on several
    processes) wraps the forward that makes the gradients."""
    from torch import nn

    class _Objective(nn.Module):
        vocab_index: torch.Tensor

        def __init__(self) -> None:
            super().__init__()
            self.head = head
            self.register_buffer("vocab_index", vocab_index, persistent=False)

        def forward(
            self, batch: dict[str, torch.Tensor], depth: int
        ) -> tuple[torch.Tensor, list[tuple[int, int]]]:
            return losses(self.head, batch, config, self.vocab_index, depth)

    return _Objective()


def train_drafter(
    target: PreTrainedModel,
    data_dir: str | Path,
    out: str | Path,
    config: TrainConfig,
    *,
    end_ids: list[int] | None = None,
    info: dict[str, Any] | None = None,
    progress: Callable[[str, int], Callable[[], None]] | None = None,
) -> TrainResult:
    """Train a head of `config.kind` on the shards in `data_dir` and save it
    to `out` (safetensors, bfloat16). Checkpoints go to `out`.ckpt/ every
    `checkpoint_every` steps, each written whole before it replaces the last;
    a rerun with the same settings on the same data resumes there.
    `end_ids` always join the draft vocabulary; `info` goes into the file's header.

    Checked before any training: `out` (a writable file name, not a folder,
    not ending in .ckpt or .partial), the data's every shard, answers long
    enough for the depth (EAGLE) or the heads (Medusa), the draft
    vocabulary's size, and a checkpoint's every field. Training stops with a
    ValueError at the first non-finite loss, naming the step and the
    learning rate; `out` is then left as it was.

    Under `accelerate launch` with P processes each step takes P batches of
    `batch_size` (one per process, gradients averaged); one process gives
    the same steps as a plain call."""
    import torch
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, set_seed

    from specdec_rs import heads

    started = time.perf_counter()
    out = _files.new_output_file(out, "out", reserved=(".ckpt", ".partial"))
    ckpt = checkpoint_path(out)
    set_seed(config.seed)
    from specdec_rs import models

    vocab, hidden = models.lm_head_shape(target)  # type: ignore[misc]
    seqs = load_dataset(data_dir, vocab=int(vocab), hidden=int(hidden))
    train, hold = split(seqs, config.holdout, config.seed)
    check_lengths(train, config)
    choice = choose_draft_vocab(train, config, end_ids or [], int(vocab))
    draft_vocab = torch.tensor(choice.ids)
    vocab_index = draft_vocab_index(draft_vocab, int(vocab))
    head_config = {"num_heads": config.medusa_heads} if config.kind == "medusa" else {}
    head = heads.files.build(config.kind, head_config, target, draft_vocab).float().train()
    params = [p for p in head.parameters() if p.requires_grad]
    accelerator = Accelerator(
        kwargs_handlers=[DistributedDataParallelKwargs(broadcast_buffers=False)],
    )
    world, rank = accelerator.num_processes, accelerator.process_index
    global_batch = config.batch_size * world
    steps_per_epoch = math.ceil(len(train) / global_batch)
    total_steps = max(1, round(config.epochs * steps_per_epoch))
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_scale(s, total_steps))
    objective = _objective(head, config, vocab_index)
    objective, optimizer, scheduler = accelerator.prepare(objective, optimizer, scheduler)
    shallow = round(config.depth1_share * total_steps)  # steps at depth 1 only
    marker = {
        "config": asdict(config),
        "processes": world,
        "data": data_digest(data_dir),
        "draft_vocab": choice.ids,
    }
    step = _resume(accelerator, ckpt, marker, total_steps)
    advance = progress(f"training the {config.kind} head", total_steps - step) if progress else None
    generator = torch.Generator()
    order: list[int] = []
    loss_log: list[float] = []
    for s in range(step, total_steps):
        epoch, at = divmod(s, steps_per_epoch)
        if at == 0 or not order:  # the same permutation on every process
            order = torch.randperm(
                len(train), generator=generator.manual_seed(config.seed + epoch)
            ).tolist()
        chunk = order[at * global_batch : (at + 1) * global_batch]
        mine = chunk[rank::world] or chunk[rank % len(chunk) :][:1]
        batch = {
            k: v.to(accelerator.device)
            for k, v in collate([train[i] for i in mine], config.max_len).items()
        }
        loss, _ = objective(batch, 1 if s < shallow else config.depth)
        loss_log.append(float(loss.detach()))
        if not math.isfinite(loss_log[-1]):
            raise ValueError(
                f"training diverged at step {s + 1} of {total_steps}: the loss is "
                f"{loss_log[-1]} at learning rate {scheduler.get_last_lr()[0]:.3g}; nothing was "
                f"saved ({out} is as it was); lower --lr (now {config.lr:g})"
            )
        optimizer.zero_grad()
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(params, 1.0)
        optimizer.step()
        scheduler.step()
        if advance is not None:
            advance()
        if (s + 1) % config.checkpoint_every == 0 and s + 1 < total_steps:
            _checkpoint(accelerator, ckpt, {**marker, "step": s + 1})
    accelerator.wait_for_everyone()
    model = accelerator.unwrap_model(objective).head.eval()
    agreement = holdout_agreement(model, hold, config, vocab_index.to(accelerator.device))
    result = TrainResult(
        path=str(out),
        kind=config.kind,
        seconds=time.perf_counter() - started,
        steps=total_steps,
        train_sequences=len(train),
        holdout_sequences=len(hold),
        answer_tokens=sum(len(s.tokens) - s.prompt_len for s in seqs),
        draft_vocab=len(draft_vocab),
        coverage=choice.coverage,
        first_loss=_mean(loss_log[: max(1, len(loss_log) // 10)]),
        last_loss=_mean(loss_log[-max(1, len(loss_log) // 10) :]),
        holdout_agreement=agreement,
    )
    if accelerator.is_main_process:
        header = {
            **(info or {}),
            "config": asdict(config),
            "result": {k: v for k, v in asdict(result).items() if k != "path"},
        }
        heads.save(model, out, target, _files.json_safe(header))
        if ckpt.exists():  # finished: nothing to resume
            shutil.rmtree(ckpt)
    accelerator.wait_for_everyone()
    return result


def checkpoint_path(out: Path) -> Path:
    """The checkpoint folder of a head file: `out` with the suffix .ckpt."""
    ckpt = out.with_suffix(".ckpt")
    if ckpt.exists() and not ckpt.is_dir():
        raise ValueError(f"{ckpt} is a file; the checkpoint of {out} needs a folder there")
    return ckpt


def check_lengths(train: list[Sequence], config: TrainConfig) -> None:
    """ValueError unless some answer is long enough for every term of the
    loss: EAGLE depth d scores answers of >= d tokens, Medusa head i of >= i."""
    need = config.depth if config.kind == "eagle" else config.medusa_heads
    what = "--depth" if config.kind == "eagle" else "--medusa-heads"
    longest = max((len(s.tokens) - s.prompt_len for s in train), default=0)
    if longest < need:
        raise ValueError(
            f"the longest training answer has {longest} tokens; {what} {need} needs answers of "
            f"at least {need}; lower {what} or make the answers longer (--max-new-tokens)"
        )


def data_digest(data_dir: str | Path) -> str:
    """sha256 over the shards' names and bytes: which data a checkpoint was trained on."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted(Path(data_dir).glob("shard-*.safetensors")):
        digest.update(path.name.encode())
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


def holdout_agreement(
    head: Head, hold: list[Sequence], config: TrainConfig, vocab_index: torch.Tensor
) -> list[float]:
    """Argmax agreement with the target's own next tokens on the held-out
    greedy answers, by depth (EAGLE, teacher-forced rounds) or head (Medusa)."""
    import torch

    greedy = [s for s in hold if s.greedy]
    if not greedy:
        return []
    totals: list[list[int]] = []
    with torch.inference_mode():
        for i in range(0, len(greedy), config.batch_size):
            batch = collate(greedy[i : i + config.batch_size], config.max_len)
            _, hits = losses(head, batch, config, vocab_index)
            if not totals:
                totals = [[0, 0] for _ in hits]
            for t, (h, n) in zip(totals, hits, strict=True):
                t[0] += h
                t[1] += n
    return [h / n if n else float("nan") for h, n in totals]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _lr_scale(step: int, total: int) -> float:
    """Linear warm-up over 2% of the steps, then cosine decay to 10%."""
    warm = max(1, total // 50)
    if step < warm:
        return (step + 1) / warm
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))


CKPT_FIX = "delete it to start over"


def _checkpoint(accelerator: Any, ckpt: Path, marker: dict[str, Any]) -> None:
    """Save the state and `marker` (progress.json) into a temporary folder,
    then put it in place of `ckpt` (`_files.replace_dir`): a crash leaves the
    previous checkpoint whole."""
    tmp = ckpt.with_name(f"{ckpt.name}.partial")
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        _files.write_json(tmp / "progress.json", marker, what="the checkpoint's progress")
        _files.replace_dir(tmp, ckpt)
    accelerator.wait_for_everyone()


def _resume(accelerator: Any, ckpt: Path, marker: dict[str, Any], total_steps: int) -> int:
    """The step to resume from (0 without a checkpoint). A checkpoint made
    with other settings, other processes, other data or another draft
    vocabulary, or one whose files are damaged, is a ValueError."""
    path = ckpt / "progress.json"
    if not ckpt.exists():
        return 0
    saved = _files.Fields(
        _files.read_json(path, what="checkpoint progress", fix=CKPT_FIX),
        path,
        "checkpoint progress",
        CKPT_FIX,
    )
    for key, why in (
        ("config", "other settings"),
        ("processes", "another number of processes"),
        ("data", "other training data"),
        ("draft_vocab", "another draft vocabulary"),
    ):
        if saved.raw(key) != json.loads(json.dumps(marker[key])):
            raise ValueError(f"checkpoint {ckpt} was made with {why}; {CKPT_FIX}")
    step = saved.integer("step", minimum=1, maximum=total_steps - 1)
    try:
        accelerator.load_state(str(ckpt))
    except Exception as e:  # noqa: BLE001 - torch and safetensors raise their own types
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"checkpoint {ckpt} is damaged ({first}); {CKPT_FIX}") from None
    return step
