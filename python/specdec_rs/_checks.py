"""Argument checks shared by every public function and constructor.

Each failure is a ValueError that says what, where, what was expected and
how to fix it. NumPy scalars are accepted wherever Python numbers are; bools
are never taken for numbers. A new parameter is checked by calling one of
these helpers, never by hand.
"""

from __future__ import annotations

import math
import numbers
import operator
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

U64_MAX = 2**64 - 1
MAX_THREADS = 256  # also enforced by the Rust core

# Allowed |row sum − 1| per element type: rounding of a softmax in that precision.
SUM_TOL_FLOAT64 = 1e-6
SUM_TOL_FLOAT32 = 1e-3
# bfloat16 keeps 8 significant bits: each entry is off by at most 2^-9 relative.
SUM_TOL_BFLOAT16 = 4e-3
# float16 keeps 11 bits (2^-11 relative) and flushes entries below 2^-25 to
# zero, so a row of V entries can lose up to V · 2^-25 of its mass.
FLOAT16_FLUSH = 2.0**-25

T = TypeVar("T")


def _type_name(value: Any) -> str:
    return type(value).__name__


def utf8_text(text: str, what: str) -> str:
    """`text`, which must encode as UTF-8: a lone surrogate (a JSON "\\ud800",
    or a command-line byte that is not UTF-8, which Python escapes as one)
    reaches no tokenizer."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        char = text[e.start]
        byte = char.encode("utf-8", "surrogateescape") if "\udc80" <= char <= "\udcff" else None
        escaped = f", the escaped byte {byte!r}" if byte is not None else ""
        raise ValueError(
            f"{what} is not UTF-8 text: character {e.start} is a lone surrogate "
            f"({char!r}{escaped}); fix or remove it"
        ) from None
    return text


def integer(value: Any, name: str, *, minimum: int = 0, maximum: int | None = None) -> int:
    """`value` as a Python int in [minimum, maximum] (Python or NumPy integers)."""
    if type(value) is int and value >= minimum and (maximum is None or value <= maximum):
        return value  # the common case, first
    if isinstance(value, bool | np.bool_):
        raise ValueError(f"{name} = {value!r} is a bool; expected an integer")
    if isinstance(value, float | np.floating):
        raise ValueError(f"{name} = {value!r} must be an integer; pass int({name})")
    try:
        out = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} = {value!r} ({_type_name(value)}) must be an integer") from None
    if out < minimum or (maximum is not None and out > maximum):
        upper = "" if maximum is None else f" and <= {maximum}"
        shown = out if abs(out) < 10**30 else f"{float(out):.3g}"
        raise ValueError(
            f"{name} = {shown} is out of range; expected an integer >= {minimum}{upper}"
        )
    return out


def optional_integer(
    value: Any, name: str, *, minimum: int = 0, maximum: int | None = None
) -> int | None:
    return None if value is None else integer(value, name, minimum=minimum, maximum=maximum)


def real(
    value: Any,
    name: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    below: float | None = None,
    hint: str = "",
) -> float:
    """`value` as a finite Python float (Python, NumPy or other real numbers),
    with inclusive bounds minimum/maximum and exclusive bounds above/below."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} = {value!r} ({_type_name(value)}) must be a real number{hint}")
    try:
        x = float(value)
    except (OverflowError, ValueError):
        raise ValueError(f"{name} = {value!r} is not representable as a float{hint}") from None
    bounds = []
    if minimum is not None:
        bounds.append(f">= {minimum:g}")
    if above is not None:
        bounds.append(f"> {above:g}")
    if maximum is not None:
        bounds.append(f"<= {maximum:g}")
    if below is not None:
        bounds.append(f"< {below:g}")
    ok = math.isfinite(x)
    ok = ok and (minimum is None or x >= minimum) and (above is None or x > above)
    ok = ok and (maximum is None or x <= maximum) and (below is None or x < below)
    if not ok:
        expected = "a finite number" + (" " + " and ".join(bounds) if bounds else "")
        raise ValueError(f"{name} = {value!r} is out of range; expected {expected}{hint}")
    return x


def optional_real(value: Any, name: str, **bounds: Any) -> float | None:
    return None if value is None else real(value, name, **bounds)


def boolean(value: Any, name: str) -> bool:
    """A Python or NumPy bool (not 0/1, not a string)."""
    if not isinstance(value, bool | np.bool_):
        raise ValueError(f"{name} = {value!r} ({_type_name(value)}) must be True or False")
    return bool(value)


def choice(value: Any, name: str, options: Iterable[str]) -> str:
    """One of `options` (exact string match)."""
    options = tuple(options)
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"{name} = {value!r}; expected one of {', '.join(map(repr, options))}")
    return value


def function(value: Any, name: str) -> Callable[..., Any]:
    if not callable(value):
        raise ValueError(f"{name} = {value!r} ({_type_name(value)}) must be callable")
    return value  # type: ignore[no-any-return]


def seed(value: Any, name: str = "seed") -> int:
    """A seed for the Rust streams: an int in [0, 2**64)."""
    return integer(value, name, minimum=0, maximum=U64_MAX)


def threads(value: Any) -> int | None:
    """None (rayon's pool, one thread per core) or a thread count in 1..MAX_THREADS.
    Results never depend on it."""
    return optional_integer(value, "threads", minimum=1, maximum=MAX_THREADS)


def rng(value: Any, name: str = "rng") -> np.random.Generator:
    if not isinstance(value, np.random.Generator):
        raise ValueError(
            f"{name} = {value!r} must be a numpy.random.Generator; pass np.random.default_rng(seed)"
        )
    return value


# ---- arrays -------------------------------------------------------------------------------


def is_torch_tensor(x: Any) -> bool:
    return type(x).__module__.split(".", 1)[0] == "torch" and hasattr(x, "dtype")


def _from_torch(x: Any, name: str) -> tuple[np.ndarray, float | None]:
    """A torch tensor as a NumPy array: CPU float32/float64/integer tensors are
    viewed without a copy; half precisions are widened to float32 (returned
    with their sum tolerance); tensors on another device are copied to the host."""
    import torch

    t = x.detach()
    if t.device.type == "meta":
        raise ValueError(f"{name} is a tensor on the meta device (it has no values)")
    if t.is_complex():
        raise ValueError(f"{name} has dtype {t.dtype}; expected real probabilities")
    tol = None
    if t.dtype in (torch.float16, torch.bfloat16):
        tol = SUM_TOL_BFLOAT16 if t.dtype == torch.bfloat16 else _float16_tol(t.shape)
        t = t.float()
    if t.device.type != "cpu":
        t = t.cpu()
    return t.resolve_conj().resolve_neg().numpy(), tol


def _float16_tol(shape: tuple[int, ...]) -> float:
    v = shape[-1] if len(shape) else 1
    return SUM_TOL_FLOAT32 + v * FLOAT16_FLUSH


def as_numpy(x: Any, name: str) -> np.ndarray:
    """A NumPy view of `x` (ndarray, torch tensor, or nested lists)."""
    return _as_numpy_tol(x, name)[0]


def _as_numpy_tol(x: Any, name: str) -> tuple[np.ndarray, float | None]:
    if isinstance(x, str | bytes):
        raise ValueError(f"{name} is a {_type_name(x)}; expected an array of numbers")
    if is_torch_tensor(x):
        return _from_torch(x, name)
    try:
        a = np.asarray(x)
    except (ValueError, TypeError, OverflowError) as e:
        raise ValueError(f"{name} cannot be read as an array: {e}") from None
    if a.dtype.byteorder not in ("=", "|") and a.dtype.byteorder != _NATIVE:
        a = a.astype(a.dtype.newbyteorder("="))  # big-endian input: one native copy
    return a, None


_NATIVE = "<" if np.little_endian else ">"


def sum_tolerance(dtype: np.dtype, vocab: int) -> float:
    """Allowed |row sum − 1| for rows stored in `dtype` (before any widening)."""
    if dtype == np.float16:
        return SUM_TOL_FLOAT32 + vocab * FLOAT16_FLUSH
    if dtype == np.float32:
        return SUM_TOL_FLOAT32
    return SUM_TOL_FLOAT64


def torch_sum_tolerance(dtype: Any, vocab: int) -> float:
    """`sum_tolerance` for a torch dtype."""
    import torch

    if dtype == torch.bfloat16:
        return SUM_TOL_BFLOAT16
    if dtype == torch.float16:
        return SUM_TOL_FLOAT32 + vocab * FLOAT16_FLUSH
    return SUM_TOL_FLOAT64 if dtype == torch.float64 else SUM_TOL_FLOAT32


def prob_array(x: Any, name: str, ndim: int) -> tuple[np.ndarray, float]:
    """A C-contiguous float32/float64 array with `ndim` dimensions and the
    tolerance of its row sums. No copy when `x` already is one (a CPU torch
    tensor is viewed, not copied); integers become float64 (exact); float16
    and bfloat16 are widened to float32 and keep their own, wider tolerance."""
    if (
        type(x) is np.ndarray
        and x.ndim == ndim
        and x.dtype.char in "fd"
        and x.dtype.isnative
        and x.flags.c_contiguous
    ):  # the common case, first: read in place
        return x, SUM_TOL_FLOAT32 if x.dtype.char == "f" else SUM_TOL_FLOAT64
    a, tol = _as_numpy_tol(x, name)
    if a.dtype == np.float16:
        tol = sum_tolerance(a.dtype, a.shape[-1] if a.ndim else 1)
        a = a.astype(np.float32)  # exact; the Rust kernels read f32 and f64
    elif a.dtype not in (np.float32, np.float64):
        if a.dtype.kind in "iu" or (a.size == 0 and a.dtype.kind in "fO"):
            a = a.astype(np.float64)  # lossless (or an empty list)
        else:
            raise ValueError(
                f"{name} has dtype {a.dtype}; expected float32 or float64 probabilities"
            )
    if a.ndim != ndim:
        raise ValueError(f"{name} has shape {a.shape}; expected {ndim} dimensions")
    if tol is None:
        tol = sum_tolerance(a.dtype, a.shape[-1])
    return (a if a.flags.c_contiguous else np.ascontiguousarray(a)), tol


def distribution(x: Any, name: str) -> np.ndarray:
    """A probability vector (V,), V >= 1, as float64: finite, >= 0, sum 1 within
    its precision's tolerance."""
    if type(x) is np.ndarray and x.dtype == np.float64 and x.ndim == 1 and x.size:
        # the common case first (a NaN makes the sum NaN); small rows as lists: faster
        values = x.tolist() if x.size <= 256 else x
        total, low = float(sum(values) if x.size <= 256 else x.sum()), float(min(values))
        if math.isfinite(total) and low >= 0 and abs(total - 1.0) <= SUM_TOL_FLOAT64:
            return x
    a, tol = prob_array(x, name, 1)
    if a.size == 0:
        raise ValueError(f"{name} is empty; expected a probability vector with V >= 1 entries")
    out = a.astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(out))
    if len(bad):
        raise ValueError(
            f"{name} has a non-finite value at index {bad[0]}; expected probabilities in [0, 1]"
        )
    neg = np.flatnonzero(out < 0)
    if len(neg):
        raise ValueError(
            f"{name} has a negative probability {out[neg[0]]:.6g} at index {neg[0]}; "
            "pass softmax(logits), not logits"
        )
    total = float(out.sum())
    if abs(total - 1.0) > tol:
        raise ValueError(
            f"{name} sums to {total:.6f} (expected 1 ± {tol:.0e}); pass softmax(logits), "
            "or divide by the sum"
        )
    return out


def token_array(x: Any, name: str, ndim: int) -> npt.NDArray[np.int64]:
    """A C-contiguous int64 array of token ids with `ndim` dimensions."""
    if type(x) is np.ndarray and x.dtype == np.int64 and x.ndim == ndim and x.flags.c_contiguous:
        return x
    a = as_numpy(x, name)
    if a.size == 0 and a.dtype.kind in "fO":
        a = a.astype(np.int64)  # an empty list
    if a.dtype.kind not in "iu":
        raise ValueError(f"{name} has dtype {a.dtype}; expected integer token ids")
    if a.ndim != ndim:
        raise ValueError(f"{name} has shape {a.shape}; expected {ndim} dimensions")
    if a.dtype.kind == "u" and a.size and int(a.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"{name} holds {int(a.max())}, which is not a token id")
    return np.ascontiguousarray(a, dtype=np.int64)


def integers(values: Any, name: str, *, minimum: int = 0) -> list[int]:
    """A list of integers from an int-like or an iterable of them (not a string)."""
    if isinstance(values, str | bytes):
        raise ValueError(f"{name} = {values!r} is a string; expected integers, e.g. [2, 3]")
    try:
        items = list(values)
    except TypeError:
        return [integer(values, name, minimum=minimum)]
    return [integer(v, f"{name}[{i}]", minimum=minimum) for i, v in enumerate(items)]


def reals(values: Any, name: str, **bounds: Any) -> list[float]:
    """A list of finite reals from a sequence, 1-D array or tensor."""
    try:
        if isinstance(values, str | bytes | dict):
            raise TypeError
        items = list(values)
    except TypeError:
        raise ValueError(
            f"{name} = {values!r} ({_type_name(values)}) must be a sequence of numbers"
        ) from None
    return [real(v, f"{name}[{i}]", **bounds) for i, v in enumerate(items)]


# ---- files --------------------------------------------------------------------------------


def writable_dir(path: Any, name: str, *, hint: str = "; choose another folder") -> Path:
    """A folder that exists (created with its parents if needed) and can be written to."""
    p = Path(os.fspath(path)).expanduser()
    blocker = next((a for a in (p, *p.parents) if a.exists() and not a.is_dir()), None)
    if blocker is not None:
        raise ValueError(f"{name} = {str(p)!r}: {str(blocker)!r} is a file, not a folder{hint}")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{name} = {str(p)!r} cannot be created ({e.strerror}){hint}") from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise ValueError(f"{name} = {str(p)!r} is not writable{hint}")
    return p


def output_file(path: Any, name: str) -> Path:
    """A file path whose folder exists and is writable (checked before any work)."""
    if not isinstance(path, str | os.PathLike) or not os.fspath(path):
        raise ValueError(f"{name} = {path!r}; pass a file name")
    p = Path(os.fspath(path)).expanduser()
    if p.is_dir():
        raise ValueError(f"{name} = {str(p)!r} is a folder; expected a file name")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise ValueError(f"{name} = {str(p)!r}: the folder {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{name} = {str(p)!r}: the folder {str(parent)!r} is not writable")
    return p
