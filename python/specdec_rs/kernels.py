"""Rust products for a model's linear layers on the CPU, for forwards over a
few positions.

A verification forward over k + 1 positions multiplies a few rows
x (n, in) by every weight W (out, in) of the model. On a CPU that is bound by
reading W, yet the BLAS behind torch packs W for each product with n ≥ 2 and
takes nearly n times as long as for one row: on the 2-core host of
BENCHMARKS.md a SmolLM2 forward over 2 positions cost 1.6–1.8 single steps.
`_core.linear_f32` reads each panel of W once for all n rows
(`rust/linear.rs`), which brings that to about 1.2.

`use_rust_linears(model)` switches the model's `nn.Linear` layers to
`RustLinear`, which takes the Rust path when no gradient is recorded, the
input is float32 on the CPU and it has MIN_ROWS to `max_rows` rows, and
torch's path otherwise: one row (torch's two-thread product is as fast
there), prefill, training, other dtypes and devices. Within the Rust path
each output entry is summed in one fixed order, so a position's values do
not depend on how many positions share the product.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specdec_rs import _checks, _core

# Rows for which the Rust product beat torch's in a SmolLM2 forward on the
# 2-core host (BENCHMARKS.md, "Linear layers"): from 2 to 4; for one row and
# from 5 on, torch's was as fast. A weight of LARGE_WEIGHT entries or more
# (an LM head) is read so slowly that the Rust product wins up to 8 rows.
MIN_ROWS = 2
MAX_ROWS = 4
LARGE_WEIGHT = 1 << 22
LARGE_MAX_ROWS = 8
# The kernel runs on the calling thread; with more torch threads than this,
# torch's multithreaded products can read the weights faster than one core.
MAX_TORCH_THREADS = 2
LINEAR_CHOICES = ("auto", "rust", "torch")


def rust_available() -> bool:
    """Whether this CPU runs the Rust product on its AVX2 + FMA path."""
    return bool(_core.linear_vectorized())


def linear(x: Any, w: Any) -> np.ndarray:
    """x · wᵀ in float32 with the Rust product: `x` (n, k), `w` (m, k) →
    (n, m). Each entry is summed in one fixed order (`rust/linear.rs`), so a
    row gives the same bits alone or among others. Checked: 2-D float32
    arrays with matching k (copied to C order when they are not)."""
    arrays = []
    for name, a in (("x", x), ("w", w)):
        if not isinstance(a, np.ndarray) or a.ndim != 2:
            raise ValueError(
                f"{name} must be a 2-D NumPy array; got {type(a).__name__} "
                f"{getattr(a, 'shape', '')}"
            )
        if a.dtype != np.float32:
            raise ValueError(
                f"{name} is {a.dtype}; expected float32 (pass {name}.astype(np.float32))"
            )
        arrays.append(np.ascontiguousarray(a))
    xs, ws = arrays
    if xs.shape[1] != ws.shape[1]:
        raise ValueError(
            f"x is {xs.shape} and w {ws.shape}; expected x (n, k) and w (m, k) with the same k"
        )
    out = np.empty((xs.shape[0], ws.shape[0]), np.float32)
    _core.linear_f32(xs, ws, out)
    return out


def rust_linear_class() -> type:
    """The `nn.Linear` subclass `use_rust_linears` switches layers to
    (`specdec_rs._rust_linear.RustLinear`, a module-level class, so switched
    models pickle; imported here lazily, as torch is)."""
    from specdec_rs._rust_linear import RustLinear

    return RustLinear


def use_rust_linears(model: Any, *, max_rows: int = MAX_ROWS) -> int:
    """Switch every plain `nn.Linear` of `model` with float32 CPU weights to
    `RustLinear` (in place; parameters and state dict unchanged), taking the
    Rust path up to `max_rows` rows (LARGE_MAX_ROWS for a weight of
    LARGE_WEIGHT entries or more, if that is more). Returns how many were
    switched: 0 on a CPU without AVX2 and FMA, where the portable Rust path
    would be slower than torch."""
    import torch

    max_rows = _checks.integer(max_rows, "max_rows", minimum=MIN_ROWS, maximum=64)
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model is a {type(model).__name__}; expected a torch.nn.Module")
    if not rust_available():
        return 0
    cls = rust_linear_class()
    switched = 0
    for module in model.modules():
        if type(module) in (torch.nn.Linear, cls) and module.weight.dtype is torch.float32:
            if module.weight.device.type == "cpu":
                module.__class__ = cls
                big = module.weight.numel() >= LARGE_WEIGHT
                rows = max(max_rows, LARGE_MAX_ROWS) if big else max_rows
                setattr(module, "min_rows", MIN_ROWS)  # noqa: B010 - attributes of RustLinear
                setattr(module, "max_rows", rows)  # noqa: B010
                switched += 1
    return switched


def use_torch_linears(model: Any) -> int:
    """Undo `use_rust_linears`: every `RustLinear` of `model` becomes a plain
    `nn.Linear` again. Returns how many were switched back."""
    import torch

    cls = rust_linear_class()
    switched = 0
    for module in model.modules():
        if type(module) is cls:
            module.__class__ = torch.nn.Linear
            switched += 1
    return switched


def check_linear_choice(choice: Any) -> str:
    if choice not in LINEAR_CHOICES:
        raise ValueError(f"linear = {choice!r}; expected one of {', '.join(LINEAR_CHOICES)}")
    return str(choice)


def apply_linear_choice(model: Any, choice: str) -> int:
    """`choice` "rust", "torch" or "auto" (Rust for float32 CPU weights while
    torch uses at most MAX_TORCH_THREADS threads, where it was measured to
    win). Returns how many layers run the Rust product."""
    import torch

    check_linear_choice(choice)
    if choice == "torch" or (choice == "auto" and torch.get_num_threads() > MAX_TORCH_THREADS):
        use_torch_linears(model)
        return 0
    return use_rust_linears(model)


def rust_rows(model: Any) -> int | None:
    """`max_rows` of `model`'s first `RustLinear`; None if it has none."""
    cls = rust_linear_class()
    for module in model.modules():
        if type(module) is cls:
            return int(getattr(module, "max_rows"))  # noqa: B009
    return None


def follow(model: Any, like: Any) -> int:
    """Give `model`'s linear layers the product `like`'s have (a drafter's
    head follows its target). Returns how many run the Rust product."""
    rows = rust_rows(like)
    if rows is not None:
        return use_rust_linears(model, max_rows=rows)
    use_torch_linears(model)
    return 0
