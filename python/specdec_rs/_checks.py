"""Argument checks shared by the public functions: each failure is a ValueError
that says what, where, what was expected and how to fix it."""

from __future__ import annotations

import operator
from typing import Any

import numpy as np
import numpy.typing as npt

U64_MAX = 2**64 - 1


def integer(value: Any, name: str, *, minimum: int = 0, maximum: int | None = None) -> int:
    """`value` as a Python int in [minimum, maximum]."""
    if isinstance(value, bool | float | np.floating):
        raise ValueError(f"{name} = {value!r} must be an integer; pass int({name})")
    try:
        out = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} = {value!r} must be an integer") from None
    if out < minimum or (maximum is not None and out > maximum):
        upper = "" if maximum is None else f" and <= {maximum}"
        raise ValueError(f"{name} = {out} is out of range; expected an integer >= {minimum}{upper}")
    return out


def seed(value: Any, name: str = "seed") -> int:
    """A seed for the Rust streams: an int in [0, 2**64)."""
    return integer(value, name, minimum=0, maximum=U64_MAX)


def threads(value: Any) -> int | None:
    """None (rayon's pool, one thread per core) or a thread count >= 1."""
    return None if value is None else integer(value, "threads", minimum=1, maximum=4096)


def _from_torch(x: Any, name: str) -> Any:
    """A CPU torch tensor as a NumPy array sharing its memory."""
    if x.device.type != "cpu":
        raise ValueError(f"{name} is a torch tensor on {x.device}; move it to the CPU with .cpu()")
    if x.is_floating_point() and x.dtype.itemsize < 4:
        raise ValueError(
            f"{name} has dtype {x.dtype}; expected float32 or float64; cast with .float()"
        )
    return x.detach().resolve_conj().resolve_neg().numpy()


def as_numpy(x: Any, name: str) -> np.ndarray:
    """A NumPy view of `x` (ndarray, CPU torch tensor, or nested lists)."""
    if type(x).__module__.split(".", 1)[0] == "torch":
        x = _from_torch(x, name)
    try:
        return np.asarray(x)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{name} cannot be read as an array: {e}") from None


def prob_array(x: Any, name: str, ndim: int) -> np.ndarray:
    """A C-contiguous float32/float64 array with `ndim` dimensions; no copy when
    `x` already is one (a CPU torch tensor is viewed, not copied)."""
    a = as_numpy(x, name)
    if a.dtype not in (np.float32, np.float64):
        if a.dtype.kind in "iu" or a.dtype == np.float16:
            a = a.astype(np.float64)  # lossless; float16 has no Rust kernel
        else:
            raise ValueError(
                f"{name} has dtype {a.dtype}; expected float32 or float64 probabilities"
            )
    if a.ndim != ndim:
        raise ValueError(f"{name} has shape {a.shape}; expected {ndim} dimensions")
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def token_array(x: Any, name: str, ndim: int) -> npt.NDArray[np.int64]:
    """A C-contiguous int64 array of token ids with `ndim` dimensions."""
    a = as_numpy(x, name)
    if a.size == 0 and a.dtype.kind == "f":
        a = a.astype(np.int64)  # an empty list
    if a.dtype.kind not in "iu":
        raise ValueError(f"{name} has dtype {a.dtype}; expected integer token ids")
    if a.ndim != ndim:
        raise ValueError(f"{name} has shape {a.shape}; expected {ndim} dimensions")
    if a.dtype.kind == "u" and a.size and int(a.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"{name} holds {int(a.max())}, which is not a token id")
    return np.ascontiguousarray(a, dtype=np.int64)
