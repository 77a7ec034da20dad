"""Suffix decoding: drafts from the counts of what followed the text's end,
in this sequence and in earlier ones. p = target, q = draft (one-hot), k = γ.

`SuffixIndex` counts every substring of at most `depth` tokens of the
sequences added to it (a suffix trie of bounded depth: node = substring,
count = its occurrences, children = the tokens that followed). A
`SuffixDrafter` keeps one index over its own sequence (prompt + output,
grown as tokens are accepted) and shares a global one over the outputs of
every sequence drafted by it or its `fresh()` copies (the rows of a batch,
a server's requests), bounded to `global_tokens` tokens, the oldest
sequences evicted first.

A round: the longest suffix of the text (m tokens, at most `depth` −
min(k, depth / 2), so the draft has room below it) that occurred before
with a continuation, in either index; from that node
the draft follows the most frequent continuation while its empirical
path probability (the product of count / the node's continuations along
the way) stays at or above `min_prob`, for at most min(k, ⌊factor·m +
offset⌋) tokens (the more of the text matched, the longer the draft it can
trust); a match shorter than `min_match` tokens does not draft. Of the two indexes
the draft with the larger sum of path probabilities (its expected length)
wins. A tree (`propose_tree`) expands the nodes of largest path
probability first, up to `budget` nodes, as fixed children: verification
(`verify` with one-hot q for a chain, `verify_tree` with fixed children)
keeps the output exactly the target's at any temperature.

>>> index = SuffixIndex(depth=4)
>>> index.add([1, 2, 3, 1, 2, 4, 1, 2, 3])
>>> node = index.find([1, 2])
>>> sorted((t, c.count) for t, c in node.children.items())
[(3, 2), (4, 1)]
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from specdec_rs import _checks, _core
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

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel
    from transformers.cache_utils import Cache

MAX_DEPTH = 256
MAX_TOKEN_ID = 2**32  # the trie's ids are u32
NODE_BYTES = 112  # what a trie node costs (its counts, its child map)
DEFAULT_GLOBAL_NODES = 2_000_000  # the global index's node bound: about 224 MB
FILE_FORMAT = "specdec-suffix-index"
FILE_VERSION = 1
FIX = "save it again with SuffixDrafter.save(path), or start without it (--drafter suffix)"


class Node:
    """A view of one substring of a `SuffixIndex` (a node of its Rust trie):
    how often it occurred (`count`), what followed it (`children`), how
    often anything followed it (`total`) and its most frequent continuation
    (`best`: the first to reach the largest count). Kept as counts change,
    so a draft step costs O(1)."""

    __slots__ = ("id", "trie")

    def __init__(self, trie: _core.SuffixTrie, node: int):
        self.trie, self.id = trie, node

    @property
    def count(self) -> int:
        return self.trie.count(self.id)

    @property
    def total(self) -> int:
        return self.trie.total(self.id)

    @property
    def best(self) -> int | None:
        return self.trie.best(self.id)

    @property
    def children(self) -> dict[int, Node]:
        return {t: Node(self.trie, c) for t, c in self.trie.children(self.id)}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Node) and other.trie is self.trie and other.id == self.id

    def __hash__(self) -> int:
        return hash((id(self.trie), self.id))


class SuffixIndex:
    """Counts of the substrings (at most `depth` tokens) of the sequences
    added, in a Rust trie (`_core.SuffixTrie`). `grow(state, tokens)`
    extends one sequence token by token in O(depth) each (`state`: the node
    ids of its current suffixes, lengths 1, 2, ...); `remove(tokens)` undoes
    `add(tokens)` (eviction)."""

    def __init__(self, depth: int = 32):
        self.depth = _checks.integer(depth, "depth", minimum=2, maximum=MAX_DEPTH)
        self.trie = _core.SuffixTrie(self.depth)

    @property
    def root(self) -> Node:
        return Node(self.trie, 0)

    def __len__(self) -> int:
        """Nodes in use (the root included)."""
        return len(self.trie)

    def grow(self, suffixes: list[int], tokens: list[int] | Any) -> list[int]:
        """The suffix node ids after appending `tokens` to a sequence whose
        suffix node ids (lengths 1, 2, ...) are `suffixes`; counts added."""
        return self.trie.grow(suffixes, tokens if isinstance(tokens, list) else list(tokens))

    def add(self, tokens: list[int] | Any) -> None:
        self.grow([], tokens)

    def remove(self, tokens: list[int] | Any) -> None:
        """Take one earlier `add(tokens)` back out (nodes left empty go)."""
        self.trie.remove(tokens if isinstance(tokens, list) else list(tokens))

    def find(self, pattern: list[int]) -> Node | None:
        node = self.trie.find(list(pattern))
        return None if node is None else Node(self.trie, node)

    def longest_match(self, seq: list[int], max_match: int) -> tuple[Node | None, int]:
        """(node, m) for the longest suffix of `seq` (m <= max_match) that
        occurred with a continuation; (None, 0) when none did. Found by
        bisection: if the last m tokens occurred followed by x, so did the
        last m − 1 (at the same place), so "occurred with a continuation"
        holds for every m up to the longest and for none beyond."""
        node, m = self.trie.longest_match(seq[max(0, len(seq) - self.depth) :], max_match)
        return (None if node is None else Node(self.trie, node)), m


@dataclass(frozen=True)
class Proposal:
    """A chain from one index: its tokens and their path probabilities."""

    tokens: list[int]
    probs: list[float]

    @property
    def score(self) -> float:
        return sum(self.probs)


def chain_from(node: Node | None, limit: int, min_prob: float) -> Proposal:
    """The most frequent continuation from `node` while its path
    probability (the product of count / the node's continuations along the
    way) is >= min_prob; at most `limit` tokens. Among equal counts the
    continuation that reached that count first (on code editing: the
    prompt's text)."""
    if node is None:
        return Proposal([], [])
    tokens, probs = node.trie.chain(node.id, limit, min_prob)
    return Proposal(tokens, probs)


def tree_from(node: Node, limit: int, budget: int, min_prob: float) -> tuple[list[int], list[int]]:
    """(tokens, parents) of the continuations of `node` expanded by largest
    path probability first (every node's path probability >= min_prob), at
    most `budget` nodes and `limit` deep; siblings by count, then id."""
    tokens, parents = node.trie.tree(node.id, limit, budget, min_prob)
    return tokens, parents


class SharedSuffixes:
    """The global index of a drafter and its fresh copies: the outputs of
    the sequences they drafted for, at most `max_tokens` tokens and
    `max_nodes` trie nodes (`NODE_BYTES` each: the default bound holds
    about 224 MB; text that never repeats adds up to `depth` nodes a
    token). The oldest sequences are evicted whole, the one growing too
    when it alone passes the bound (it then stops counting)."""

    def __init__(self, depth: int, max_tokens: int, max_nodes: int = DEFAULT_GLOBAL_NODES):
        self.index = SuffixIndex(depth)
        self.max_tokens = max_tokens
        self.max_nodes = _checks.integer(max_nodes, "global_nodes", minimum=1)
        self.sequences: deque[list[int]] = deque()
        self.live: set[int] = set()  # id() of the sequences not evicted (their views hold them)
        self.tokens = 0

    def open(self) -> list[int]:
        """A new sequence's output (appended to by `extend`)."""
        out: list[int] = []
        self.sequences.append(out)
        self.live.add(id(out))
        return out

    def save(self, path: Any) -> None:
        """The sequences (the index is rebuilt from them) as JSON with a
        format, a version and the SHA-256 of the canonical payload. The path
        is checked first (a folder, a missing folder: ValueError)."""
        from specdec_rs import _files

        path = _checks.output_file(path, "path")
        payload = {
            "depth": self.index.depth,
            "max_tokens": self.max_tokens,
            "sequences": [list(s) for s in self.sequences],
        }
        record = {
            "format": FILE_FORMAT,
            "version": FILE_VERSION,
            "sha256": digest(payload),
            "index": payload,
        }
        _files.write_json(path, record, what="the suffix index", indent=None)

    @classmethod
    def load(cls, path: Any, *, max_nodes: int = DEFAULT_GLOBAL_NODES) -> SharedSuffixes:
        """A saved index (`read_saved`), its trie rebuilt."""
        depth, max_tokens, sequences = read_saved(path)
        shared = cls(depth, max_tokens, max_nodes)
        for seq in sequences:
            shared.extend(shared.open(), [], seq)
        return shared

    @property
    def largest_token(self) -> int:
        return max((max(s) for s in self.sequences if s), default=-1)

    def extend(self, output: list[int], suffixes: list[int], tokens: list[int]) -> list[int]:
        if id(output) not in self.live:
            return suffixes  # evicted: it no longer counts
        output += tokens
        self.tokens += len(tokens)
        suffixes = self.index.grow(suffixes, tokens)
        while self.sequences and (
            (self.tokens > self.max_tokens and len(self.sequences) > 1)
            or len(self.index) > self.max_nodes
        ):
            old = self.sequences.popleft()
            self.live.discard(id(old))
            self.index.remove(old)
            self.tokens -= len(old)
        return suffixes if id(output) in self.live else []


def read_saved(path: Any) -> tuple[int, int, list[list[int]]]:
    """(depth, max_tokens, sequences) of a saved index, checked; any damage
    (not JSON, another format or version, a checksum that differs, a
    malformed field, an id that is no token id) is a ValueError naming the file."""
    from specdec_rs import _files

    what = "suffix index"
    data = _files.read_json(path, what=what, fix=FIX)
    if not isinstance(data, dict) or data.get("format") != FILE_FORMAT:
        raise _files.problem(path, f"not a {FILE_FORMAT} file", FIX)
    if data.get("version") != FILE_VERSION:
        raise _files.problem(
            path, f"version {data.get('version')!r}; this build reads {FILE_VERSION}", FIX
        )
    payload = data.get("index")
    if not isinstance(payload, dict) or data.get("sha256") != digest(payload):
        raise _files.problem(path, "the checksum does not match the contents (damaged)", FIX)
    depth, max_tokens, sequences = (payload.get(k) for k in ("depth", "max_tokens", "sequences"))
    ok = (
        isinstance(depth, int)
        and not isinstance(depth, bool)
        and 2 <= depth <= MAX_DEPTH
        and isinstance(max_tokens, int)
        and not isinstance(max_tokens, bool)
        and max_tokens >= 1
        and isinstance(sequences, list)
        and all(isinstance(q, list) for q in sequences)
    )
    if not ok:
        raise _files.problem(
            path,
            f"the index's depth (2..{MAX_DEPTH}), max_tokens (>= 1) or "
            "sequences (lists of token ids) are malformed",
            FIX,
        )
    for i, seq in enumerate(sequences):  # type: ignore[arg-type]
        for t in seq:
            if not (isinstance(t, int) and not isinstance(t, bool) and 0 <= t < MAX_TOKEN_ID):
                raise _files.problem(
                    path, f"sequence {i} holds {t!r}, not a token id (an int in [0, 2^32))", FIX
                )
    return depth, max_tokens, sequences  # type: ignore[return-value]


def digest(payload: Any) -> str:
    """SHA-256 of the payload's canonical JSON (sorted keys, no spaces)."""
    import hashlib
    import json

    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


@register(
    "suffix",
    arg="optional-path",
    help="suffix decoding: what followed the text's end here and in earlier outputs "
    "(:PATH a saved global index)",
)
class SuffixDrafter:
    """Suffix decoding (see the module docs). depth: the longest substring
    counted (match + draft); factor, offset: the draft is at most
    ⌊factor·m + offset⌋ tokens after an m-token match; min_prob: the
    least path probability a drafted token may have; min_match: the
    shortest match that drafts; global_tokens, global_nodes: the global
    index's bounds in tokens (0: no global index) and in trie nodes
    (`NODE_BYTES` = 112 bytes each: the default bounds it to about 224 MB)."""

    needs_target_hidden = False

    def __init__(
        self,
        *,
        depth: int = 32,
        factor: float = 1.0,
        offset: float = 0.0,
        min_prob: float = 0.1,
        min_match: int = 2,
        global_tokens: int = 1_000_000,
        global_nodes: int = DEFAULT_GLOBAL_NODES,
        shared: SharedSuffixes | None = None,
    ):
        self.depth = _checks.integer(depth, "depth", minimum=2, maximum=MAX_DEPTH)
        self.factor = _checks.real(factor, "factor", above=0.0)
        self.offset = _checks.real(offset, "offset", minimum=0.0)
        self.min_prob = _checks.real(min_prob, "min_prob", above=0.0, maximum=1.0)
        self.min_match = _checks.integer(min_match, "min_match", minimum=1, maximum=self.depth - 1)
        global_tokens = _checks.integer(global_tokens, "global_tokens", minimum=0)
        self.shared = (
            shared
            if shared is not None
            else SharedSuffixes(self.depth, global_tokens, global_nodes)
            if global_tokens
            else None
        )
        self.name = "suffix"
        self.local = SuffixIndex(self.depth)
        self._local_suffixes: list[int] = []  # node ids of the text's suffixes
        self._global_suffixes: list[int] = []
        self._output: list[int] | None = None
        self._seen = 0  # tokens of the sequence indexed so far
        self._tokens: list[int] = []

    @classmethod
    def from_spec(cls, arg: Any, target: Any, tokenizer: Any, greedy: bool) -> SuffixDrafter:
        drafter = cls() if arg is None else cls.load(arg)
        drafter.check_target(target)
        return drafter

    @classmethod
    def check_spec(cls, arg: str) -> None:
        """``suffix:PATH``: the saved index's contents, and that the default
        options fit its depth, before any model loads."""
        from specdec_rs import _files

        depth, _, _ = read_saved(arg)
        try:
            cls(depth=depth, global_tokens=0)
        except ValueError as e:
            raise _files.problem(arg, f"the saved index does not fit ({e})", FIX) from None

    @classmethod
    def load(cls, path: Any, **options: Any) -> SuffixDrafter:
        """A drafter whose global index is the one saved at `path` (its
        depth and token bound are the file's)."""
        from specdec_rs import _files

        nodes = options.pop("global_nodes", DEFAULT_GLOBAL_NODES)
        shared = SharedSuffixes.load(path, max_nodes=nodes)
        try:
            return cls(depth=shared.index.depth, shared=shared, **options)
        except ValueError as e:
            raise _files.problem(path, f"the saved index does not fit ({e})", FIX) from None

    def save(self, path: Any) -> None:
        """Save the global index (`SharedSuffixes.save`); ValueError without one."""
        if self.shared is None:
            raise ValueError("this suffix drafter has no global index (global_tokens=0)")
        self.shared.save(path)

    def fresh(self) -> SuffixDrafter:
        """A drafter for another sequence sharing this one's global index."""
        return SuffixDrafter(
            depth=self.depth,
            factor=self.factor,
            offset=self.offset,
            min_prob=self.min_prob,
            min_match=self.min_match,
            global_tokens=0 if self.shared is None else self.shared.max_tokens,
            shared=self.shared,
        )

    def check_target(self, target: PreTrainedModel) -> None:
        """A loaded global index must hold only ids of the target's vocabulary."""
        largest = -1 if self.shared is None else self.shared.largest_token
        if largest < 0:
            return
        from specdec_rs import models

        vocab = models.vocab_of(target)
        if largest >= vocab:
            raise ValueError(
                f"the suffix drafter's global index holds the id {largest}, "
                f"outside the target's vocabulary of {vocab}: it was saved for another model"
            )

    def start(
        self, seq: torch.Tensor, target_cache: Cache, target_hidden: torch.Tensor | None = None
    ) -> None:
        self._begin([int(t) for t in seq.tolist()], learn=True)

    def _begin(self, tokens: list[int], *, learn: bool) -> None:
        """A new sequence (its prompt `tokens`); `learn`: its output goes
        into the global index as it grows."""
        self.local = SuffixIndex(self.depth)
        self._local_suffixes = self.local.grow([], tokens)
        self._global_suffixes = []
        self._output = self.shared.open() if self.shared is not None and learn else None
        self._tokens = tokens
        self._seen = len(tokens)

    def update(
        self, seq: torch.Tensor, num_accepted: int, target_hidden: torch.Tensor | None = None
    ) -> None:
        new = [int(t) for t in seq[self._seen :].tolist()]
        if not new:
            return
        self._tokens += new
        self._seen += len(new)
        self._local_suffixes = self.local.grow(self._local_suffixes, new)
        if self.shared is not None and self._output is not None:
            self._global_suffixes = self.shared.extend(self._output, self._global_suffixes, new)

    def end(self, seq: torch.Tensor) -> None:
        """The sequence is complete: index its last round's tokens too (the
        global index would otherwise miss them: `update` sees the sequence
        before a round's tokens are appended)."""
        self._sync(seq)

    def _sync(self, seq: torch.Tensor) -> list[int]:
        """The sequence as a list, the indexes caught up with it."""
        if len(seq) != self._seen:
            # another sequence (start() was not called for it): a cheap check
            # (the length, the last token seen), not the whole prefix
            if len(seq) < self._seen or (
                self._seen and int(seq[self._seen - 1]) != self._tokens[-1]
            ):
                self._begin([int(t) for t in seq.tolist()], learn=self._output is not None)
            else:
                self.update(seq, 0)
        return self._tokens

    def _candidates(self, seq: list[int], k: int) -> list[tuple[Node, int]]:
        """(node, m) of the longest match in each index, leaving room below
        it for the draft: m <= depth − min(k, depth // 2) (a match as deep
        as the index could continue by one token only)."""
        out = []
        deepest = self.depth - max(1, min(k, self.depth // 2))
        for index in (self.local, self.shared.index if self.shared is not None else None):
            if index is None:
                continue
            node, m = index.longest_match(seq, max(self.min_match, deepest))
            if node is not None and m >= self.min_match:
                out.append((node, m))
        return out

    def _limit(self, m: int, k: int) -> int:
        return max(0, min(k, int(self.factor * m + self.offset)))

    def find(self, seq: list[int], k: int) -> list[int]:
        best = Proposal([], [])
        for node, m in self._candidates(seq, k):
            p = chain_from(node, self._limit(m, k), self.min_prob)
            if p.score > best.score:
                best = p
        return best.tokens

    def propose(self, seq: torch.Tensor, k: int, sampler: Sampler) -> Draft:
        import torch

        found = self.find(self._sync(seq), k)
        if not found:
            return empty_draft(sampler)
        return one_hot_draft(torch.tensor(found, dtype=torch.long), sampler)

    def propose_tree(self, seq: torch.Tensor, budget: int, sampler: Sampler) -> TreeDraft:
        """The better index's continuations as a tree of at most `budget`
        nodes (fixed children)."""
        tokens = self._sync(seq)
        best: tuple[float, list[int], list[int]] = (0.0, [], [])
        for node, m in self._candidates(tokens, budget):
            limit = self._limit(m, budget)
            score = chain_from(node, limit, self.min_prob).score
            if score > best[0]:
                best = (score, *tree_from(node, limit, budget, self.min_prob))
        return fixed_tree(best[1], best[2], sampler)

    def acceptance(self, tf: TeacherForced, k_max: int) -> np.ndarray:
        """a[t, i] for x = the draft after the text before answer position
        t: the indicator x_i = answer[t + i] at greedy, else p_{t+i}(x_i).
        The global index is read, not taught (the answer is not an output)."""
        seq = tf.seq.cpu()
        scores = ChainScores(tf, k_max)
        view = self.fresh()
        view._begin([int(t) for t in seq[: tf.start].tolist()], learn=False)
        for t in range(scores.n):
            view.update(seq[: tf.start + t], 0)
            scores.score(t, view.find(view._tokens, k_max))
        return scores.a

    def hf_kwargs(self) -> dict[str, Any] | None:
        return None
