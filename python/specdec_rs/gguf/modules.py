"""torch modules over weights kept at a GGUF file's precision.

`QuantLinear` is `nn.Linear` without a bias whose weight W (out, in) stays
in the file's format (`rust/quant.rs`: F32, F16, BF16, Q8_0, Q4_0, Q4_1,
Q5_0, Q5_1, IQ4_NL, Q4_K, Q5_K, Q6_K):
y = x · dequant(W)ᵀ, every output summed in one fixed order whatever the
number of rows, so a position's values are the same bits alone or inside a
verification batch. `activations` picks the function: "f32" (float32
activations, the reference) or "q8" (each 32-block of x quantized as
ggml's q8_0/q8_1, exact integer block products, llama.cpp's arithmetic;
float formats stay float32). `QuantEmbedding` looks rows of such a table
up, dequantized exactly as gguf-py does.

Both expose `dequantize_rows(rows)` (the float32 rows of W) where a float
module exposes `weight`; `models.weight_rows` reads either.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch
from torch import nn

from specdec_rs import _core

NATIVE_TYPES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    6: "Q5_0",
    7: "Q5_1",
    8: "Q8_0",
    12: "Q4_K",
    13: "Q5_K",
    14: "Q6_K",
    20: "IQ4_NL",
    30: "BF16",
}
ACTIVATIONS = ("f32", "q8")
# the keys and values a GGUF model caches (`model.set_cache_type`)
CACHE_TYPES = ("f32", "f16", "q8_0")


class _Product(torch.autograd.Function):
    """x · dequant(W)ᵀ with the gradient of x (W is frozen): for training a
    head on a GGUF target's LM-head rows."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, module: QuantLinear) -> torch.Tensor:
        ctx.module = module
        return module.product(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        w = ctx.module.dequantize_rows(torch.arange(ctx.module.out_features))
        return grad @ w, None


class QuantLinear(nn.Module):
    """x (..., in_features) -> (..., out_features) float32. The weight's
    bytes are held in the kernel's packed layout (`_core.pack_weight`:
    panels of 8 rows, the file's bytes rearranged, none converted);
    `ggml_type` is its format. `threads`: how many threads the product
    runs on (chosen by measurement at load); `activations`: "f32" or "q8"
    (see the module docs); `softcap` c: outputs soft-capped, c·tanh(y/c)
    (Gemma 2's LM head; 0: none)."""

    def __init__(self, packed: np.ndarray, ggml_type: int, in_features: int, out_features: int):
        super().__init__()
        if ggml_type not in NATIVE_TYPES:
            raise ValueError(
                f"ggml type {ggml_type} has no native kernel; expected one of {NATIVE_TYPES}"
            )
        if packed.dtype != np.uint8 or packed.ndim != 1:
            raise ValueError(
                f"QuantLinear takes packed uint8 bytes; got {packed.dtype} {packed.shape}"
            )
        self.packed = packed
        self.ggml_type = ggml_type
        self.in_features = in_features
        self.out_features = out_features
        self.threads = 1
        self.activations = "f32"
        self.softcap = 0.0

    @classmethod
    def from_rows(cls, rows: np.ndarray, ggml_type: int, in_features: int) -> QuantLinear:
        """From row-major bytes (out_features, row bytes), as a GGUF file holds them."""
        packed = _core.pack_weight(np.ascontiguousarray(rows), ggml_type, in_features)
        return cls(packed, ggml_type, in_features, rows.shape[0])

    @property
    def type_name(self) -> str:
        return NATIVE_TYPES[self.ggml_type]

    @property
    def nbytes(self) -> int:
        return int(self.packed.nbytes)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.type_name}"

    def product(self, rows: torch.Tensor) -> torch.Tensor:
        """rows (n, in) float32 CPU -> (n, out), by the Rust kernel."""
        x = rows.detach()
        if x.dtype is not torch.float32:
            x = x.float()
        x = x.contiguous()
        out = torch.empty((x.shape[0], self.out_features), dtype=torch.float32)
        _core.qlinear(
            x.numpy(),
            self.packed,
            self.ggml_type,
            self.out_features,
            out.numpy(),
            self.threads,
            activations=self.activations,
        )
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu":
            raise ValueError(
                f"a GGUF weight runs on the CPU; the input is on {x.device} (load the model with "
                "weights='float32' for another device)"
            )
        rows = x.reshape(-1, self.in_features)
        if torch.is_grad_enabled() and rows.requires_grad:
            out: torch.Tensor = _Product.apply(rows, self)
        else:
            out = self.product(rows)
        if self.softcap:
            out = torch.tanh(out / self.softcap) * self.softcap
        return out.view(*x.shape[:-1], self.out_features)

    def dense(self, rows: torch.Tensor) -> torch.Tensor:
        """rows (n, in) float32 CPU -> (n, out), by torch's float32 matrix
        product on the whole weight dequantized (exactly) and transposed
        (in, out) into this thread's scratch buffer: for many rows (a
        prompt's prefill) several times faster than `product` with float32
        activations. Its sums run in the BLAS's order, which depends on n,
        so only a step that every path runs alike (the prefill of an empty
        cache, with float32 activations) may use it; decode and
        verification steps use `product`."""
        weight = _scratch(self.out_features * self.in_features)
        weight = weight.reshape(self.in_features, self.out_features)
        _core.dequantize_transposed(
            self.packed,
            self.ggml_type,
            self.in_features,
            self.out_features,
            weight,
            1,  # the calling thread: a spinning kernel worker would slow torch's threads
        )
        x = rows.detach().float()
        return x @ torch.from_numpy(weight)

    def _rows(self, rows: torch.Tensor) -> np.ndarray:
        idx: np.ndarray = torch.as_tensor(rows).reshape(-1).cpu().numpy()
        return np.ascontiguousarray(idx, dtype=np.int64)

    def dequantize_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """The float32 rows `rows` (r,) of the weight, (r, in_features)."""
        idx = self._rows(rows)
        out = np.empty((len(idx), self.in_features), np.float32)
        _core.dequantize_rows(
            self.packed, self.ggml_type, self.in_features, self.out_features, idx, out
        )
        return torch.from_numpy(out)

    def print_weights(self) -> dict[str, tuple[int, int, Any, Any]]:
        """The weight as `identity.weight_samples` reads it."""
        return {
            "weight": (
                self.out_features,
                self.in_features,
                self.dequantize_rows,
                (id(self.packed), 0),
            )
        }

    def select_rows(self, rows: torch.Tensor) -> QuantLinear:
        """A QuantLinear of the rows `rows` of this weight (their bytes
        copied): a head's draft-vocabulary rows of the LM head."""
        idx = self._rows(rows)
        raw = _core.unpack_rows(
            self.packed, self.ggml_type, self.in_features, self.out_features, idx
        )
        part = QuantLinear.from_rows(raw, self.ggml_type, self.in_features)
        part.threads, part.activations, part.softcap = self.threads, self.activations, self.softcap
        return part


_SCRATCH = threading.local()


def _scratch(size: int) -> np.ndarray:
    """A float32 buffer of `size` values, this thread's, reused (grown when
    too small): a fresh one per product would fault its pages in each time."""
    buffer: np.ndarray | None = getattr(_SCRATCH, "buffer", None)
    if buffer is None or buffer.size < size:
        buffer = _SCRATCH.buffer = np.empty(size, np.float32)
    return buffer[:size]


class QuantEmbedding(nn.Module):
    """ids (...) -> (..., dim) float32: rows of a table (num, dim) kept in
    the file's format, dequantized on lookup, times `scale` (float32;
    Gemma's √dim, else 1)."""

    def __init__(self, table: QuantLinear, scale: float = 1.0):
        super().__init__()
        self.table = table
        self.num_embeddings, self.embedding_dim = table.out_features, table.in_features
        self.scale = float(np.float32(scale))

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.table.type_name}"

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = self.table.dequantize_rows(ids)
        if self.scale != 1.0:
            out = out * torch.tensor(self.scale, dtype=torch.float32)
        return out.view(*ids.shape, self.embedding_dim).to(ids.device)

    def dequantize_rows(self, rows: torch.Tensor) -> torch.Tensor:
        return self.table.dequantize_rows(rows)

    def print_weights(self) -> dict[str, tuple[int, int, Any, Any]]:
        """The table as `identity.weight_samples` reads it (tied to the LM head
        when the head is the same table)."""
        return self.table.print_weights()
