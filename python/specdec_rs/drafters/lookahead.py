"""Lookahead decoding: n-grams from the target's own Jacobi iterations,
drafted as fixed candidates and verified in the same forward that runs the
next iteration. p = target, q = draft (one-hot), k = γ.

The window: N − 1 levels of W guesses. Level l, column i sits at position
root + 1 + i + l (root: the last committed token, depth 0) and sees the
cache, the root, level 0's columns 0..i and its own column's levels below
it: a tree (level 0 a chain under the root; each column a chain up from its
level-0 node), run as a `Window` after the round's drafts under one tree
mask. So the argmax of its logits is one Jacobi step for position
root + 2 + i + l. After each round the top level's argmaxes become a new
top level and the bottom level drops; column i then held the n-gram of the
trajectory L_0[i], L_1[i], ..., L_{N−2}[i], new[i] (N tokens), whose last
N − 1 enter the pool under its first. The first N − 2 rounds fill the levels
(level 0 starts with W + N − 2 tokens drawn from the prompt; each of those
rounds shifts every level by one to stay aligned). The window moves one
position per round however many tokens the round kept (as the reference
implementation does by default).

The pool holds at most G continuations (N − 1 tokens) per key token, the
most recent last (LRU); the n-grams of the committed text (prompt and
output) enter it too. A round drafts the pool's continuations of the last
committed token: the most recent one as a chain (up to γ tokens), or all of
them as a trie (`propose_tree`, up to the budget). Both are deterministic
given the past, so verification (one-hot q for a chain, fixed children for
a tree) keeps the output exactly the target's at any temperature.

A round's forward runs 1 + drafts + W·(N − 1) positions (the Jacobi window
is spare work): it pays where one forward over many positions costs about
one step (v(n) ≈ 1), not where the cost grows with n.

>>> pool = NgramPool(size=3, max_entries=2)
>>> for gram in ([5, 1, 2], [5, 3, 4], [5, 1, 2], [5, 6, 7]):
...     pool.add(gram)
>>> pool.continuations(5)  # at most 2 per key, the most recent last
[(1, 2), (6, 7)]
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from specdec_rs import _checks, models, runner
from specdec_rs.drafters.base import ChainScores, TeacherForced, empty_draft, one_hot_draft
from specdec_rs.drafters.draft import Draft, TreeDraft, Window, joined
from specdec_rs.drafters.registry import register
from specdec_rs.processors import Sampler, argmax
from specdec_rs.trees import trie

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel
    from transformers.cache_utils import Cache

DEFAULT_WINDOW = 1  # W: columns of the Jacobi window (the best measured on a 2-core CPU)
DEFAULT_NGRAM = 2  # N: n-gram size (N − 1 levels; drafts of N − 1 tokens)
DEFAULT_POOL = 1  # G: continuations kept per key token


class NgramPool:
    """n-grams of `size` tokens by their first token: at most `max_entries`
    distinct continuations (size − 1 tokens) per key, least recently added
    first; adding one already there makes it the most recent."""

    def __init__(self, size: int, max_entries: int):
        self.size, self.max_entries = size, max_entries
        self.entries: dict[int, OrderedDict[tuple[int, ...], None]] = {}

    def add(self, gram: Sequence[int]) -> None:
        if len(gram) != self.size:
            raise ValueError(f"an n-gram of {len(gram)} tokens; this pool keeps {self.size}")
        key, rest = int(gram[0]), tuple(int(t) for t in gram[1:])
        kept = self.entries.setdefault(key, OrderedDict())
        if rest in kept:
            kept.move_to_end(rest)
            return
        kept[rest] = None
        if len(kept) > self.max_entries:
            kept.popitem(last=False)

    def add_text(self, tokens: Sequence[int]) -> None:
        """Every n-gram of `tokens`, in order."""
        for first in range(len(tokens) - self.size + 1):
            self.add(tokens[first : first + self.size])

    def continuations(self, key: int) -> list[tuple[int, ...]]:
        """The continuations of `key`, the most recent last."""
        return list(self.entries.get(int(key), ()))

    def __len__(self) -> int:
        return sum(len(v) for v in self.entries.values())


def parse_shape(arg: str) -> tuple[int, int, int]:
    """(W, N, G) from ``"W,N,G"`` (the command line's ``lookahead:W,N,G``)."""
    parts = arg.split(",")
    if len(parts) != 3 or not all(p.strip().isascii() and p.strip().isdigit() for p in parts):
        raise ValueError(
            f"lookahead:{arg} is not understood; expected lookahead:W,N,G with three "
            "integers, e.g. lookahead:4,3,4 (window columns, n-gram size, pool per key)"
        )
    w, n, g = (int(p) for p in parts)
    return w, n, g


@register(
    "lookahead",
    arg="optional-text",
    help="n-grams from the target's own Jacobi iterations in the verification forward "
    f"(lookahead[:W,N,G], default {DEFAULT_WINDOW},{DEFAULT_NGRAM},{DEFAULT_POOL})",
)
class Lookahead:
    """Lookahead decoding's drafter (see the module docs): a W × (N − 1)
    Jacobi window run in each verification forward, and a pool of at most
    G n-grams per key. `prompt_pool`: the committed text's n-grams enter the
    pool too. `seed` fixes the prompt tokens the window starts from. No
    model of its own; q is one-hot on each draft."""

    needs_target_hidden = False

    def __init__(
        self,
        window: int = DEFAULT_WINDOW,
        ngram: int = DEFAULT_NGRAM,
        pool: int = DEFAULT_POOL,
        *,
        prompt_pool: bool = True,
        seed: int = 0,
    ):
        self.window = _checks.integer(window, "window (W)", minimum=1, maximum=256)
        self.ngram = _checks.integer(ngram, "ngram (N)", minimum=2, maximum=32)
        self.pool_size = _checks.integer(pool, "pool (G)", minimum=1, maximum=1024)
        self.prompt_pool = _checks.boolean(prompt_pool, "prompt_pool")
        self.seed = _checks.seed(seed)
        shape = (self.window, self.ngram, self.pool_size)
        default = (DEFAULT_WINDOW, DEFAULT_NGRAM, DEFAULT_POOL)
        self.name = "lookahead" if shape == default else "lookahead:{},{},{}".format(*shape)
        self.window_positions = self.window * (self.ngram - 1)  # per drafting round's forward
        self.levels: list[list[int]] = []
        self.pool = NgramPool(self.ngram, self.pool_size)
        self._indexed = 0  # committed tokens whose n-grams are in the pool
        self._running: list[list[int]] | None = None  # the levels of the window in flight

    @classmethod
    def from_spec(cls, arg: Any, target: Any, tokenizer: Any, greedy: bool) -> Lookahead:
        return cls() if arg is None else cls(*parse_shape(arg))

    @classmethod
    def check_spec(cls, arg: str) -> None:
        """The shape's bounds, before any model loads."""
        cls(*parse_shape(arg))

    def check_target(self, target: PreTrainedModel) -> None:
        pass  # any target that runs a tree mask (`runner.forward_tree`)

    def fresh(self) -> Lookahead:
        return Lookahead(
            self.window, self.ngram, self.pool_size, prompt_pool=self.prompt_pool, seed=self.seed
        )

    def start(
        self, seq: torch.Tensor, target_cache: Cache, target_hidden: torch.Tensor | None = None
    ) -> None:
        rng = np.random.default_rng(self.seed)
        first = rng.choice(seq.cpu().numpy(), size=self.window + self.ngram - 2)
        self.levels = [[int(t) for t in first]]
        self.pool = NgramPool(self.ngram, self.pool_size)
        self._indexed = 0
        self._running = None
        self._index(seq)

    def _index(self, seq: torch.Tensor) -> None:
        """Pool the committed text's n-grams not pooled yet (with prompt_pool)."""
        if self.prompt_pool and len(seq) > self._indexed:
            start = max(0, self._indexed - self.ngram + 1)
            self.pool.add_text(seq[start:].tolist())
        self._indexed = len(seq)

    def candidates(self, seq: torch.Tensor) -> list[tuple[int, ...]]:
        """The pool's continuations of seq's last token, the most recent first
        (the committed text pooled first)."""
        self._index(seq)
        return self.pool.continuations(int(seq[-1]))[::-1]

    def chain(self, seq: torch.Tensor, k: int) -> list[int]:
        """A chain round's drafts: the most recent continuation, at most k tokens."""
        found = self.candidates(seq)
        return list(found[0][:k]) if found else []

    def launch_window(self) -> Window:
        """The window for a forward about to run (`window_nodes`), held
        until `observe_window` reads its logits back."""
        self._running = [list(row) for row in self.levels]
        return self.window_nodes()

    def window_nodes(self) -> Window:
        """The window as tree nodes, level by level: level 0's column i under
        column i − 1 (column 0 under the root), level l's under level l − 1's;
        only the top level's logits are read (the LM head skips the rest)."""
        import torch

        width, height = len(self.levels[0]), len(self.levels)
        parents = [-1, *range(width - 1)]
        for level in range(1, height):
            parents += [(level - 1) * width + i for i in range(width)]
        tokens = torch.tensor([t for row in self.levels for t in row], dtype=torch.long)
        return Window(tokens, parents, list(range((height - 1) * width, height * width)))

    def propose(self, seq: torch.Tensor, k: int, sampler: Sampler) -> Draft:
        import torch

        found = self.chain(seq, k)
        window = self.launch_window()
        if found:
            draft = one_hot_draft(torch.tensor(found, dtype=torch.long), sampler)
        else:
            draft = empty_draft(sampler)
        return Draft(draft.tokens, draft.q, window=window)

    def propose_tree(self, seq: torch.Tensor, budget: int, sampler: Sampler) -> TreeDraft:
        """Every continuation of the last token in the pool (the most recent
        first) as a trie of at most `budget` nodes; fixed children."""
        import torch

        tokens, parents = trie([list(c) for c in self.candidates(seq)], budget)
        window = self.launch_window()
        ids = torch.tensor(tokens, dtype=torch.long, device=sampler.device)
        return TreeDraft(ids, parents, None, "fixed", window=window)

    def observe_window(self, logits: torch.Tensor) -> None:
        """One Jacobi step from the logits (W', V) at the window's top level
        (the nodes it reads): pool the columns' n-grams once the levels are
        full, then shift the levels (see the module docs)."""
        if self._running is None:
            raise ValueError("lookahead: observe_window() without a window in flight")
        levels, self._running = self._running, None
        width = len(levels[0])
        if logits.shape[0] != width:
            raise ValueError(
                f"lookahead: {logits.shape[0]} window rows for a top level of {width} nodes"
            )
        new = argmax(logits).tolist()
        if len(levels) < self.ngram - 1:  # filling: every level moves one position on
            self.levels = [row[1:] for row in levels] + [new[1:]]
            return
        for i in range(width):
            self.pool.add([row[i] for row in levels] + [new[i]])
        self.levels = levels[1:] + [new]

    def update(
        self, seq: torch.Tensor, num_accepted: int, target_hidden: torch.Tensor | None = None
    ) -> None:
        pass  # the window moved on in observe_window; the pool reads the text in propose

    def acceptance(self, tf: TeacherForced, k_max: int) -> np.ndarray:
        """a[t, i] with the answer forced: rounds run along the answer as a
        generation would (each with its window, in the target's forward),
        each keeping the drafts that match the answer plus one token; a
        round start t drafts the pool's most recent continuation of the
        token before it, and so does every position a round skipped, from
        the pool as that round left it. a[t, i] is the indicator
        x_i = answer[t + i] at greedy, else p_{t+i}(x_i) (one-hot q)."""
        import torch

        probe = self.fresh()
        target = tf.target
        device = models.device_of(target)
        seq = tf.seq.cpu()
        scores = ChainScores(tf, k_max)
        answer, n = scores.answer, scores.n
        cache = runner.new_cache(target)
        if tf.start > 1:
            runner.forward(target, seq[: tf.start - 1].to(device), cache, keep=1)
        probe.start(seq[: tf.start], cache, None)
        t = 0
        while t < n:
            context = seq[: tf.start + t]
            draft = probe.chain(context, k_max)
            scores.score(t, draft)
            d = len(draft)
            tokens, parents, rows = joined(
                torch.tensor(draft, dtype=torch.long), list(range(-1, d - 1)), probe.launch_window()
            )
            logits, _ = runner.forward_tree(target, context[-1:], tokens, parents, cache, rows=rows)
            probe.observe_window(logits[1 + d :])
            matched = 0
            while matched < d and t + matched < n and draft[matched] == answer[t + matched]:
                matched += 1
            runner.crop(cache, tf.start + t + matched)
            for skipped in range(t + 1, min(t + matched + 1, n)):
                scores.score(skipped, probe.chain(seq[: tf.start + skipped], k_max))
            t += matched + 1
        return scores.a

    def hf_kwargs(self) -> dict[str, Any] | None:
        return None  # transformers' generate has no lookahead decoding
