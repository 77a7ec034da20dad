"""`RustLinear`: an `nn.Linear` whose products over a few float32 rows on
the CPU run `_core.linear_f32` (see `kernels`, which switches layers to it
and sets their row range). Kept apart from `kernels` because it needs torch
at import; it imports nothing of `kernels`, so the two import one way."""

from __future__ import annotations

import torch

from specdec_rs import _core


class RustLinear(torch.nn.Linear):
    """`nn.Linear` whose forward over `min_rows` to `max_rows` float32 CPU
    rows without autograd runs `_core.linear_f32`; every other call is
    torch's. Both bounds are set per layer by `kernels.use_rust_linears`."""

    min_rows: int
    max_rows: int

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        size = x.numel()
        if (
            size < self.min_rows * self.in_features
            or size > self.max_rows * self.in_features
            or torch.is_grad_enabled()
            or x.dtype is not torch.float32
            or w.dtype is not torch.float32
            or x.device.type != "cpu"
            or w.device.type != "cpu"
            or not x.is_contiguous()
        ):
            return super().forward(x)
        rows = x.detach().reshape(-1, self.in_features)
        out = torch.empty((rows.shape[0], self.out_features), dtype=torch.float32)
        _core.linear_f32(rows.numpy(), w.detach().numpy(), out.numpy())
        if self.bias is not None:
            out += self.bias
        return out.view(*x.shape[:-1], self.out_features)
