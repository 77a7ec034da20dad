"""A GGUF model's forward in one Rust call (`_core.LlamaStack`): every
layer, the final norm and the LM head on the rows that are read, for one
sequence (a chain, a tree under its mask, a lookahead window) or a ragged
batch of sequences, each after its own `PreallocatedCache`.

Python does the embedding lookup and the rotary tables; the rest is Rust,
so a decode step's Python is a few tens of microseconds rather than a
transformers forward's thirty layer calls. Every value of a row comes from
that row alone in one fixed order, so a sequence's logits are the same bits
alone, in a batch, or as a tree's root path.

A prompt's prefill runs here too (in calls of at most `CHUNK` positions,
each after the ones before: a row's values do not depend on the chunking),
so a GGUF target is one function whatever the prompt's length (and this is
faster than the dense products and torch's attention of the model's own
forward, which direct `model(...)` calls still take).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from specdec_rs import _core

CHUNK = 256  # positions of one call when a long block runs alone (the attention's scratch)
DENSE_PANELS = 0.5  # a row needing more of the head's panels than this reads them all

if TYPE_CHECKING:
    import torch


def batchable(model: Any) -> bool:
    """Whether `model` is a GGUF model whose layers can run several
    sequences in one call (every decoder layer a `FusedLlamaLayer`, on the CPU)."""
    from specdec_rs.gguf.layer import FusedLlamaLayer

    base = getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    if layers is None or len(layers) == 0 or getattr(model, "lm_head", None) is None:
        return False
    return all(isinstance(layer, FusedLlamaLayer) for layer in layers)


class Stack:
    """The decoder stack of `model` (a GGUF model: every layer a `FusedLlamaLayer`)."""

    def __init__(self, model: Any):
        from specdec_rs.gguf.layer import local_rotary_of

        base = model.model
        layers = []
        for layer in base.layers:
            weights = [(np.asarray(p), int(t)) for p, t in layer._weights]
            layers.append((weights, *layer._norms, layer._dims, layer._extras))
        self.norm = base.norm.weight.detach().float().contiguous()
        head = model.lm_head
        self.stack = _core.LlamaStack(
            layers,
            self.norm.numpy(),
            float(base.norm.variance_epsilon),
            (head.packed, head.ggml_type),
            head.out_features,
            float(getattr(head, "softcap", 0.0)),
        )
        self.model, self.base, self.head = model, base, head
        self.kv = (base.layers[0].kv_heads, base.layers[0].head_dim)
        self.depth = len(base.layers)  # a layer view's cache may hold more layers: the first ones
        # Gemma 3's sliding layers' rotary (`gguf.layer.LocalRotary`), else None
        self.local = local_rotary_of(base.layers)
        self.rotary = RotaryTable.of(base.rotary_emb)
        self.local_table = None if self.local is None else RotaryTable.of(self.local.rotary)

    def forward(
        self,
        blocks: Sequence[torch.Tensor],
        caches: Sequence[Any],
        *,
        rows: Sequence[int] | None = None,
        positions: torch.Tensor | None = None,
        mask: np.ndarray | None = None,
        allowed: Sequence[np.ndarray | None] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """blocks[s] (n_s,) after caches[s]; each cache grows by n_s.
        (logits (len(rows), V) float32 of the rows `rows` of the N = Σ n_s
        (default: every row), the final-normed states (N, H)). `positions`
        (N,): the rows' positions (default: each block's after its cache);
        `mask` (n, past + n) uint8: one sequence's attention (a tree's).
        `allowed[s]`: None, or (r_s, V) bool, the ids at which the logits
        of block s's first r_s positions will be read (a grammar's masks);
        the head computes those rows on the panels holding an allowed id
        only (`head_panels`), and their other logits are unspecified (NaN
        where a panel was skipped): mask them (`structured.masked_logits`).
        The logits computed are the same bits either way."""

        block = blocks[0].reshape(-1)
        if len(blocks) == 1 and mask is None and positions is None and len(block) > CHUNK:
            return self._chunked(block, caches[0], rows)
        return self._call(blocks, caches, rows, positions, mask, allowed)

    def _panels(
        self,
        allowed: Sequence[np.ndarray | None],
        lengths: Sequence[int],
        wanted: Sequence[int],
    ) -> list[list[int] | None]:
        """Per wanted row: its head panels (`head_panels`) where its block's
        masks cover it, else None (the whole vocabulary)."""
        if len(allowed) != len(lengths):
            raise ValueError(f"allowed has {len(allowed)} entries for {len(lengths)} blocks")
        lists = [None if a is None else head_panels(a, self.head.out_features) for a in allowed]
        starts = np.cumsum([0, *lengths])
        out: list[list[int] | None] = []
        for w in wanted:
            s = int(np.searchsorted(starts, w, side="right")) - 1
            mine, j = lists[s], int(w - starts[s])
            out.append(mine[j] if mine is not None and j < len(mine) else None)
        return out

    def _chunked(
        self, block: torch.Tensor, cache: Any, rows: Sequence[int] | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A long block in calls of CHUNK positions; the rows asked for gathered."""
        import torch

        wanted = list(range(len(block))) if rows is None else [int(r) for r in rows]
        logits, states = [], []
        for start in range(0, len(block), CHUNK):
            piece = block[start : start + CHUNK]
            mine = [r - start for r in wanted if start <= r < start + len(piece)]
            lg, st = self._call([piece], [cache], mine, None, None)
            logits.append((mine, lg))
            states.append(st)
        order = {r: i for i, r in enumerate(wanted)}
        out = torch.empty((len(wanted), self.head.out_features), dtype=torch.float32)
        for start, (mine, lg) in zip(range(0, len(block), CHUNK), logits, strict=True):
            for j, r in enumerate(mine):
                out[order[r + start]] = lg[j]
        return out, torch.cat(states)

    def _call(
        self,
        blocks: Sequence[torch.Tensor],
        caches: Sequence[Any],
        rows: Sequence[int] | None,
        positions: torch.Tensor | None,
        mask: np.ndarray | None,
        allowed: Sequence[np.ndarray | None] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One Rust call over the blocks (see `forward`)."""
        import torch

        lengths = [len(b) for b in blocks]
        pasts = [c.layers[0].get_seq_length() for c in caches]
        if positions is None:
            at = np.concatenate([np.arange(p, p + n) for p, n in zip(pasts, lengths, strict=True)])
        else:
            at = positions.numpy()
        ids = (
            blocks[0].reshape(-1)
            if len(blocks) == 1
            else torch.cat([b.reshape(-1) for b in blocks])
        )
        x = self.base.embed_tokens(ids[None])[0].float().contiguous()
        cos, sin = self._tables(self.rotary, self.base.rotary_emb, x, at)
        local = None
        if self.local is not None:
            local = self._tables(self.local_table, self.local.rotary, x, at)
        keys: list[Any] = []
        values: list[Any] = []
        for cache, n in zip(caches, lengths, strict=True):
            k, v = self._arrays(cache, n)
            keys += k
            values += v
        n_rows = len(ids)
        wanted = list(range(n_rows)) if rows is None else [int(r) for r in rows]
        panels = None
        if allowed is not None and any(a is not None for a in allowed):
            panels = self._panels(allowed, lengths, wanted)
        threads = self.head.threads
        logits, states = self.stack.forward(
            x.numpy(),
            cos,
            sin,
            keys,
            values,
            pasts,
            lengths,
            mask,
            wanted,
            threads,
            activations=self.head.activations,
            local=local,
            panels=panels,
        )
        for cache, n in zip(caches, lengths, strict=True):
            for layer in cache.layers[: self.depth]:
                layer.advance(n)
        return torch.from_numpy(logits), torch.from_numpy(states)

    @staticmethod
    def _tables(
        table: RotaryTable | None, rotary: Any, x: torch.Tensor, at: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin (N, d) float32 at positions `at`: from the table, or
        (a rotary whose frequencies depend on the sequence) from the module."""
        import torch

        if table is not None:
            return table.rows(at)
        cos, sin = rotary(x[None], torch.from_numpy(at)[None])
        return cos[0].float().contiguous().numpy(), sin[0].float().contiguous().numpy()

    def _arrays(self, cache: Any, n: int) -> tuple[list[Any], list[Any]]:
        """The key and value arrays of `cache`'s first `depth` layers with
        room for n more positions (`PreallocatedLayer.slot_arrays`). Kept on
        the cache between forwards while no buffer anywhere was made or
        dropped (`kv_cache.buffers_epoch`) and the room suffices: a decode
        step then touches no layer before the Rust call."""
        from specdec_rs.kv_cache import buffers_epoch

        first = self.base.layers[0]
        like, dtype = (1, self.kv[0], first.cache_width), first.cache_dtype
        kept = cache.__dict__.setdefault("_specdec_arrays", {})
        memo = kept.get(self.depth)
        past = cache.layers[0].get_seq_length()
        if memo is not None:
            shape, kind, epoch, room, keys, values = memo
            if (shape, kind, epoch) == (like, dtype, buffers_epoch()) and past + n <= room:
                return keys, values
        keys, values = [], []
        for layer in cache.layers[: self.depth]:
            k, v, _ = layer.slot_arrays(n, like, dtype)
            keys.append(k)
            values.append(v)
        room = min(k.shape[1] for k in keys)  # (kv heads, capacity, width)
        kept[self.depth] = (like, dtype, buffers_epoch(), room, keys, values)
        return keys, values


class RotaryTable:
    """A rotary module's (cos, sin) by position: rows 0..P - 1 computed by
    the module itself over all of them at once, grown (doubled) when a
    position is past them. A row holds the bits the module gives that
    position in any call (its angle is one float32 product, and the cos and
    sin run the same vector loop whatever the call's length: tested), so a
    forward's values do not change; a step looks its rows up instead of
    running the module (about 25 µs a forward)."""

    def __init__(self, rotary: Any):
        self.rotary = rotary
        self.cos = self.sin = np.empty((0, 0), np.float32)

    @classmethod
    def of(cls, rotary: Any) -> RotaryTable | None:
        """A table of `rotary`, or None where its frequencies depend on the
        sequence (transformers' dynamic and LongRoPE types)."""
        kind = str(getattr(rotary, "rope_type", "default"))
        return None if "dynamic" in kind or "longrope" in kind else cls(rotary)

    def rows(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin (N, d) float32 at `positions` (N,) int."""
        import torch

        top = int(positions.max()) + 1 if len(positions) else 0
        if top > len(self.cos):
            count = max(top, 2 * len(self.cos), 512)
            ids = torch.arange(count)[None]
            probe = torch.zeros(1, 1, 1, dtype=torch.float32)
            cos, sin = self.rotary(probe, ids)
            self.cos = cos[0].float().contiguous().numpy()
            self.sin = sin[0].float().contiguous().numpy()
        return self.cos[positions], self.sin[positions]


def head_panels(allowed: np.ndarray, head_rows: int) -> list[list[int] | None]:
    """Per row of `allowed` (r, V) bool: the LM head's panels (of
    `_core.panel_rows()` ids) holding an allowed id, sorted; or None where
    that is more than `DENSE_PANELS` of the head's panels (the row then
    shares the whole head's pass with the other rows)."""
    size = _core.panel_rows()
    count = -(-head_rows // size)
    if allowed.ndim != 2 or allowed.dtype != np.bool_ or allowed.shape[1] > count * size:
        raise ValueError(
            f"allowed is {allowed.dtype} {allowed.shape}; expected (rows, V) bool with V at most "
            f"the head's {head_rows} rows"
        )
    rows, width = allowed.shape
    if width % size or not allowed.flags.c_contiguous:
        padded = np.zeros((rows, -(-width // size) * size), dtype=bool)
        padded[:, :width] = allowed
        allowed = padded
    # a panel's 16 flags are two 8-byte words: it is needed where either is nonzero
    words = allowed.view(np.uint64).reshape(rows, -1, size // 8)
    needed = words[:, :, 0] != 0
    for w in range(1, size // 8):
        needed |= words[:, :, w] != 0
    out: list[list[int] | None] = []
    for row in needed:
        listed = np.flatnonzero(row)
        out.append(None if len(listed) > DENSE_PANELS * count else listed.tolist())
    return out


def stack_of(model: Any, cache: Any) -> Stack | None:
    """The model's `Stack` (built once) when this forward can take it: a
    GGUF model on the CPU, without autograd, on a `PreallocatedCache`; else
    None (the model's own forward)."""
    import torch

    stack = model.__dict__.get("_specdec_stack")
    if stack is None:
        stack = Stack(model) if batchable(model) else False
        model.__dict__["_specdec_stack"] = stack
    if stack is False:
        return None
    layers = getattr(cache, "layers", None)
    if not layers or not callable(getattr(layers[0], "slot_arrays", None)):
        return None
    if torch.is_grad_enabled():
        return None
    return stack  # type: ignore[no-any-return]
