"""Training data from the target itself (self-distillation): the target
answers the built-in training prompts (batched generation), then one
teacher-forced target forward per batch records the features the heads learn
from (the last hidden state, the LM head's input).

Half the shards are greedy answers (what the target writes at temperature 0,
the main use), half sampled at temperature 0.7 with top-p 0.95 (the states
a sampled generation visits); a head learns from both. The features come from
the generation's own forwards (no second pass). Stored on disk as safetensors
shards (features float16), one per batch, written atomically; a rerun skips
the shards already there (resumable), after checking they were made with the
same settings and target.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specdec_rs import _checks, _files, models, runner
from specdec_rs.limits import MAX_BATCH, MAX_PROMPTS, MAX_TOKENS
from specdec_rs.prompts.training import prompts_digest, read_prompts_file, training_prompts

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass(frozen=True)
class DataConfig:
    """prompts: how many training prompts (the built-in ones, or the first
    of `prompts_file`: your own, see `read_prompts_file`); max_new_tokens:
    answer length cap; batch_size: prompts generated together; sampled_every:
    every n-th shard is sampled (the others greedy); temperature/top_p of the
    sampled shards; max_prompt_tokens: longer prompts are left out."""

    prompts: int = 1200
    max_new_tokens: int = 128
    batch_size: int = 64
    sampled_every: int = 2
    temperature: float = 0.7
    top_p: float = 0.95
    max_prompt_tokens: int = 384
    seed: int = 0
    prompts_file: str | None = None

    def __post_init__(self) -> None:
        _checks.integer(self.prompts, "prompts", minimum=1, maximum=MAX_PROMPTS)
        if self.prompts_file is not None:
            read_prompts_file(self.prompts_file)  # a bad file fails before any work
            object.__setattr__(self, "prompts_file", os.fspath(self.prompts_file))
        _checks.integer(self.max_new_tokens, "max_new_tokens", minimum=2, maximum=MAX_TOKENS)
        _checks.integer(self.batch_size, "batch_size", minimum=1, maximum=MAX_BATCH)
        _checks.integer(self.sampled_every, "sampled_every", minimum=1, maximum=MAX_PROMPTS)
        _checks.real(self.temperature, "temperature", minimum=0.0, maximum=100.0)
        _checks.real(self.top_p, "top_p", minimum=0.0, maximum=1.0)
        _checks.integer(self.max_prompt_tokens, "max_prompt_tokens", minimum=2, maximum=MAX_TOKENS)
        _checks.seed(self.seed)


@dataclass(frozen=True)
class Sequence:
    """One training example: tokens (n,) prompt + answer; features (n - 1, H)
    the target's last hidden states at positions 0 .. n - 2; prompt_len."""

    tokens: torch.Tensor
    features: torch.Tensor
    prompt_len: int
    greedy: bool


def encode_prompts(tokenizer: PreTrainedTokenizerBase, config: DataConfig) -> list[torch.Tensor]:
    """The training prompts in the chat template, at most max_prompt_tokens
    long, sorted by length (so a batch pads little)."""
    from specdec_rs.prompts.workloads import encode

    messages = (
        read_prompts_file(config.prompts_file)[: config.prompts]
        if config.prompts_file is not None
        else training_prompts(config.prompts, seed=config.seed)
    )
    encoded = [encode(tokenizer, m) for m in messages]
    kept = [e for e in encoded if len(e) <= config.max_prompt_tokens]
    return sorted(kept, key=len)


def answer_batch(
    target: PreTrainedModel,
    prompts: list[torch.Tensor],
    config: DataConfig,
    greedy: bool,
    seed: int,
    eos: list[int],
) -> list[Sequence]:
    """The target's answers to `prompts` (each cut after its first end-of-turn
    token) with their features, from one batched generation: the prompts,
    left-padded, run as one forward, then one forward per new token; the
    last hidden state of every position fed is the feature of that position
    (the same as a teacher-forced forward over prompt + answer would give,
    up to float rounding), so no second pass is needed."""
    import torch

    from specdec_rs.processors import SamplingConfig, logits_to_probs

    device = models.device_of(target)
    b, width = len(prompts), max(len(p) for p in prompts)
    ids = torch.zeros(b, width, dtype=torch.long)
    mask = torch.zeros(b, width, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = p
        mask[i, width - len(p) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    sampling = (
        SamplingConfig(0.0) if greedy else SamplingConfig(config.temperature, top_p=config.top_p)
    )
    rng = torch.Generator(device).manual_seed(seed)
    ends = torch.tensor(eos, device=device)
    cache = runner.new_cache(target)
    hidden_steps, tokens = [], []
    done = torch.zeros(b, dtype=torch.bool, device=device)
    with torch.inference_mode():
        feed = ids
        for _ in range(config.max_new_tokens):
            out = target.model(
                input_ids=feed,
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                **{runner.lone.cache_keyword(target.model.__class__): cache},
            )
            hidden_steps.append(out.last_hidden_state.float().cpu())
            probs = logits_to_probs(target.lm_head(out.last_hidden_state[:, -1]), sampling)
            x = probs.argmax(-1) if greedy else torch.multinomial(probs, 1, generator=rng)[:, 0]
            x = torch.where(done, ends[0], x)
            tokens.append(x.cpu())
            done |= torch.isin(x, ends)
            if bool(done.all()):
                break
            feed = x[:, None]
            mask = torch.cat([mask, torch.ones(b, 1, dtype=mask.dtype, device=device)], 1)
            positions = positions[:, -1:] + 1
    answers = torch.stack(tokens, 1)
    steps = torch.cat(hidden_steps[1:], 1) if len(hidden_steps) > 1 else None  # (B, steps - 1, H)
    out_seqs = []
    for i, p in enumerate(prompts):
        row = answers[i]
        hit = torch.isin(row, ends.cpu()).nonzero()
        answer = row[: int(hit[0]) + 1] if len(hit) else row
        prompt_feats = hidden_steps[0][i, width - len(p) :]
        answer_feats = steps[i, : len(answer) - 1] if steps is not None else prompt_feats[:0]
        features = torch.cat([prompt_feats, answer_feats])
        out_seqs.append(Sequence(torch.cat([p, answer]), features, len(p), greedy))
    return out_seqs


SHARD = "training shard"


def write_shard(path: Path, seqs: list[Sequence], hidden: int) -> None:
    """One shard, atomically; `seqs` may be empty (a batch whose answers
    were all too short), which writes a valid shard of no sequences."""
    import torch
    from safetensors.torch import save_file

    tensors = {
        "tokens": torch.cat([torch.zeros(0, dtype=torch.int32)] + [s.tokens.int() for s in seqs]),
        "features": torch.cat(
            [torch.zeros(0, hidden, dtype=torch.float16)] + [s.features.half() for s in seqs]
        ),
        "lengths": torch.tensor([len(s.tokens) for s in seqs], dtype=torch.long),
        "prompt_lengths": torch.tensor([s.prompt_len for s in seqs], dtype=torch.long),
        "greedy": torch.tensor([s.greedy for s in seqs], dtype=torch.bool),
    }
    with _files.atomic_file(path) as tmp:
        save_file(tensors, str(tmp))


def check_shard(path: Path, hidden: int | None = None) -> _files.Layout:
    """A shard's layout, from its header alone: the five tensors with their
    dtypes, one length per sequence, tokens and features that add up, and
    (given) features of the target's width. ValueError naming the shard."""
    layout = _files.safetensors_layout(path, what=SHARD, fix=_files.REBUILT)
    layout.exactly({"tokens", "features", "lengths", "prompt_lengths", "greedy"})
    tokens = layout.tensor("tokens", dtypes=_files.INTEGER_DTYPES, ndim=1)
    features = layout.tensor("features", dtypes=_files.FLOAT_DTYPES, ndim=2)
    n = layout.tensor("lengths", dtypes=_files.INTEGER_DTYPES, ndim=1).shape[0]
    for name, dtypes in (("prompt_lengths", _files.INTEGER_DTYPES), ("greedy", ("BOOL",))):
        layout.tensor(name, dtypes=dtypes, shape=(n,))
    if hidden is not None and features.shape[1] != hidden:
        raise layout.fail(
            f"its features are {features.shape[1]} wide; this target's are {hidden} "
            "(data made for another target)"
        )
    if features.shape[0] != tokens.shape[0] - n:
        raise layout.fail(
            f"it holds {tokens.shape[0]} tokens of {n} sequences but {features.shape[0]} "
            f"features; expected {tokens.shape[0] - n} (one per token but the last of each)"
        )
    return layout


def read_shard(
    path: Path, *, vocab: int | None = None, hidden: int | None = None
) -> list[Sequence]:
    """The sequences of one shard, checked: the layout (`check_shard`), then
    lengths that add up to the tokens, prompts of >= 1 token with answers of
    >= 2, token ids in [0, vocab) and finite features."""
    layout = check_shard(path, hidden)
    t = _files.load_tensors(layout)
    lengths, prompts = t["lengths"].long(), t["prompt_lengths"].long()
    if int(lengths.sum()) != len(t["tokens"]):
        raise layout.fail(
            f"its lengths add up to {int(lengths.sum())} tokens; it holds {len(t['tokens'])}"
        )
    if len(lengths) and bool(((prompts < 1) | (lengths - prompts < 2)).any()):
        raise layout.fail("a sequence has an empty prompt or an answer under 2 tokens")
    tokens = t["tokens"].long()
    if len(tokens) and (
        int(tokens.min()) < 0 or (vocab is not None and int(tokens.max()) >= vocab)
    ):
        raise layout.fail(
            f"its token ids span [{int(tokens.min())}, {int(tokens.max())}]; expected [0, {vocab})"
        )
    if not bool(t["features"].isfinite().all()):
        raise layout.fail("its features hold NaN or inf")
    out, at, fat = [], 0, 0
    columns = (lengths.tolist(), prompts.tolist(), t["greedy"].tolist())
    for n, p, g in zip(*columns, strict=True):
        out.append(Sequence(tokens[at : at + n], t["features"][fat : fat + n - 1], int(p), bool(g)))
        at, fat = at + n, fat + n - 1
    return out


MANIFEST_FIX = "choose another --data folder, or delete this one to build the data anew"


def manifest(config: DataConfig, target: PreTrainedModel) -> dict[str, Any]:
    """What the data was made with: the settings, the target's fingerprint
    and (own prompts) the prompts file's sha256; its path is left out, so
    the same file named another way, or moved, is the same data."""
    from specdec_rs.heads import fingerprint

    settings = asdict(config)
    del settings["prompts_file"]
    out = {"config": settings, "target": fingerprint(target)}
    if config.prompts_file is not None:
        out["prompts_sha256"] = prompts_digest(config.prompts_file)
    return out


def _differences(have: Any, want: Any, at: str = "") -> list[str]:
    """The fields where two manifests differ, as 'field: here vs there'."""
    if isinstance(have, dict) and isinstance(want, dict):
        keys = sorted(set(have) | set(want), key=str)
        return [
            d for k in keys for d in _differences(have.get(k), want.get(k), f"{at}.{k}".lstrip("."))
        ]
    return [] if have == want else [f"{at or 'the manifest'} is {want!r} now, {have!r} there"]


def check_manifest(out: Path, want: dict[str, Any]) -> bool:
    """Whether `out` holds a manifest equal to `want` (False: none yet).
    ValueError naming the fields that differ when shards made with other
    settings are there; a manifest beside no shards is simply replaced."""
    path = out / "manifest.json"
    if not path.exists():
        return False
    shards = sorted(out.glob("shard-*.safetensors"))
    try:
        have = _files.read_json(path, what="data manifest", fix=MANIFEST_FIX)
    except ValueError:
        if not shards:
            return False
        raise
    if have == want:
        return True
    if not shards:
        return False
    diff = _differences(have, want)
    raise ValueError(
        f"{out} holds {len(shards)} shards made with other settings or another target "
        f"({'; '.join(diff[:3])}{'; ...' if len(diff) > 3 else ''}); {MANIFEST_FIX}"
    )


def build_dataset(
    out_dir: str | Path,
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    config: DataConfig,
    *,
    progress: Callable[[str, int], Callable[[], None]] | None = None,
) -> Path:
    """Write the shards of `config` into `out_dir` (skipping those present,
    after checking their layout). `progress(description, total)` returns a
    function called once per shard. Returns `out_dir`. The prompts are
    encoded, and refused when none fits max_prompt_tokens, before anything
    is written."""
    out = _checks.writable_dir(out_dir, "out_dir")
    want = manifest(config, target)
    same = check_manifest(out, want)
    prompts = encode_prompts(tokenizer, config)
    if not prompts:
        raise ValueError(
            f"every training prompt is longer than max_prompt_tokens = "
            f"{config.max_prompt_tokens} tokens, so there is nothing to answer; give shorter "
            "prompts or raise max_prompt_tokens"
        )
    if not same:
        _files.write_json(out / "manifest.json", want, what="the data manifest")
    eos = sorted({int(tokenizer.eos_token_id), *chat_ends(tokenizer)})
    hidden = int(target.config.hidden_size)
    batches = [
        prompts[i : i + config.batch_size] for i in range(0, len(prompts), config.batch_size)
    ]
    advance = progress("target answers and features", len(batches)) if progress else None
    started = time.perf_counter()
    for b, batch in enumerate(batches):
        path = out / f"shard-{b:05d}.safetensors"
        if path.exists():
            check_shard(path, hidden)
        else:
            greedy = b % config.sampled_every != config.sampled_every - 1
            seqs = answer_batch(target, batch, config, greedy, config.seed * 100003 + b, eos)
            write_shard(path, [s for s in seqs if len(s.tokens) - s.prompt_len >= 2], hidden)
        if advance is not None:
            advance()
    done = {"seconds": time.perf_counter() - started, "shards": len(batches)}
    _files.write_json(out / "done.json", done, what="the data's summary")
    return out


def chat_ends(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Ids that end an assistant turn in the chat template (e.g. <|im_end|>)."""
    ids = []
    for text in ("<|im_end|>", "<|eot_id|>", "<|end|>"):
        tid = tokenizer.convert_tokens_to_ids(text)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid is not None:
            ids.append(tid)
    return ids


def load_dataset(
    data_dir: str | Path, *, vocab: int | None = None, hidden: int | None = None
) -> list[Sequence]:
    """Every sequence of the shards in `data_dir`, in shard order, each
    shard checked (`read_shard`; vocab, hidden: the target's, when given)."""
    folder = Path(data_dir)
    if not folder.is_dir():
        raise ValueError(f"data_dir = {str(folder)!r} is not a folder of training shards")
    paths = sorted(folder.glob("shard-*.safetensors"))
    if not paths:
        raise ValueError(
            f"{data_dir} holds no training shards; build_dataset writes them "
            "(`specdec train-drafter` builds them, then trains)"
        )
    seqs = [s for p in paths for s in read_shard(p, vocab=vocab, hidden=hidden)]
    if not seqs:
        raise ValueError(
            f"the {len(paths)} shards in {data_dir} hold no sequences: every answer was under "
            "2 tokens; raise max_new_tokens, or give prompts the target answers at length"
        )
    return seqs
