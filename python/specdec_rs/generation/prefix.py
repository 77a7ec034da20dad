"""A prefix cache: the target's keys and values of token prefixes, kept
after a request and copied into a later request's cache when its prompt
starts with the same tokens, so only the rest is prefilled.

Blocks of `block` positions form a chain: block i of a sequence is found
by (the id of block i - 1, its own `block` tokens), so a block is reused
only after the very same tokens before it (no hash can collide: the key
holds the tokens). A block holds every layer's keys and values of its
positions, (layers, 2, kv heads, block, head dim), float32. Blocks are
stored once however many rows read them, and the least recently used are
evicted past `megabytes`; a lookup refreshes a chain's blocks from its
last to its first, so a chain loses its tail before its head.

Exactness: on a GGUF target a position's key and value are a function of
the tokens up to it alone, the same bits however the prefix was batched
or chunked (the kernels' fixed order), so a reused prefix is exactly the
prefix computed afresh, and so is everything after it. Other targets' are
not (torch may sum in another order), and `check_target` refuses them.

>>> cache = PrefixCache(megabytes=64)
>>> cache.stats()["blocks"]
0
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specdec_rs import _checks

if TYPE_CHECKING:
    import torch

BLOCK = 8  # positions per block (a turn recomputes at most BLOCK - 1 stored positions)
ROOT = 0  # the parent id of every chain's first block


@dataclass
class _Block:
    id: int
    kv: torch.Tensor  # (layers, 2: keys and values, kv heads, block, head dim)

    @property
    def bytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()


class PrefixCache:
    """Keys and values of token prefixes in blocks of `block` positions, at
    most `megabytes` of them (see the module docs). `restore` fills an empty
    target cache with the longest stored prefix of a prompt; `store` keeps
    a sequence's full blocks. `queries` / `hits`: prompt tokens looked up
    and found (vLLM's prefix-cache counters, in tokens)."""

    def __init__(self, megabytes: float = 256.0, block: int = BLOCK):
        self.budget = int(_checks.real(megabytes, "megabytes", above=0.0) * (1 << 20))
        self.block = _checks.integer(block, "block", minimum=1, maximum=4096)
        self.blocks: OrderedDict[tuple[int, tuple[int, ...]], _Block] = OrderedDict()
        self.bytes = 0
        self.queries = self.hits = 0
        self.next_id = ROOT + 1
        self.owner: int | None = None  # id() of the one target whose keys this holds

    def bind(self, target: Any) -> None:
        """Hold `target`'s keys and values only (checked once: a GGUF target on
        the CPU; another target later is a ValueError)."""
        if self.owner == id(target):
            return
        if self.owner is not None:
            raise ValueError(
                "this PrefixCache holds another target's keys and values; give each target "
                "its own PrefixCache"
            )
        check_target(target)
        self.owner = id(target)

    @staticmethod
    def _key(parent: int, tokens: list[int]) -> tuple[int, tuple[int, ...]]:
        """A block's key: its parent block's id and its own tokens."""
        return (parent, tuple(tokens))

    def _chain(self, tokens: Any, upto: int) -> list[tuple[tuple[int, tuple[int, ...]], _Block]]:
        """The stored blocks of tokens[:upto]'s full blocks, from the first,
        as far as they are stored."""
        ids = _ids(tokens, upto - upto % self.block)
        found, parent = [], ROOT
        for start in range(0, len(ids), self.block):
            key = self._key(parent, ids[start : start + self.block])
            held = self.blocks.get(key)
            if held is None:
                break
            found.append((key, held))
            parent = held.id
        return found

    def restore(self, prompt: Any, cache: Any, upto: int, *, query: bool = True) -> int:
        """Extend `cache` (a `PreallocatedCache` holding prompt[:s], s a
        multiple of the block, often 0) with the stored blocks that follow
        in prompt[:upto] (whole blocks); returns the positions added (the
        cache then holds prompt[:s + added]). With `query`, counts
        len(prompt) tokens queried; every position added is a hit."""
        if query:
            self.queries += len(prompt)
        start = min(layer.get_seq_length() for layer in cache.layers)
        if start % self.block:
            return 0
        found = self._chain(prompt, upto)
        new = found[start // self.block :]
        if not new or new[0][1].kv.shape[0] != len(cache.layers):
            return 0
        import torch

        m = len(new) * self.block
        kv = torch.cat([held.kv for _, held in new], dim=3)  # (layers, 2, heads, m, dim)
        for i, layer in enumerate(cache.layers):
            keys, values, at = layer.slots(m, (1, kv.shape[2], kv.shape[4]), kv.dtype)
            keys[0, :, at : at + m].copy_(kv[i, 0])
            values[0, :, at : at + m].copy_(kv[i, 1])
            layer.advance(m)
        for key, _ in reversed(found):  # the chain's head most recent: evicted last
            self.blocks.move_to_end(key)
        self.hits += m
        return m

    def store(self, tokens: Any, cache: Any, upto: int) -> None:
        """Keep the full blocks of tokens[:upto] that are not stored yet
        (cache position t holds token t's key and value; upto at most the
        cache's length), then evict the least recently used past the budget."""
        import torch

        upto = min(upto, min(layer.get_seq_length() for layer in cache.layers))
        ids = _ids(tokens, upto - upto % self.block)
        parent, touched, pending = ROOT, [], []
        for start in range(0, len(ids), self.block):
            key = self._key(parent, ids[start : start + self.block])
            held = self.blocks.get(key)
            if held is None:
                # its keys and values are filled below, with the other new blocks'
                held = _Block(self.next_id, None)  # type: ignore[arg-type]
                self.next_id += 1
                pending.append((start, held))
                self.blocks[key] = held
            touched.append(key)
            parent = held.id
        if pending:  # the new blocks' keys and values, gathered once for all of them
            first, end = pending[0][0], pending[-1][0] + self.block
            kv = torch.stack(
                [
                    torch.stack([layer.keys[0, :, first:end], layer.values[0, :, first:end]])
                    for layer in cache.layers
                ]
            )  # (layers, 2, heads, end - first, dim)
            for start, held in pending:
                at = start - first
                held.kv = kv[:, :, :, at : at + self.block].clone()
                self.bytes += held.bytes
        for key in reversed(touched):
            self.blocks.move_to_end(key)
        while self.bytes > self.budget:
            _, old = self.blocks.popitem(last=False)
            self.bytes -= old.bytes

    def stats(self) -> dict[str, int]:
        """Blocks and bytes held, tokens queried and hit."""
        return {
            "blocks": len(self.blocks),
            "bytes": self.bytes,
            "queries": self.queries,
            "hits": self.hits,
        }


def _ids(tokens: Any, n: int) -> list[int]:
    """The first n token ids as ints (a tensor's by one tolist())."""
    head = tokens[:n]
    return head.tolist() if hasattr(head, "tolist") else [int(t) for t in head]


def checked_prefix(prefix: Any, target: Any) -> PrefixCache | None:
    """`prefix` (a `PrefixCache` bound to `target`) or None; a ValueError otherwise."""
    if prefix is None:
        return None
    if not isinstance(prefix, PrefixCache):
        raise ValueError(
            f"prefix_cache is a {type(prefix).__name__}; pass a generation.PrefixCache or None"
        )
    prefix.bind(target)
    return prefix


def check_target(target: Any) -> None:
    """A ValueError unless `target` is a GGUF model on the CPU (the targets
    whose cached keys and values are the bits a fresh prefill computes)."""
    from specdec_rs import models
    from specdec_rs.runner.stack import batchable

    if not (batchable(target) and models.device_of(target).type == "cpu"):
        raise ValueError(
            "a prefix cache needs a GGUF target on the CPU (its reused keys and values are "
            "the same bits as computed ones; a transformers model's may not be): load a "
            ".gguf file, or drop prefix_cache"
        )
