"""The target forward of one sequence: a block of positions after its cache
(`forward`, `forward_with_hidden`) or a draft tree under its mask
(`forward_tree`).

A GGUF model on a `PreallocatedCache` runs in one Rust call (`runner.stack`);
any other model runs its own transformers modules: the base model, then the
LM head on the rows that are read only.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from functools import cache
from typing import TYPE_CHECKING, Any

from specdec_rs.models import device_of, dtype_of, sliding_window_of
from specdec_rs.runner.stack import stack_of
from specdec_rs.trees import tree_depths, tree_mask

if TYPE_CHECKING:
    import numpy as np
    import torch
    from transformers import PreTrainedModel
    from transformers.cache_utils import Cache


@cache
def cache_keyword(model_type: type) -> str:
    """transformers renamed `past_key_values` to `cache` (5.24 accepts both)."""
    params = inspect.signature(getattr(model_type, "forward")).parameters  # noqa: B009
    return "cache" if "cache" in params else "past_key_values"


def forward(model: PreTrainedModel, tokens: torch.Tensor, cache: Cache, keep: int) -> torch.Tensor:
    """Run `tokens` (n,) after what `cache` holds; the cache grows by n.

    Returns the logits of the last `keep` positions, shape (keep, V), float32.
    """
    return forward_with_hidden(model, tokens, cache, keep, hidden=False)[0]


def forward_with_hidden(
    model: PreTrainedModel,
    tokens: torch.Tensor,
    cache: Cache,
    keep: int,
    *,
    hidden: bool = True,
    allowed: np.ndarray | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`forward`, plus the last hidden states of all n positions (n, H) in the
    model's dtype when `hidden` (the input of the LM head; no extra pass).
    `allowed` (r, V) bool: the ids at which the logits of the block's first
    r positions will be read (a grammar's masks; with keep = n); a GGUF
    model's head then computes only what they need, so the other logits of
    those rows are unspecified: mask them (`structured.masked_logits`)."""
    stack = _stack(model, cache)
    if stack is not None:  # a GGUF model: the whole forward in one Rust call
        n = len(tokens)
        wanted = range(n - keep, n) if keep else range(n)
        logits, states = stack.forward([tokens], [cache], rows=wanted, allowed=[allowed])
        return logits, (states if hidden else None)
    ids = tokens.to(device_of(model)).unsqueeze(0)
    return logits_and_hidden(model, hidden, keep, input_ids=ids, use_cache=True, cache=cache)


def forward_tree(
    model: PreTrainedModel,
    last: torch.Tensor,
    tokens: torch.Tensor,
    parents: Sequence[int],
    cache: Cache,
    *,
    hidden: bool = False,
    rows: Sequence[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One forward over the last committed token (1,) and a draft tree
    (tokens (n,), parents (n,)) after what `cache` holds: the tree attention
    mask and position ids past + depth. Returns logits (n + 1, V) float32
    (row 0 at the last token, row i + 1 at node i; or only the rows `rows`,
    in that order: the LM head runs on those alone) and, when `hidden`, the
    last hidden states (n + 1, H). The cache grows by n + 1 entries in node
    order; `kv_cache.keep_positions` compacts it to the accepted path."""
    import torch

    device = device_of(model)
    past = cache.get_seq_length()
    depth = torch.tensor([0, *tree_depths(parents)], device=device)
    stack = _stack(model, cache)
    if stack is not None:  # a GGUF model: one Rust call under the tree's mask
        allowed = tree_mask(parents, past, torch.float32, "cpu")[0, 0] == 0
        logits, states = stack.forward(
            [torch.cat([last.reshape(-1), tokens.reshape(-1)])],
            [cache],
            rows=rows,
            positions=past + depth,
            mask=allowed.to(torch.uint8).contiguous().numpy(),
        )
        return logits, (states if hidden else None)
    window = sliding_window_of(model)
    if window and past + len(parents) + 1 > window:
        raise ValueError(
            f"a tree's attention mask over {past + len(parents) + 1} positions under a sliding "
            f"window of {window}: a tree or window drafter runs only while the context fits the "
            "window (transformers would apply the tree's mask without the window); use a chain "
            "drafter (prompt lookup, a draft model) past it"
        )
    ids = torch.cat([last.to(device), tokens.to(device)])[None]
    return logits_and_hidden(
        model,
        hidden,
        0,
        rows=None if rows is None else torch.tensor(list(rows), dtype=torch.long, device=device),
        input_ids=ids,
        attention_mask=tree_mask(parents, past, dtype_of(model), device),
        position_ids=(past + depth)[None],
        use_cache=True,
        cache=cache,
    )


def _stack(model: Any, cache: Any) -> Any:
    """The GGUF stack of `model` for this forward, or None (`runner.stack.stack_of`)."""
    if model.__dict__.get("_specdec_stack", None) is False:
        return None
    return stack_of(model, cache)


def logits_and_hidden(
    model: PreTrainedModel,
    hidden: bool,
    keep: int,
    cache: Cache,
    rows: torch.Tensor | None = None,
    **inputs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logits (keep, V) float32 of the last `keep` positions (0: all; or of
    the positions `rows`, in that order) and (when `hidden`) the LM head's
    input at every position: from the base model and the LM head where the
    model has them (`model.model`, `lm_head`: the same values as
    `output_hidden_states`, without collecting every layer's; the head runs
    only on the rows asked for), else from the whole model."""
    base, head = getattr(model, "model", None), getattr(model, "lm_head", None)
    if base is not None and head is not None:
        states = base(**inputs, **{cache_keyword(base.__class__): cache}).last_hidden_state
        chosen = states[:, rows] if rows is not None else states[:, -keep:] if keep else states
        logits: torch.Tensor = head(chosen)[0].float()
        return logits, (states[0] if hidden else None)
    out = model(
        **inputs,
        logits_to_keep=0 if rows is not None else keep,
        output_hidden_states=hidden,
        **{cache_keyword(model.__class__): cache},
    )
    every = out.logits[0].float()
    return (every[rows] if rows is not None else every), (
        out.hidden_states[-1][0] if hidden else None
    )
