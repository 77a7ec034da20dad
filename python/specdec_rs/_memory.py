"""Resident memory a CPU run does not need.

PyPI's torch is the CUDA build: importing it maps cuBLAS, NVRTC, nvJitLink
and the other GPU libraries, and the pages the loader touched stay resident
(about 150 MiB on the project's hosts, of the 526 MiB `import torch` takes).
A run on the CPU never reads them again.
"""

from __future__ import annotations

import ctypes
import os
import sys

MADV_PAGEOUT = 21  # Linux 5.4+: reclaim these pages now (data is never discarded)
OPT_OUT = "SPECDEC_KEEP_GPU_LIBRARIES"


def is_gpu_library(path: str) -> bool:
    """A GPU library torch's CUDA build maps: pip's nvidia-* packages, libtorch_cuda."""
    name = os.path.basename(path)
    return f"{os.sep}nvidia{os.sep}" in path or name.startswith(("libtorch_cuda", "libc10_cuda"))


def release_gpu_libraries() -> int:
    """Ask the kernel to reclaim the resident pages of the GPU libraries
    mapped into this process (madvise MADV_PAGEOUT over each mapping), when
    torch has not initialized CUDA. Clean pages go back to the page cache
    and are read again from the files if a GPU is used later; dirty ones
    stay (nothing is discarded), so behaviour is unchanged. Pages another
    process maps too (a second torch process on the same files) stay
    resident. Returns how many
    mappings were advised: 0 off Linux, before kernel 5.4 (EINVAL), with
    CUDA in use, or with $SPECDEC_KEEP_GPU_LIBRARIES set."""
    if not sys.platform.startswith("linux") or os.environ.get(OPT_OUT):
        return 0
    import torch

    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        return 0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
        with open("/proc/self/maps", encoding="utf-8") as maps:
            lines = maps.read().splitlines()
    except (OSError, AttributeError):
        return 0
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    advised = 0
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) < 6 or not is_gpu_library(parts[5]):
            continue
        start, end = (int(x, 16) for x in parts[0].split("-"))
        if madvise(start, end - start, MADV_PAGEOUT) != 0:
            return advised  # not supported here: nothing more to do
        advised += 1
    return advised
