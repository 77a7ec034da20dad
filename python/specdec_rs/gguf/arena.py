"""A GGUF model's packed weights gathered into one buffer on 2 MiB pages.

A forward streams every weight from memory once. On 4 KiB pages that is a
page-table walk per 4 KiB (SmolLM2: about 24,000 per forward, more than the
TLB holds) and a hardware prefetcher that stops at each page's end; on
transparent huge pages it is one walk per 2 MiB. Linux gives huge pages only
to 2 MiB-aligned ranges of a mapping advised `MADV_HUGEPAGE` (NumPy advises
its large arrays), so the weights, each a separate allocation of a few
hundred KiB, are copied end to end into one such buffer, starting at a 2 MiB
boundary, in the order a forward reads them. Their bytes are unchanged, so
every product gives the same bits; only where they live moves.

Measured on SmolLM2's shapes streamed by the q8 products (Intel Xeon, 2
threads): 0.85-0.89x the time of the same bytes on 4 KiB pages
(BENCHMARKS.md). `SPECDEC_HUGE_PAGES=0` keeps each weight where it was
loaded. Where the kernel has no transparent huge pages, the buffer is
ordinary memory and nothing else changes.
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Any

import numpy as np

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14
ALIGN = 64  # each weight starts on a cache line
OPT_OUT = "SPECDEC_HUGE_PAGES"


def gather_weights(model: Any) -> int:
    """Move every packed weight of `model` (each `QuantLinear`'s `packed`,
    a weight shared by several modules once) into one 2 MiB-aligned buffer
    advised for huge pages, in module order, and refresh the fused layers'
    weight lists. Returns the bytes moved (0 when `$SPECDEC_HUGE_PAGES` is
    0 or the model has no packed weight)."""
    from specdec_rs.gguf.layer import FusedLlamaLayer
    from specdec_rs.gguf.modules import QuantLinear

    if os.environ.get(OPT_OUT, "1") == "0":
        return 0
    holders: dict[int, list[QuantLinear]] = {}  # id of a packed array -> its modules
    for module in model.modules():
        if isinstance(module, QuantLinear):
            holders.setdefault(id(module.packed), []).append(module)
    if not holders:
        return 0
    sizes = [-(-mods[0].packed.nbytes // ALIGN) * ALIGN for mods in holders.values()]
    total = sum(sizes)
    arena = _aligned(total)
    layers = [m for m in model.modules() if isinstance(m, FusedLlamaLayer)]
    for layer in layers:
        layer._weights = []  # drop their references: each old array is freed once moved
    at = 0
    for modules, size in zip(holders.values(), sizes, strict=True):
        old = modules[0].packed
        view = arena[at : at + old.nbytes]
        view[:] = old
        view.flags.writeable = False
        for module in modules:
            module.packed = view
        at += size
    for layer in layers:
        layer._weights = layer._native_weights()
    return total


def _aligned(nbytes: int) -> np.ndarray:
    """An uninitialised uint8 buffer of `nbytes` starting at a 2 MiB
    boundary, its range advised `MADV_HUGEPAGE` (before any page of it is
    touched, so the first touch can fault in a huge page)."""
    pages = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
    raw = np.empty(pages + HUGE_PAGE, np.uint8)
    start = -raw.ctypes.data % HUGE_PAGE
    _advise_huge(raw.ctypes.data + start, pages)
    return raw[start : start + nbytes]


def _advise_huge(address: int, length: int) -> bool:
    """madvise(MADV_HUGEPAGE) over [address, address + length); a hint:
    False where it is not supported (not Linux, no transparent huge pages)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return False
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return bool(madvise(address, length, MADV_HUGEPAGE) == 0)
