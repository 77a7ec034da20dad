"""One forward of a GGUF model over the blocks of several sequences, each
after its own cache: the batch step of `engine.engine`.

The blocks' rows go through every layer together (`FusedLlamaLayer.forward_rows`:
one Rust call per layer, the weight products over all N = Σ n_s rows at once,
attention per sequence over that sequence's cache), so the weights are read
once per step for the whole batch: on a CPU a step of a small model is bound
by reading its weights, and a batch shares that read. Every value of a row
is computed from that row alone in a fixed order (the products, the norms,
the rotary tables, attention over its own cache), so a sequence's logits
are the same bits in a batch as alone (`models.forward_with_hidden`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel


def forward_rows(
    model: PreTrainedModel,
    blocks: Sequence[torch.Tensor],
    caches: Sequence[Any],
    *,
    hidden: bool = False,
    read: int | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """Run blocks[s] (n_s,) after what caches[s] (a `PreallocatedCache`)
    holds, for every sequence s in one pass; each cache grows by n_s.
    Returns each block's logits (n_s, V) float32 and, when `hidden`, its
    last hidden states (n_s, H) (the LM head's input). read: the LM head
    runs only on the first `read` blocks (default all); the others' logits
    are (0, V) on the one-call path (a prefill piece's are never read)."""
    import torch

    from specdec_rs.gguf.runner import runner_of

    runner = runner_of(model, caches[0], max(len(b) for b in blocks))
    if runner is not None:
        lengths = [len(b) for b in blocks]
        heads = sum(lengths[: len(blocks) if read is None else read])
        every, normed = runner.forward(blocks, caches, rows=range(heads))
        out_logits, out_states, start = [], [], 0
        for n in lengths:
            out_logits.append(every[min(start, heads) : min(start + n, heads)])
            out_states.append(normed[start : start + n])
            start += n
        return out_logits, (out_states if hidden else None)
    base = model.model
    lengths = [len(b) for b in blocks]
    pasts = [c.get_seq_length() for c in caches]
    ids = torch.cat(list(blocks))[None]
    positions = torch.cat([torch.arange(p, p + n) for p, n in zip(pasts, lengths, strict=True)])[
        None
    ]
    x = base.embed_tokens(ids)[0].float().contiguous().clone()
    cos, sin = base.rotary_emb(x[None], positions)
    cos_rows, sin_rows = (t[0].float().contiguous().numpy() for t in (cos, sin))
    rows = x.numpy()
    for i, layer in enumerate(base.layers):
        layer.forward_rows(rows, cos_rows, sin_rows, [c.layers[i] for c in caches], lengths)
    # the final norm per sequence, as a lone forward applies it to its own (1, n, H)
    states, at = [], 0
    for n in lengths:
        states.append(base.norm(x[None, at : at + n])[0])
        at += n
    logits = model.lm_head(torch.cat(states)).float()
    out, at = [], 0
    for n in lengths:
        out.append(logits[at : at + n])
        at += n
    return out, (states if hidden else None)
