"""A key-value cache that is written in place: each layer keeps its keys and
values in buffers (B, kv heads, capacity, head dim) allocated once, a step
writes its new positions into them and attention reads views of the filled
part. Cropping sets the length; tree compaction moves only the accepted
nodes' entries. The capacity doubles when full, so no step copies the cache
(transformers' `DynamicCache` concatenates a new tensor every step).

It is a transformers `Cache` whose layers are `DynamicLayer`s as far as the
masks and the models see, so every model and every path of the loop
(chains, trees, layer views, the drafters' own caches) runs on it unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

INITIAL_CAPACITY = 256  # positions; doubled as needed
_epoch = 0  # counts every buffer made or dropped, by any layer (see `buffers_epoch`)


def buffers_epoch() -> int:
    """A number that changes whenever any `PreallocatedLayer` makes or drops
    a buffer: views of the buffers taken at one epoch are still the
    buffers at the same epoch (a runner keeps its arrays of a cache's
    buffers between forwards on that promise)."""
    return _epoch


def _new_epoch() -> None:
    global _epoch
    _epoch += 1


class PreallocatedLayer(DynamicLayer):  # type: ignore[misc]
    """One layer's cache. `keys` / `values` are views (B, H, length, D) of the
    buffers; assigning them (as transformers and older code do) copies into
    the buffers instead of replacing them."""

    def __init__(self, capacity: int = INITIAL_CAPACITY, **kwargs: Any):
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self.length = 0
        self.initial_capacity = capacity
        super().__init__(**kwargs)

    # keys / values: views of the filled part
    @property
    def keys(self) -> torch.Tensor | None:
        return None if self._k is None else self._k[..., : self.length, :]

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:
        self._assign("_k", value)

    @property
    def values(self) -> torch.Tensor | None:
        return None if self._v is None else self._v[..., : self.length, :]

    @values.setter
    def values(self, value: torch.Tensor | None) -> None:
        self._assign("_v", value)

    def _assign(self, name: str, value: torch.Tensor | None) -> None:
        if value is None:
            _new_epoch()
            setattr(self, name, None)
            self.length = 0
            return
        n = value.shape[-2]
        buffer = getattr(self, name)
        if buffer is None or buffer.shape[:2] != value.shape[:2] or buffer.shape[-2] < n:
            buffer = self._allocate(value, max(n, self.initial_capacity))
            setattr(self, name, buffer)
        if value.data_ptr() != buffer.data_ptr():
            buffer[..., :n, :].copy_(value)
        self.length = n

    @staticmethod
    def _allocate(like: torch.Tensor, capacity: int) -> torch.Tensor:
        _new_epoch()
        shape = (*like.shape[:-2], capacity, like.shape[-1])
        return torch.empty(shape, dtype=like.dtype, device=like.device)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        capacity = max(self.initial_capacity, key_states.shape[-2])
        self._k = self._allocate(key_states, capacity)
        self._v = self._allocate(value_states, capacity)
        self.length = 0
        self.is_initialized = True

    def _reserve(self, needed: int) -> None:
        """Capacity for `needed` positions: the buffers doubled (a copy of
        the filled part, amortized over the steps that filled it)."""
        assert self._k is not None and self._v is not None
        capacity = self._k.shape[-2]
        if needed <= capacity:
            return
        while capacity < needed:
            capacity *= 2
        for name in ("_k", "_v"):
            old = getattr(self, name)
            new = self._allocate(old, capacity)
            new[..., : self.length, :].copy_(old[..., : self.length, :])
            setattr(self, name, new)

    def slots(
        self, n: int, like: tuple[int, int, int], dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Room for n more positions of keys shaped like `like` (B, H, D)
        in `dtype` (the buffers' type, fixed by the first call: another
        is a ValueError): (the key buffer, the value buffer, the filled
        length). The caller writes positions length..length + n itself,
        then calls `advance(n)`."""
        if not self.is_initialized:
            b, h, d = like
            self.lazy_initialization(
                torch.empty(b, h, n, d, dtype=dtype), torch.empty(b, h, n, d, dtype=dtype)
            )
        assert self._k is not None and self._v is not None
        if self._k.dtype != dtype:
            raise ValueError(
                f"this cache holds {self._k.dtype} keys and values; the model writes {dtype} "
                "ones (its cache type changed after the cache was filled): start a new cache"
            )
        self._reserve(self.length + n)
        return self._k, self._v, self.length

    def slot_arrays(
        self, n: int, like: tuple[int, int, int], dtype: torch.dtype
    ) -> tuple[Any, Any, int]:
        """`slots` for a batch of one, as NumPy arrays (H, capacity, D) of
        the key and value buffers (made once per buffer: the native layer
        writes them in place)."""
        keys, values, length = self.slots(n, like, dtype)
        views = getattr(self, "_arrays", None)
        if views is None or views[0] is not keys or views[1] is not values:
            views = self._arrays = (keys, values, keys[0].numpy(), values[0].numpy())
        return views[2], views[3], length

    def advance(self, n: int) -> None:
        """n positions written past the filled part (see `slots`)."""
        self.length += n

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new positions (B, H, n, D) after the filled part; return
        views of every filled position."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        assert self._k is not None and self._v is not None
        start, n = self.length, key_states.shape[-2]
        self._reserve(start + n)
        self._k[..., start : start + n, :].copy_(key_states)
        self._v[..., start : start + n, :].copy_(value_states)
        self.length = start + n
        return self._k[..., : self.length, :], self._v[..., : self.length, :]

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        """Forget the last `-tokens_to_remove` positions (transformers'
        convention: a negative count); nothing is copied."""
        if tokens_to_remove > 0:
            raise ValueError(
                f"crop({tokens_to_remove}): pass a negative count of positions to remove"
            )
        self.length = max(0, self.length + tokens_to_remove)

    def rewind(self, length: int, what: str) -> None:
        """Keep the first `length` entries, to be written over from there;
        ValueError (naming `what`) when it holds fewer: writing there would
        leave a gap."""
        filled = self.get_seq_length()
        if length > filled:
            raise ValueError(f"{what} at {length}: the cache holds {filled} entries")
        self.crop(length - filled)

    def keep(self, positions: torch.Tensor) -> None:
        """Keep the entries at `positions` (ascending), in place: the run that
        is already in place stays, and only the entries after it move."""
        if self._k is None or self._v is None:
            return
        idx = positions.to(self._k.device)
        ordered = torch.arange(len(idx), device=idx.device)
        moved = torch.nonzero(idx != ordered)
        first = int(moved[0, 0]) if len(moved) else len(idx)
        if first < len(idx):
            tail = idx[first:]
            for buffer in (self._k, self._v):
                buffer[..., first : len(idx), :] = buffer.index_select(-2, tail)
        self.length = len(idx)

    def reset(self) -> None:
        self.length = 0

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.get_seq_length() > 0:
            self.keys = self.keys.repeat_interleave(repeats, dim=0)  # type: ignore[union-attr]
            self.values = self.values.repeat_interleave(repeats, dim=0)  # type: ignore[union-attr]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.get_seq_length() > 0:
            self.keys = self.keys[indices, ...]  # type: ignore[index]
            self.values = self.values[indices, ...]  # type: ignore[index]


class PreallocatedCache(Cache):  # type: ignore[misc]
    """A cache of `num_layers` `PreallocatedLayer`s, one per decoder layer."""

    def __init__(self, num_layers: int, capacity: int = INITIAL_CAPACITY):
        super().__init__(layers=[PreallocatedLayer(capacity) for _ in range(num_layers)])
