"""The decoder layer of a GGUF model, written for few positions.

Same function as transformers' `LlamaDecoderLayer` (RMSNorm -> attention
with RoPE over the cache -> residual -> RMSNorm -> gated SiLU MLP ->
residual), with an architecture's differences (`architectures`: q, k, v
biases, q/k head norms, Gemma's post-norms, GELU gate, scale and
soft-capped scores, sliding windows, Gemma 3's local rotary), and with the
same call signature, so `LlamaModel.forward` drives it,
but in fewer operations: the query, key and value weights are one
`QuantLinear` (their rows stacked), gate and up another, `F.rms_norm` is
one fused operation, attention reads the cache's views with grouped heads
(`enable_gqa`, no repeated keys). A decode step of a small model is mostly
the overhead of its small operations (the handout's kernel-launch
overhead), so the count matters as much as the products.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from specdec_rs import _core
from specdec_rs.gguf.modules import QuantLinear
from specdec_rs.kv_cache import PreallocatedLayer

NATIVE_PREFILL = 16  # prompts up to this long are prefilled natively too
# prompts at least this long are prefilled by dense products (`QuantLinear.dense`):
# measured on the 2-core Intel host, 446 positions 1355 -> 618 ms, 214 562 -> 380 ms,
# but 41 positions 100 -> 121 ms
DENSE_PREFILL = 64


@contextmanager
def _torch_threads(threads: int) -> Iterator[None]:
    """torch on at least `threads` threads inside (the loader sets it to one
    when the kernels take two), as before after."""
    before = torch.get_num_threads()
    if threads > before:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if threads > before:
            torch.set_num_threads(before)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE in transformers' half-split convention: x (B, H, n, d), cos/sin (B, 1, n, d)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


class _RotaryArrays:
    """The model's rotary tables of one forward as NumPy arrays (n, d),
    converted once for all its layers: `LlamaModel.forward` passes every
    layer the same (cos, sin) tensors. Holds the last pair it converted (so
    their identity cannot pass to other tensors), in one tuple replaced
    whole (threads sharing it never see a torn pair)."""

    def __init__(self) -> None:
        self._last: tuple[Any, ...] = (None, None, None, None)

    def arrays(self, position_embeddings: tuple[torch.Tensor, torch.Tensor]) -> tuple[Any, Any]:
        cos, sin = position_embeddings
        last = self._last
        if last[0] is not cos or last[1] is not sin:
            c, s = (t[0].float().contiguous().numpy() for t in (cos, sin))
            last = self._last = (cos, sin, c, s)
        return last[2], last[3]


_ROTARY = _RotaryArrays()
_ROTARY_LOCAL = _RotaryArrays()  # Gemma 3's sliding layers' tables


class LocalRotary:
    """The rotary of Gemma 3's sliding layers (`rotary`: a transformers
    rotary module of their own base): (cos, sin) (1, n, d) at a forward's
    `position_ids`, computed once for all its layers (`LlamaModel.forward`
    passes every layer the same position_ids tensor). Holds the last pair
    in one tuple replaced whole."""

    def __init__(self, rotary: Any):
        self.rotary = rotary
        self._last: tuple[Any, ...] = (None, None)

    def tables(
        self, x: torch.Tensor, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        last = self._last
        if last[0] is not position_ids:
            last = self._last = (position_ids, self.rotary(x, position_ids))
        return last[1]  # type: ignore[no-any-return]


def local_rotary_of(layers: Any) -> LocalRotary | None:
    """The `LocalRotary` the layers' sliding layers share (Gemma 3), else None."""
    return next((layer.local_rotary for layer in layers if layer.rotary), None)


class FusedLlamaLayer(nn.Module):
    """One decoder layer over GGUF weights. `parts` holds the products
    under transformers' names: q_proj, k_proj, v_proj (or qkv_proj, fused),
    o_proj, gate_proj, up_proj (or gate_up_proj), down_proj. `extras`: an
    architecture's differences (`architectures`): "qkv_bias" (qd + 2·kvd),
    "q_norm" and "k_norm" (d), "post_attn_norm" and "post_ffw_norm"
    (hidden: Gemma's norms of the attention's and the MLP's outputs).
    `config.specdec_sliding_window` (0: none) on the layers
    `config.specdec_sliding_layers` names; `local_rotary` (a `LocalRotary`,
    set by the loader) for a sliding layer of Gemma 3. The scores' scale,
    their soft-cap and the GELU gate come from the config too (`model.llama_config`).
    `weights` maps transformers' parameter names (``self_attn.q_proj.weight``,
    ...) to (the QuantLinear holding them, first row, rows): the view
    `identity.TargetPrint` and `models.weight_rows` read."""

    def __init__(
        self,
        config: Any,
        layer_idx: int,
        parts: dict[str, QuantLinear],
        attn_norm: torch.Tensor,
        ffn_norm: torch.Tensor,
        *,
        extras: dict[str, torch.Tensor] | None = None,
    ):
        super().__init__()
        self.layer_idx = layer_idx
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = d = config.head_dim
        self.eps = float(config.rms_norm_eps)
        default_scale = float(np.float32(1) / np.sqrt(np.float32(d)))
        self.scale = float(getattr(config, "specdec_attention_scale", default_scale))
        self.softcap = float(getattr(config, "specdec_attn_softcap", 0.0))
        self.gelu = getattr(config, "hidden_act", "silu") == "gelu_pytorch_tanh"
        sliding = getattr(config, "specdec_sliding_layers", None)
        slides = sliding is None or sliding[layer_idx]
        self.window = int(getattr(config, "specdec_sliding_window", 0) or 0) if slides else 0
        # 1: this layer takes Gemma 3's local rotary (`local_rotary`, set by the loader)
        self.rotary = int(bool(self.window and getattr(config, "specdec_local_rope_theta", 0)))
        self.local_rotary: LocalRotary | None = None
        self.cache_dtype = torch.float32  # the keys and values it caches (`model.set_cache_type`)
        inter = parts["down_proj"].in_features
        # q, k, v (and gate, up) as one product when they share a format
        # (the usual case) or the file fuses them, else one each (files mix formats)
        qkv = [
            ("q_proj", self.heads * d),
            ("k_proj", self.kv_heads * d),
            ("v_proj", self.kv_heads * d),
        ]
        gate_up = [("gate_proj", inter), ("up_proj", inter)]
        self.qkv = nn.ModuleList(_fused_or_stacked(parts, "qkv_proj", qkv))
        self.o_proj = parts["o_proj"]
        self.gate_up = nn.ModuleList(_fused_or_stacked(parts, "gate_up_proj", gate_up))
        self.down_proj = parts["down_proj"]
        self.attn_norm = nn.Parameter(attn_norm, requires_grad=False)
        self.ffn_norm = nn.Parameter(ffn_norm, requires_grad=False)
        self.weights = {
            **_rows_of(self.qkv, [(f"self_attn.{n}.weight", rows) for n, rows in qkv]),
            "self_attn.o_proj.weight": (self.o_proj, 0, self.o_proj.out_features),
            **_rows_of(self.gate_up, [(f"mlp.{n}.weight", rows) for n, rows in gate_up]),
            "mlp.down_proj.weight": (self.down_proj, 0, self.down_proj.out_features),
        }
        self.norms = {
            "input_layernorm.weight": self.attn_norm,
            "post_attention_layernorm.weight": self.ffn_norm,
        }
        extras = extras or {}
        self.qkv_bias = self.q_norm = self.k_norm = None
        self.post_attn_norm = self.post_ffw_norm = None
        for name, value in extras.items():
            setattr(self, name, nn.Parameter(value.float().contiguous(), requires_grad=False))
        if self.qkv_bias is not None:
            self.norms["self_attn.qkv.bias"] = self.qkv_bias
        if self.q_norm is not None:
            self.norms["self_attn.q_norm.weight"] = self.q_norm
            self.norms["self_attn.k_norm.weight"] = self.k_norm
        if self.post_attn_norm is not None:  # Gemma's names: ffn_norm is the pre-MLP norm
            self.norms = {
                "input_layernorm.weight": self.attn_norm,
                "post_attention_layernorm.weight": self.post_attn_norm,
                "pre_feedforward_layernorm.weight": self.ffn_norm,
                "post_feedforward_layernorm.weight": self.post_ffw_norm,
                **{k: v for k, v in self.norms.items() if k.startswith("self_attn.")},
            }
        self._weights = self._native_weights()
        # (heads, kv heads, head size, intermediate size, eps, window, scale,
        # soft-cap, GELU, rotary table) for `_core.llama_layer` (`llama::Shape`)
        self._dims = (
            self.heads,
            self.kv_heads,
            self.head_dim,
            inter,
            self.eps,
            self.window,
            self.scale,
            self.softcap,
            self.gelu,
            self.rotary,
        )
        # the norms' float32 arrays (views of the parameters) for every native call
        self._norms = (self.attn_norm.detach().numpy(), self.ffn_norm.detach().numpy())
        bias = None if self.qkv_bias is None else self.qkv_bias.detach().numpy()
        qk = (
            None
            if self.q_norm is None
            else (self.q_norm.detach().numpy(), self.k_norm.detach().numpy())
        )
        post = (
            None
            if self.post_attn_norm is None
            else (self.post_attn_norm.detach().numpy(), self.post_ffw_norm.detach().numpy())
        )
        # (qkv_bias or None, (q_norm, k_norm) or None, (post-attention, post-MLP norm) or None)
        self._extras = (bias, qk, post)

    def print_weights(self) -> dict[str, tuple[int, int, Any, Any]]:
        """The layer's weights under transformers' names, as
        `identity.weight_samples` reads them (rows of the stacked weights)."""
        out: dict[str, tuple[int, int, Any, Any]] = {}
        for name, (module, start, rows) in self.weights.items():

            def read(ids: torch.Tensor, module: QuantLinear = module, start: int = start) -> Any:
                return module.dequantize_rows(ids + start)

            out[name] = (rows, module.in_features, read, (id(module.packed), start))
        for name, weight in self.norms.items():

            def norm(ids: torch.Tensor, weight: torch.Tensor = weight) -> Any:
                return weight.detach()[None].expand(len(ids), -1)

            out[name] = (1, weight.numel(), norm, id(weight))
        return out

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: Any = None,
        use_cache: bool | None = False,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """hidden_states (B, n, H) -> (B, n, H); the new keys and values go
        into `cache` (layer `layer_idx`). One sequence on a preallocated
        cache (every decode, verification and prefill step) runs as one Rust
        call (`_core.llama_layer`); batches and autograd run in torch with
        the same products. The prefill of a prompt of DENSE_PREFILL or more
        positions into an empty cache runs in torch with dense products
        (`QuantLinear.dense`; with float32 activations only): every path
        prefills a prompt alike, so the steps after it still agree bit for bit."""
        assert position_embeddings is not None, "the model passes position_embeddings"
        if self.rotary:
            assert self.local_rotary is not None and position_ids is not None
            position_embeddings = self.local_rotary.tables(hidden_states, position_ids)
        b, n, h = hidden_states.shape
        layers = getattr(cache, "layers", ())
        layer = layers[self.layer_idx] if self.layer_idx < len(layers) else None
        past = layer.get_seq_length() if layer is not None else 0
        grad = torch.is_grad_enabled() and hidden_states.requires_grad
        if b == 1 and not grad:
            native = cache is None or callable(getattr(layer, "slots", None))
            # every step after the prompt runs natively (the same bits for a
            # position alone or among others); a long prompt's prefill runs
            # torch's attention (the Rust one is written for few queries)
            if native and (past > 0 or n <= NATIVE_PREFILL):
                return self._native(hidden_states, attention_mask, layer, position_embeddings)
        if past == 0 and b * n >= DENSE_PREFILL and not grad and self.o_proj.activations == "f32":
            # a long prompt's prefill: torch's float32 products on the
            # dequantized weights, on the kernels' thread count
            with _torch_threads(self.o_proj.threads):
                return self._torch(hidden_states, attention_mask, cache, position_embeddings, True)
        return self._torch(hidden_states, attention_mask, cache, position_embeddings, False)

    def _torch(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        cache: Any,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        dense: bool,
    ) -> torch.Tensor:
        """The layer in torch operations; the products by the kernels, or
        (`dense`) by `QuantLinear.dense`."""

        def linear(module: Any, x: torch.Tensor) -> torch.Tensor:
            if not dense:
                return module(x)  # type: ignore[no-any-return]
            out: torch.Tensor = module.dense(x.reshape(-1, module.in_features))
            return out.view(*x.shape[:-1], module.out_features)

        b, n, h = hidden_states.shape
        d = self.head_dim
        x = F.rms_norm(hidden_states, (h,), self.attn_norm, self.eps)
        qkv = torch.cat([linear(p, x) for p in self.qkv], -1)
        if self.qkv_bias is not None:
            qkv = qkv + self.qkv_bias
        qkv = qkv.view(b, n, self.heads + 2 * self.kv_heads, d).transpose(1, 2)
        q, k, v = torch.split(qkv, [self.heads, self.kv_heads, self.kv_heads], dim=1)
        if self.q_norm is not None:
            q = F.rms_norm(q, (d,), self.q_norm, self.eps)
            k = F.rms_norm(k, (d,), self.k_norm, self.eps)
        cos, sin = (t.unsqueeze(1) for t in position_embeddings)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        mask, causal, total = attention_mask, False, k.shape[-2]
        if self.window and total > self.window:  # a query sees the window up to itself
            mask = self._windowed(mask, n, total)
        elif mask is None and n > 1:  # queries at the end of the keys, causal among themselves
            if total == n:
                causal = True  # SDPA's own causal kernel
            else:
                mask = torch.ones(n, total, dtype=torch.bool).tril(total - n)
        if self.softcap:  # Gemma 2: capped scores, which SDPA does not take
            att = self._capped_attention(q, k, v, mask)
        else:
            att = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=causal, scale=self.scale, enable_gqa=True
            )
        return self._after_attention(hidden_states, att, linear)

    def _after_attention(
        self, hidden_states: torch.Tensor, att: torch.Tensor, linear: Any
    ) -> torch.Tensor:
        """The layer from the attention's output att (B, H, n, d) on: o,
        the residual, the MLP (each output post-normed where the layer has
        those norms)."""
        b, n, h = hidden_states.shape
        o = linear(self.o_proj, att.transpose(1, 2).reshape(b, n, -1))
        if self.post_attn_norm is not None:
            o = F.rms_norm(o, (h,), self.post_attn_norm, self.eps)
        hidden = hidden_states + o
        y = F.rms_norm(hidden, (h,), self.ffn_norm, self.eps)
        gate, up = torch.cat([linear(p, y) for p in self.gate_up], -1).chunk(2, dim=-1)
        act = F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)
        down = linear(self.down_proj, act * up)
        if self.post_ffw_norm is not None:
            down = F.rms_norm(down, (h,), self.post_ffw_norm, self.eps)
        out: torch.Tensor = hidden + down
        return out

    def _capped_attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """softmax(c·tanh(q·kᵀ·scale/c) under the mask)·v, q (B, H, n, d)
        at the end of k, v (B, KV, total, d): causal, and what `mask` (the
        SDPA path's: padding, a tree's, a window's) allows."""
        n, total = q.shape[-2], k.shape[-2]
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = q @ k.transpose(-1, -2) * self.scale
        scores = torch.tanh(scores / self.softcap) * self.softcap
        allowed = torch.arange(total)[None] <= torch.arange(total - n, total)[:, None]
        if mask is not None:
            allowed = allowed & _allowed(mask)
        scores = scores.masked_fill(~allowed, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v

    def _windowed(self, mask: torch.Tensor | None, n: int, total: int) -> torch.Tensor:
        """The (…, n, total) mask of n queries at the end of `total` keys
        under the sliding window: row i (at total − n + i) sees key j when
        j <= total − n + i < j + window, and what `mask` allows (a causal
        or padding mask: positions one apart in the cache are one apart in
        the text). ValueError for a tree's mask, whose rows' positions are not
        their places."""
        rows = torch.arange(total - n, total)[:, None]
        keys = torch.arange(total)[None]
        band = (keys <= rows) & (rows < keys + self.window)
        if mask is None:
            return band
        allowed = _allowed(mask)
        if _is_tree(allowed, n):
            raise ValueError(
                f"a tree's attention mask over {total} positions under a sliding window of "
                f"{self.window}: a tree or window drafter runs only while the context fits "
                "the window; use a chain drafter (prompt lookup, a draft model) past it"
            )
        return allowed & band

    def _native(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        layer: Any,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        """The layer as one Rust call (see `rust/llama.rs`)."""
        n = hidden_states.shape[1]
        if layer is None:  # no cache: a temporary one for these positions
            layer = PreallocatedLayer(capacity=n)
        x = hidden_states[0].float().contiguous().clone()
        mask = None
        if attention_mask is not None:
            allowed = _allowed(attention_mask[0, 0])
            total = allowed.shape[-1]
            # a causal mask under a window is the Rust window's own (a tree's: refused there)
            if not (self.window and total > self.window and not _is_tree(allowed, n)):
                mask = allowed.to(torch.uint8).contiguous().numpy()
        tables = (_ROTARY_LOCAL if self.rotary else _ROTARY).arrays(position_embeddings)
        self.forward_rows(x.numpy(), *tables, [layer], [n], mask)
        return x.unsqueeze(0).to(hidden_states.dtype)

    @property
    def cache_width(self) -> int:
        """Elements of a cached key or value row: head_dim, or for q8_0 (uint8)
        34 bytes per 32 values (`rust/kv.rs`)."""
        d = int(self.head_dim)
        return d // 32 * 34 if self.cache_dtype == torch.uint8 else d

    def forward_rows(
        self,
        x: Any,
        cos: Any,
        sin: Any,
        layers: list[Any],
        lengths: list[int],
        mask: Any = None,
    ) -> None:
        """The layer as one Rust call (see `rust/llama.rs`) on the rows of
        several sequences: x (N, H) float32 in place, N = Σ lengths, sequence
        s's rows after those of the sequences before it; cos, sin (N, d) at
        each row's position; layers[s] is sequence s's `PreallocatedLayer`
        (its next lengths[s] positions are written). The products run once
        over all N rows; attention per sequence. `mask` (n, past + n) uint8
        only for one sequence (a tree)."""
        keys, values, pasts = [], [], []
        like = (1, self.kv_heads, self.cache_width)
        for layer, n in zip(layers, lengths, strict=True):
            k, v, past = layer.slot_arrays(n, like, self.cache_dtype)
            keys.append(k)
            values.append(v)
            pasts.append(past)
        attn_norm, ffn_norm = self._norms
        _core.llama_layer(
            x,
            cos,
            sin,
            keys,
            values,
            pasts,
            lengths,
            mask,
            self._weights,
            attn_norm,
            ffn_norm,
            self._dims,
            self.o_proj.threads,
            activations=self.o_proj.activations,
            qkv_bias=self._extras[0],
            qk_norms=self._extras[1],
            post_norms=self._extras[2],
        )
        for layer, n in zip(layers, lengths, strict=True):
            layer.advance(n)

    def _native_weights(self) -> list[tuple[Any, int]]:
        """The layer's products for `llama::Weights::of`: q, k, v as one
        stacked (or fused) weight or three, o, gate and up as one or two,
        down (4 to 7 weights; the file mixes formats within a projection
        where they are apart). No rows are copied."""
        order = [*self.qkv, self.o_proj, *self.gate_up, self.down_proj]
        return [(w.packed, w.ggml_type) for w in order]


def _allowed(mask: torch.Tensor) -> torch.Tensor:
    """An attention mask as bools (an additive float mask: True where it is not −inf)."""
    return mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2


def _is_tree(allowed: torch.Tensor, n: int) -> bool:
    """Whether a (…, n, total) bool mask of n queries at the end of the keys
    is a tree's: some query does not see an earlier query's token (a chain,
    padded or not, sees every earlier token that is not padding)."""
    own = allowed[..., -n:]
    real = own.diagonal(dim1=-2, dim2=-1)[..., None, :]  # key j is a token, not padding
    earlier = torch.ones(n, n, dtype=torch.bool).tril(-1)
    return bool((earlier & ~own & real).any())


def _fused_or_stacked(
    parts: dict[str, QuantLinear], fused: str, named: list[tuple[str, int]]
) -> list[QuantLinear]:
    """[parts[fused]] where the file fuses the parts (its rows in `named`'s
    order and sizes), else `_stacked` of the named parts."""
    if fused in parts:
        module = parts[fused]
        if module.out_features != sum(rows for _, rows in named):
            raise ValueError(
                f"{fused} has {module.out_features} rows; expected "
                + " + ".join(f"{rows} ({name})" for name, rows in named)
            )
        return [module]
    return _stacked([parts[name] for name, _ in named])


def _stacked(parts: list[QuantLinear]) -> list[QuantLinear]:
    """[one QuantLinear of all the parts' rows] when they share a format and
    row length and all but the last fill whole stripes of packed rows
    (`_core.pack_rows()`, 64: their packed bytes simply follow one
    another), else the parts."""
    import numpy as np

    first = parts[0]
    same = all(p.ggml_type == first.ggml_type and p.in_features == first.in_features for p in parts)
    if not same or any(p.out_features % _core.pack_rows() for p in parts[:-1]):
        return parts
    packed = np.concatenate([p.packed for p in parts])
    out = QuantLinear(
        packed, first.ggml_type, first.in_features, sum(p.out_features for p in parts)
    )
    out.threads, out.activations = first.threads, first.activations
    return [out]


def _rows_of(modules: Any, named: list[tuple[str, int]]) -> dict[str, tuple[QuantLinear, int, int]]:
    """name -> (module, first row, rows) of each named part (in order, of
    `rows` rows) within `modules`: one stacked or fused module of all of
    them, or one module each."""
    out: dict[str, tuple[QuantLinear, int, int]] = {}
    it = iter(modules)
    module, at = next(it), 0
    for name, rows in named:
        if at == module.out_features:
            module, at = next(it), 0
        out[name] = (module, at, rows)
        at += rows
    return out
