"""Drafters: cheap proposers of k tokens. p = target, q = draft, k = γ.

A drafter implements three methods, called by `generate`:

- ``start(seq, target_cache)``: a new generation; `seq` (n,) holds the prompt.
- ``propose(seq, k, sampler) -> Draft``: up to k tokens continuing `seq`, and
  the rows q they were drawn from. The last token of `seq` is not yet in any
  cache (the target runs it together with the drafts).
- ``update(seq, num_accepted)``: the round on `seq` (as given to propose)
  kept `num_accepted` drafts; drop any state past seq + those drafts.
- ``check_target(target)`` (optional): ValueError unless the drafter can
  draft for this target (an early exit built on another model cannot).

`generate` checks every Draft before the target runs: at most k tokens, ids
in [0, V), q of shape (k', V).

Exactness needs only that each draft was drawn from the q row handed back:
sampled drafters return their processed distribution, greedy ones a one-hot
row (also exact under sampling: a one-hot q accepts x with probability p(x)).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from specdec_rs import _checks, models
from specdec_rs.processors import Sampler, one_hot

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import torch
    from transformers import PreTrainedModel
    from transformers.cache_utils import Cache


@dataclass(frozen=True)
class Draft:
    """tokens: (k',) int64 proposals, k' <= k.  q: (k', V) float32, row i the
    distribution tokens[i] was drawn from."""

    tokens: torch.Tensor
    q: torch.Tensor


class Drafter(Protocol):
    name: str

    def start(self, seq: torch.Tensor, target_cache: Cache) -> None: ...

    def propose(self, seq: torch.Tensor, k: int, sampler: Sampler) -> Draft: ...

    def update(self, seq: torch.Tensor, num_accepted: int) -> None: ...


def _started(cache: Cache | None, name: str) -> Cache:
    if cache is None:
        raise ValueError(f"drafter {name}: call start() before propose() or update()")
    return cache


def empty_draft(vocab_size: int) -> Draft:
    import torch

    return Draft(torch.zeros(0, dtype=torch.long), torch.zeros(0, vocab_size))


def draft_autoregressive(
    model: PreTrainedModel,
    cache: Cache,
    feed: torch.Tensor,
    k: int,
    sampler: Sampler,
    greedy: bool,
) -> Draft:
    """k tokens from `model`, one forward each: feed (m,) first, then each draft
    but the last (which is never needed). The cache grows by m + k - 1."""
    import torch

    if k == 0:
        return empty_draft(sampler.vocab_size)
    tokens, rows = [], []
    for _ in range(k):
        q = sampler.probs(models.forward(model, feed, cache, keep=1))
        token, q = sampler.draw(q, greedy=greedy)
        tokens.append(token)
        rows.append(q)
        feed = token
    return Draft(torch.cat(tokens), torch.cat(rows))


class DraftModel:
    """A separate, smaller causal LM with its own KV cache.

    Its cache holds a prefix of `seq`; each round feeds what it has not seen
    (the last token, or the last two after a round that accepted every draft),
    then drafts. After the round the cache is cut to the accepted length.
    """

    def __init__(self, model: PreTrainedModel, *, greedy: bool = False, name: str = "model"):
        self.model = models.check_model(model, "DraftModel's model")
        self.greedy = _checks.boolean(greedy, "greedy")
        if not isinstance(name, str) or not name:
            raise ValueError(f"name = {name!r} must be a non-empty string")
        self.name = name
        self.vocab_size = models.vocab_of(model)
        self._cache: Cache | None = None

    def check_target(self, target: PreTrainedModel) -> None:
        pass  # any causal LM whose vocabulary matches (generate compares the LM heads)

    def start(self, seq: torch.Tensor, target_cache: Cache) -> None:
        self._cache = models.new_cache(self.model)
        if len(seq) > 1:
            models.forward(self.model, seq[:-1], self._cache, keep=1)

    def propose(self, seq: torch.Tensor, k: int, sampler: Sampler) -> Draft:
        cache = _started(self._cache, self.name)
        seen = cache.get_seq_length()
        return draft_autoregressive(self.model, cache, seq[seen:], k, sampler, self.greedy)

    def update(self, seq: torch.Tensor, num_accepted: int) -> None:
        cache = _started(self._cache, self.name)
        models.crop(cache, min(cache.get_seq_length(), len(seq) + num_accepted))


class EarlyExit:
    """Self-speculation: the target's first L layers, its final norm and LM head.

    No second model and no second cache. The first L layers' keys and values
    for the accepted text are exactly the target's own (same weights, same
    inputs), so the drafter reads the target's cache for them and writes its
    draft positions into those L layers only; before the target's forward it
    cuts those layers back, so the cache again holds accepted text only.
    Drafting costs k passes through L layers; nothing is ever recomputed for
    accepted tokens (a separate L-layer model would have to catch up on them).
    """

    def __init__(self, target: PreTrainedModel, num_layers: int, *, greedy: bool = False):
        self.view = models.layer_view(target, num_layers)
        self.target = target
        self.num_layers = int(num_layers)
        self.greedy = _checks.boolean(greedy, "greedy")
        self.name = f"early-exit:{self.num_layers}"
        self._cache: Cache | None = None

    def check_target(self, target: PreTrainedModel) -> None:
        if target is not self.target:
            raise ValueError(
                f"drafter {self.name} was built on another model: an early exit shares the "
                "target's layers and cache; build it from this target: EarlyExit(target, L)"
            )

    def start(self, seq: torch.Tensor, target_cache: Cache) -> None:
        self._cache = target_cache

    def propose(self, seq: torch.Tensor, k: int, sampler: Sampler) -> Draft:
        cache = _started(self._cache, self.name)
        committed = cache.get_seq_length()
        draft = draft_autoregressive(self.view, cache, seq[committed:], k, sampler, self.greedy)
        models.crop(cache, committed, layers=range(self.num_layers))
        return draft

    def update(self, seq: torch.Tensor, num_accepted: int) -> None:
        pass  # the target's cache is cut by the decoder


class PromptLookup:
    """Copy what followed an earlier occurrence of the text's last tokens.

    Finds the longest suffix of the sequence (prompt + text so far), between
    `min_ngram` and `max_ngram` tokens, that also occurs earlier, and proposes
    the up to k tokens that followed it. Among equally long matches it takes
    the first (`occurrence="first"`: on code editing the prompt's original
    text is the best source) or the most recent (`"last"`). No model; q is
    one-hot on each proposal.
    """

    def __init__(self, max_ngram: int = 64, min_ngram: int = 2, occurrence: str = "first"):
        max_ngram = _checks.integer(max_ngram, "max_ngram", minimum=1)
        min_ngram = _checks.integer(min_ngram, "min_ngram", minimum=1)
        if min_ngram > max_ngram:
            raise ValueError(
                f"min_ngram = {min_ngram}, max_ngram = {max_ngram}; "
                "expected 1 <= min_ngram <= max_ngram"
            )
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.occurrence = _checks.choice(occurrence, "occurrence", ("first", "last"))
        self.name = "prompt-lookup"

    def check_target(self, target: PreTrainedModel) -> None:
        pass  # no model: works with any target

    def start(self, seq: torch.Tensor, target_cache: Cache) -> None:
        pass

    def propose(self, seq: torch.Tensor, k: int, sampler: Sampler) -> Draft:
        import torch

        found = lookup(seq.numpy(), k, self.min_ngram, self.max_ngram, self.occurrence == "first")
        if len(found) == 0:
            return empty_draft(sampler.vocab_size)
        tokens = torch.from_numpy(found)
        return Draft(tokens, one_hot(tokens, sampler.vocab_size))

    def update(self, seq: torch.Tensor, num_accepted: int) -> None:
        pass


def lookup(
    seq: npt.NDArray[np.int64], k: int, min_ngram: int, max_ngram: int, first: bool = True
) -> npt.NDArray[np.int64]:
    """Up to k tokens that followed the longest earlier match (min_ngram ..
    max_ngram tokens) of the end of `seq`; empty when there is none.

    >>> import numpy as np
    >>> lookup(np.array([7, 1, 2, 3, 9, 1, 2]), 2, 1, 4).tolist()   # "1 2" matched: copy "3 9"
    [3, 9]
    """
    import numpy as np

    n = len(seq)
    ends = np.flatnonzero(seq[:-1] == seq[-1])  # candidate match ends; each has a continuation
    length = 1
    while length < max_ngram and len(ends):
        longer = ends[ends >= length]
        longer = longer[seq[longer - length] == seq[n - 1 - length]]
        if len(longer) == 0:
            break
        ends, length = longer, length + 1
    if len(ends) == 0 or length < min_ngram:
        return seq[:0]
    start = int(ends[0] if first else ends[-1]) + 1
    return seq[start : start + k]
