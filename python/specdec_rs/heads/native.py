"""The trained heads' decoding on the project's Rust kernels. p = target, q = draft.

`NativeEagleStep`: the EAGLE head's step, its fc one `QuantLinear` and its
decoder layer one `_core.llama_layer` call (the target's own layer kernel:
`gguf.layer.FusedLlamaLayer`), instead of about thirty torch operations on
one thread. `NativeMedusaLogits`: the Medusa heads' residual blocks, one
`QuantLinear` each, then the draft vocabulary's rows.

The weights keep their values: BF16 where every value of the head is a
bfloat16 (the saved heads are), else F32. So this step computes the
torch head's function (`EagleHead.step_into`), in another summation
order: the same features to float32 rounding, the same cache layout
(rotated keys and values (1, kv_heads, positions, head_dim) in a
`kv_cache.PreallocatedLayer`). Exactness never rests on it: q is whatever
the step computes, and the verifier reads that q.

On SmolLM2's shipped head (2 threads) a draft step's cost ratio c fell
from about 0.21 to 0.09-0.13 (BENCHMARKS.md, "What a draft step costs").
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from specdec_rs.heads.layer import rope_tables
from specdec_rs.runner.stack import RotaryTable

if TYPE_CHECKING:
    from specdec_rs.gguf.layer import FusedLlamaLayer
    from specdec_rs.gguf.modules import QuantLinear
    from specdec_rs.heads.eagle import EagleHead
    from specdec_rs.heads.medusa import MedusaHeads
    from specdec_rs.kv_cache import PreallocatedLayer

F32, BF16 = 0, 30  # ggml types
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def weight_type(weights: list[torch.Tensor]) -> int:
    """BF16 when every value of `weights` is a bfloat16 (then it is the
    same weight in half the bytes), else F32."""
    exact = all(bool(torch.equal(w, w.to(torch.bfloat16).float())) for w in weights)
    return BF16 if exact else F32


def kernel_threads(head: EagleHead | MedusaHeads) -> int:
    """The threads a head's products run on: its vocabulary rows' (a GGUF
    target's kernel threads), else torch's."""
    return int(getattr(head.vocab_rows, "threads", None) or torch.get_num_threads())


def on_kernels(weight: torch.Tensor) -> bool:
    """Whether a head with this weight can run on the kernels (a float32 CPU head)."""
    return weight.device.type == "cpu" and weight.dtype == torch.float32


def quant_linear(weight: torch.Tensor, ggml_type: int, threads: int) -> QuantLinear:
    """`weight` (out, in) float32 as a QuantLinear of type F32 or BF16 (its
    values unchanged), run on `threads` threads."""
    from specdec_rs.gguf.modules import QuantLinear

    w = weight.detach().float().contiguous()
    if ggml_type == BF16:
        w = w.to(torch.bfloat16)
    rows = w.view(torch.uint8).numpy().reshape(w.shape[0], -1)
    module = QuantLinear.from_rows(np.ascontiguousarray(rows), ggml_type, int(w.shape[1]))
    module.threads = threads
    return module


class NativeEagleStep:
    """`EagleHead.step_into` (B = 1) as an fc product and one Rust layer
    call. Built from the head's weights as they are now: a head trained
    further needs a new step (`of`)."""

    def __init__(self, head: EagleHead, threads: int):
        from specdec_rs.gguf.layer import FusedLlamaLayer

        layer, s = head.layer, head.shape
        kind = weight_type([head.fc.weight, *(getattr(layer, n).weight for n in LINEARS)])
        self.ggml_type = kind
        self.embed = head.embed
        self.fc = quant_linear(head.fc.weight, kind, threads)
        config = types.SimpleNamespace(
            num_attention_heads=s.heads,
            num_key_value_heads=s.kv_heads,
            head_dim=s.head_dim,
            rms_norm_eps=s.eps,
        )
        parts = {n: quant_linear(getattr(layer, n).weight, kind, threads) for n in LINEARS}
        norms = (layer.input_norm.weight, layer.post_norm.weight)
        self.layer: FusedLlamaLayer = FusedLlamaLayer(
            config, 0, parts, *(w.detach().float().clone() for w in norms)
        )
        self.head_dim, self.theta = s.head_dim, s.rope_theta
        # the rotary rows by position (`runner.stack.RotaryTable`, grown as needed)
        self.rotary = RotaryTable(self._rotary)

    @classmethod
    def of(cls, head: EagleHead) -> NativeEagleStep | None:
        """The native step of `head`, or None where the head does not run on
        the kernels (not on the CPU, or not float32: its torch step stays).
        Threads: `kernel_threads`."""
        return cls(head, kernel_threads(head)) if on_kernels(head.fc.weight) else None

    @property
    def nbytes(self) -> int:
        """Bytes of weights one step reads (the fc and the layer's products)."""
        layer = self.layer
        products = [self.fc, *layer.qkv, layer.o_proj, *layer.gate_up, layer.down_proj]
        return sum(p.nbytes for p in products)

    def __call__(
        self,
        features: torch.Tensor,
        next_tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: PreallocatedLayer,
        at: int,
    ) -> torch.Tensor:
        """features (1, L, H), next_tokens (1, L) at `positions` (1, L), after
        the first `at` entries of `cache` (entries past it dropped, the L new
        ones written at at..at + L) -> f̂ (1, L, H)."""
        cache.rewind(at, "forward_into")
        e = self.embed(next_tokens[0]).float()
        x: torch.Tensor = self.fc(torch.cat([features[0].float(), e], -1)).contiguous()
        cos, sin = self.rotary.rows(positions[0].numpy())
        self.layer.forward_rows(x.numpy(), cos, sin, [cache], [len(x)])
        return x[None]

    def _rotary(self, probe: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The head's `rope_tables` as a rotary module gives them: cos, sin
        (1, P, head_dim) at `positions` (1, P) (`probe`: its dtype)."""
        tables = rope_tables(positions, self.head_dim, self.theta, probe.dtype)
        return tuple(t[:, 0] for t in tables)


def linears_of(heads: MedusaHeads) -> list[nn.Linear]:
    """The heads' residual blocks' linear layers A_i, b_i."""
    return [block for block in heads.blocks if isinstance(block, nn.Linear)]


class NativeMedusaLogits:
    """`MedusaHeads.logits` (f (..., H) -> (..., m', N)) with each residual
    block f + SiLU(A_i f + b_i) one QuantLinear product (A_i at its own
    values: BF16 where they all are bfloat16s, else F32; b_i added after),
    then the draft vocabulary's rows, as the torch heads do. Built from the
    heads' weights as they are now."""

    def __init__(self, heads: MedusaHeads, threads: int):
        linears = linears_of(heads)
        kind = weight_type([block.weight for block in linears])
        self.ggml_type = kind
        self.blocks = [quant_linear(block.weight, kind, threads) for block in linears]
        self.biases = [block.bias.detach().float().clone() for block in linears]
        self.vocab_rows = heads.vocab_rows
        self.num_heads = len(self.blocks)

    @classmethod
    def of(cls, heads: MedusaHeads) -> NativeMedusaLogits | None:
        """The native logits of `heads`, or None where they stay in torch (`on_kernels`)."""
        first = linears_of(heads)[0].weight
        return cls(heads, kernel_threads(heads)) if on_kernels(first) else None

    def __call__(self, f: torch.Tensor, heads: int | None = None) -> torch.Tensor:
        from torch.nn import functional as F

        flat = f.reshape(-1, f.shape[-1]).float()
        count = heads or self.num_heads
        features = [flat + F.silu(self.blocks[i](flat) + self.biases[i]) for i in range(count)]
        out: torch.Tensor = self.vocab_rows(torch.stack(features, -2))
        return out.view(*f.shape[:-1], count, -1)
