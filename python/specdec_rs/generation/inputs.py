"""The checks of generate()'s inputs, each before any model work: the prompt,
the vocabulary p and q share, the stop ids, the drafter, the context, the tree
policy. ValueError naming what is wrong and how to fix it. p = target, q = draft.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specdec_rs import _checks, models
from specdec_rs.drafters.base import Members
from specdec_rs.policy import as_tree_policy

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel


def prompt_tensor(input_ids: Any, vocab_size: int) -> torch.Tensor:
    """(n,) int64 tokens from a list, (n,) or (1, n) tensor/array; batch 1 only."""
    import numpy as np
    import torch

    if isinstance(input_ids, str):
        raise ValueError(
            "input_ids is a str; generate() takes token ids: tokenize first, e.g. "
            "workloads.encode(tokenizer, text) or tokenizer(text)['input_ids']"
        )
    a = _checks.as_numpy(input_ids, "input_ids")
    if a.size == 0 and a.dtype.kind in "fO":
        a = a.astype(np.int64)  # an empty list: the shape check below names it
    if a.dtype.kind not in "iu":
        raise ValueError(f"input_ids has dtype {a.dtype}; expected integer token ids")
    if a.dtype.kind == "u" and a.size and int(a.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"input_ids holds {int(a.max())}, which is not a token id")
    ids = torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))
    if ids.ndim == 2:
        if ids.shape[0] != 1:
            raise ValueError(
                f"input_ids has batch size {ids.shape[0]}; generate() decodes one sequence "
                "(batch size 1): call it once per prompt"
            )
        ids = ids[0]
    if ids.ndim != 1 or ids.numel() == 0:
        raise ValueError(
            f"input_ids has shape {tuple(ids.shape)}; expected a non-empty prompt (n,) or (1, n)"
        )
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise ValueError(
            f"input_ids holds ids outside [0, {vocab_size}); tokenize with the model's tokenizer"
        )
    return ids.contiguous()


@dataclass(frozen=True)
class Prompt:
    """A prompt checked once, where it enters (`generate`, a request's
    admission): ids (n,) int64, every id in [0, vocab). A `Decoder` given
    one for its own vocabulary takes it as it is."""

    ids: torch.Tensor
    vocab: int

    @classmethod
    def of(cls, input_ids: Any, vocab: int) -> Prompt:
        """`input_ids` checked (`prompt_tensor`), or itself when it is a
        `Prompt` already checked against this vocabulary."""
        if isinstance(input_ids, Prompt) and input_ids.vocab == vocab:
            return input_ids
        ids = input_ids.ids if isinstance(input_ids, Prompt) else input_ids
        return cls(prompt_tensor(ids, vocab), vocab)

    def __len__(self) -> int:
        return len(self.ids)


def shared_vocab(target: PreTrainedModel, drafter: Any, vocab_size: int | None) -> int:
    """Entries of p and q compared: vocab_size, else the target's LM head rows,
    which the drafter's must equal (padded heads need vocab_size=len(tokenizer))."""
    v_target = models.vocab_of(target)
    v_draft = getattr(drafter, "vocab_size", None)
    if vocab_size is not None:
        v = _checks.integer(vocab_size, "vocab_size", minimum=1)
        for who, rows in (("target", v_target), ("drafter", v_draft)):
            if rows is not None and rows < v:
                raise ValueError(f"vocab_size = {v} but the {who}'s LM head has only {rows} rows")
        return v
    if v_draft is not None and v_draft != v_target:
        raise ValueError(
            f"the target's LM head has {v_target} rows and the drafter's {v_draft}: models with "
            "different tokenizers cannot be paired; if they share one (padded heads), pass "
            "vocab_size=len(tokenizer)"
        )
    return v_target


def eos_set(eos_token_id: int | Iterable[int] | None, target: PreTrainedModel) -> frozenset[int]:
    """None -> the target's generation_config.eos_token_id; [] -> never stop early."""
    if eos_token_id is None:
        config = getattr(target, "generation_config", None)
        eos_token_id = getattr(config, "eos_token_id", None)
        if eos_token_id is None:
            return frozenset()
    return frozenset(_checks.integers(eos_token_id, "eos_token_id"))


def check_drafter(drafter: Any, target: PreTrainedModel) -> None:
    """ValueError unless `drafter` is None or a drafter that can serve `target`."""
    if drafter is None:
        return
    if isinstance(drafter, str):
        raise ValueError(
            f"drafter = {drafter!r} is a string; pass a drafter object, e.g. "
            "specdec_rs.PromptLookup() or specdec_rs.EarlyExit(target, 24), or None"
        )
    missing = [m for m in ("start", "propose", "update") if not callable(getattr(drafter, m, None))]
    if missing or not isinstance(getattr(drafter, "name", None), str):
        raise ValueError(
            f"drafter = {drafter!r} ({type(drafter).__name__}) is not a drafter: it needs a "
            f"`name` and the methods start, propose and update (missing: {missing or ['name']})"
        )
    for method, params in (
        ("start", "(seq, target_cache, target_hidden)"),
        ("update", "(seq, num_accepted, target_hidden)"),
    ):
        try:
            inspect.signature(getattr(drafter, method)).bind(None, None, None)
        except TypeError:
            raise ValueError(
                f"drafter {drafter.name}: {method}() must take {params}; see specdec_rs.drafters"
            ) from None
        except ValueError:
            pass  # no signature to inspect (a builtin): let the call decide
    check = getattr(drafter, "check_target", None)
    if callable(check):
        check(target)


def check_context(
    target: PreTrainedModel, prompt_length: int, max_new_tokens: int, allow: bool
) -> None:
    """ValueError when prompt + max_new_tokens passes the model's trained context
    (config.max_position_embeddings), unless `allow` (positions past it are
    extrapolated: the output may degrade)."""
    limit = getattr(target.config, "max_position_embeddings", None)
    if allow or not isinstance(limit, int) or prompt_length + max_new_tokens <= limit:
        return
    raise ValueError(
        f"the prompt ({prompt_length} tokens) plus max_new_tokens ({max_new_tokens}) is "
        f"{prompt_length + max_new_tokens} positions, past the model's context of {limit} "
        "(config.max_position_embeddings); shorten the prompt, lower max_new_tokens, or pass "
        "allow_past_context=True to run past it anyway"
    )


def check_tree_drafter(drafter: Any, tree: Any) -> Any:
    """The tree budget (nodes per round) or tree policy, checked with the drafter."""
    budget = as_tree_policy(tree)
    members = Members.of(drafter)
    if drafter is None or members.propose_tree is None:
        name = getattr(drafter, "name", None)
        raise ValueError(
            f"tree = {tree!r} needs a drafter that drafts trees (propose_tree): prompt-lookup, "
            f"suffix, lookahead, eagle, medusa or hybrid; got {name or drafter!r}"
        )
    if members.check_tree is not None:
        members.check_tree()  # a drafter configured for chains only says so here, before any work
    return budget
