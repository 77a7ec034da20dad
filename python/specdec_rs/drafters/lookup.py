"""Prompt lookup: copy what followed an earlier occurrence of the text's end.
p = target, q = draft (one-hot), k = γ."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from specdec_rs import _checks
from specdec_rs.drafters.base import (
    ChainScores,
    TeacherForced,
    empty_draft,
    fixed_tree,
    one_hot_draft,
)
from specdec_rs.drafters.draft import Draft, TreeDraft
from specdec_rs.drafters.registry import register
from specdec_rs.processors import Sampler
from specdec_rs.trees import trie

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel
    from transformers.cache_utils import Cache


@register("prompt-lookup", arg=None, help="copy what followed the text's last tokens earlier on")
class PromptLookup:
    """Finds the longest suffix of the sequence (prompt + text so far), between
    `min_ngram` and `max_ngram` tokens, that also occurs earlier, and proposes
    the up to k tokens that followed it. Among equally long matches it takes
    the first (`occurrence="first"`: on code editing the prompt's original
    text is the best source) or the most recent (`"last"`). No model; q is
    one-hot on each proposal.
    """

    needs_target_hidden = False

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

    @classmethod
    def from_spec(cls, arg: Any, target: Any, tokenizer: Any, greedy: bool) -> PromptLookup:
        return cls()

    def check_target(self, target: PreTrainedModel) -> None:
        pass  # no model: works with any target

    def start(
        self, seq: torch.Tensor, target_cache: Cache, target_hidden: torch.Tensor | None = None
    ) -> None:
        pass

    def find(self, seq: npt.NDArray[np.int64], k: int) -> npt.NDArray[np.int64]:
        """The up-to-k proposal after `seq` (n,) on the host."""
        return lookup(seq, k, self.min_ngram, self.max_ngram, self.occurrence == "first")

    def propose(self, seq: torch.Tensor, k: int, sampler: Sampler) -> Draft:
        import torch

        found = self.find(seq.cpu().numpy(), k)
        if len(found) == 0:
            return empty_draft(sampler)
        return one_hot_draft(torch.from_numpy(found), sampler)

    def propose_tree(self, seq: torch.Tensor, budget: int, sampler: Sampler) -> TreeDraft:
        """Several matches at once: the distinct continuations of every earlier
        occurrence of the text's end (longest matches first, down to
        `min_ngram` tokens; within a length, in `occurrence` order), merged
        into a prefix tree of at most `budget` nodes; fixed children."""
        found = lookup_all(
            seq.cpu().numpy(), budget, self.min_ngram, self.max_ngram, self.occurrence == "first"
        )
        tokens, parents = trie([c.tolist() for c in found], budget)
        return fixed_tree(tokens, parents, sampler)

    def update(
        self, seq: torch.Tensor, num_accepted: int, target_hidden: torch.Tensor | None = None
    ) -> None:
        pass

    def acceptance(self, tf: TeacherForced, k_max: int) -> np.ndarray:
        """a[t, i] for x = lookup(text before answer position t): the indicator
        x_i = answer[t + i] at greedy, else p_{t+i}(x_i) (one-hot q)."""
        seq = tf.seq.cpu().numpy()
        scores = ChainScores(tf, k_max)
        for t in range(scores.n):
            scores.score(t, self.find(seq[: tf.start + t], k_max))
        return scores.a

    def hf_kwargs(self) -> dict[str, Any] | None:
        return {"prompt_lookup_num_tokens": 10}


def lookup(
    seq: npt.NDArray[np.int64], k: int, min_ngram: int, max_ngram: int, first: bool = True
) -> npt.NDArray[np.int64]:
    """Up to k tokens that followed the longest earlier match (min_ngram ..
    max_ngram tokens) of the end of `seq`; empty when there is none.

    >>> import numpy as np
    >>> lookup(np.array([7, 1, 2, 3, 9, 1, 2]), 2, 1, 4).tolist()   # "1 2" matched: copy "3 9"
    [3, 9]
    """
    by_length = match_ends(seq, max_ngram)
    ends, length = by_length[-1], len(by_length)
    if len(ends) == 0 or length < min_ngram:
        return seq[:0]
    start = int(ends[0] if first else ends[-1]) + 1
    return seq[start : start + k]


def match_ends(seq: npt.NDArray[np.int64], max_ngram: int) -> list[npt.NDArray[np.int64]]:
    """by_length[m - 1]: the ends (ascending) of the earlier occurrences of the
    last m tokens of `seq`, for m = 1 up to the longest match (at most
    `max_ngram`); each end has a continuation. by_length[0] may be empty."""
    n = len(seq)
    ends = np.flatnonzero(seq[:-1] == seq[-1])
    by_length = [ends]
    while len(by_length) < max_ngram and len(ends):
        length = len(by_length)
        longer = ends[ends >= length]
        longer = longer[seq[longer - length] == seq[n - 1 - length]]
        if len(longer) == 0:
            break
        ends = longer
        by_length.append(ends)
    return by_length


def lookup_all(
    seq: npt.NDArray[np.int64], depth: int, min_ngram: int, max_ngram: int, first: bool = True
) -> list[npt.NDArray[np.int64]]:
    """The continuations (up to `depth` tokens) of every earlier match of the
    end of `seq` of min_ngram .. max_ngram tokens: longest matches first;
    within one length, earliest (`first`) or latest first. Each occurrence
    once (a shorter match at the same place is not repeated).

    >>> import numpy as np
    >>> [c.tolist() for c in lookup_all(np.array([1, 2, 3, 9, 2, 4, 1, 2]), 2, 1, 4)]
    [[3, 9], [4, 1]]
    """
    n = len(seq)
    out: list[npt.NDArray[np.int64]] = []
    seen: set[int] = set()
    by_length = match_ends(seq, max_ngram)
    for size in range(len(by_length), min_ngram - 1, -1):
        if size < 1:
            break
        matches = by_length[size - 1]
        for e in matches if first else matches[::-1]:
            if int(e) in seen:
                continue
            seen.add(int(e))
            out.append(seq[e + 1 : min(e + 1 + depth, n)])
    return out
