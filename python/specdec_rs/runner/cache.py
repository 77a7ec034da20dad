"""The cache a forward writes: a new one, cropped back, compacted to a tree's path.

Any transformers `Cache` works; `kv_cache.PreallocatedCache` (what `new_cache`
makes) does each in place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel
    from transformers.cache_utils import Cache


def new_cache(model: PreTrainedModel) -> Cache:
    """An empty cache for `model`, written in place (`kv_cache.PreallocatedCache`:
    no copy of the cache per step; crops and tree compaction in place)."""
    from specdec_rs.kv_cache import PreallocatedCache

    return PreallocatedCache(int(model.config.num_hidden_layers))


def crop(cache: Cache, length: int, layers: range | None = None) -> None:
    """Cut `cache` (or only the given layers) back to `length` positions."""
    if layers is None:
        remove = cache.get_seq_length() - length
        if remove > 0:
            cache.crop(-remove)
        return
    for i in layers:
        remove = cache.get_seq_length(i) - length
        if remove > 0:
            cache.layers[i].crop(-remove)


def keep_positions(cache: Cache, keep: torch.Tensor) -> None:
    """Keep only the cache entries at positions `keep` (ascending), in every
    layer (in place where the layer can: `PreallocatedLayer.keep`)."""
    for layer in cache.layers:
        if callable(getattr(layer, "keep", None)):
            layer.keep(keep)
            continue
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if keys is None or values is None or keys.numel() == 0:
            continue
        idx = keep.to(keys.device)
        layer.keys = keys.index_select(-2, idx)
        layer.values = values.index_select(-2, idx)
