"""The GGUF products (`_core.qlinear`) against a NumPy twin of their
documented functions (`rust/quant.rs`), bit for bit, on every instruction
path this CPU runs, on 1 and 2 threads, a row alone or among 2..20:

- float32 activations: out[r, o] = the fused multiply-adds of
  gguf-py's dequantized w[o, j] and x[r, j] in index order;
- q8 activations: x quantized per 32-block as ggml's quantize_row_q8_0 /
  q8_1 (x86), exact integer block sums, acc = fma(d_w·d_x, s, acc) per
  block (Q4_1: then fma(m_w, s_x, acc)).

The twin rounds a fused multiply-add exactly: the product in float64 is
exact, the sum's rounding error comes from TwoSum, and rounding to odd
before float32 (53 ≥ 24 + 2 bits) gives the correctly rounded result."""

from __future__ import annotations

import numpy as np
import pytest
from specdec_rs import _core

gguf = pytest.importorskip("gguf")

TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "BF16": 30}
BLOCKS = ("Q4_0", "Q4_1", "Q8_0")
PATHS = ("portable", "avx2", "avx2-vnni", "avx512", "avx512-vnni")


def available_paths() -> list[str]:
    """The paths this CPU runs (asking for another is a ValueError)."""
    x = np.zeros((1, 32), np.float32)
    packed = _core.pack_weight(np.zeros((1, 4 * 32), np.uint8), 0, 32)
    out, ok = np.empty((1, 1), np.float32), []
    for path in PATHS:
        try:
            _core.qlinear(x, packed, 0, 1, out, 1, path)
            ok.append(path)
        except ValueError:
            pass
    return ok


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 a·b + c rounded once (see the module docs)."""
    p = a.astype(np.float64) * b.astype(np.float64)  # exact: 24 + 24 bits
    c64 = c.astype(np.float64)
    s = p + c64
    bb = s - p
    e = (p - (s - bb)) + (c64 - bb)  # TwoSum: s + e = p + c exactly
    even = (s.view(np.int64) & 1) == 0
    nudge = (e != 0) & even
    s = np.where(nudge, np.nextafter(s, np.where(e > 0, np.inf, -np.inf)), s)  # round to odd
    return s.astype(np.float32)


def weight(kind: str, m: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(row-major bytes, gguf-py's float32 values) of random weights in
    `kind`, with a zero row, a negative one and a constant one."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((m, k)).astype(np.float32) * np.exp(rng.uniform(-3, 1, (m, 1)))
    w[0] = 0.0
    w[1 % m] = -np.abs(w[1 % m]) - 0.5
    w[2 % m] = 0.25
    qtype = gguf.GGMLQuantizationType[kind]
    data = gguf.quantize(w, qtype)
    values = gguf.dequantize(data, qtype).reshape(m, k).astype(np.float32)
    return np.ascontiguousarray(data).view(np.uint8).reshape(m, -1), values


def twin_f32(x: np.ndarray, values: np.ndarray) -> np.ndarray:
    acc = np.zeros((x.shape[0], values.shape[0]), np.float32)
    for j in range(x.shape[1]):
        acc = fma32(x[:, j : j + 1], values[None, :, j], acc)
    return acc


def twin_quantize(x: np.ndarray, with_s: bool) -> tuple[np.ndarray, ...]:
    """ggml's x86 quantize_row_q8_0/q8_1, in NumPy float32 (see `rust/q8.rs`)."""
    n, k = x.shape
    blocks = x.reshape(n, k // 32, 32)
    amax = np.where(np.isnan(blocks), 0, np.abs(blocks)).max(axis=2).astype(np.float32)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    with np.errstate(invalid="ignore"):  # inf · 0 is NaN, quantized to 0
        v = (blocks * inv[..., None]).astype(np.float32)
        r = np.rint(v)  # half to even, as _mm256_round_ps(..., nearest)
    codes = np.where(np.isnan(r), 0, np.clip(r, -127, 127)).astype(np.int32)
    sums = codes.sum(axis=2).astype(np.int32)
    with np.errstate(over="ignore"):
        d16 = d.astype(np.float16).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):  # a block with an infinity: d = inf
        s16 = (d * sums.astype(np.float32)).astype(np.float16).astype(np.float32)
    return codes.reshape(n, k).astype(np.int8), d16, s16 if with_s else np.zeros_like(d16), sums


def codes_and_scales(kind: str, raw: np.ndarray, k: int) -> tuple[np.ndarray, ...]:
    """(integer codes (m, k), d (m, k/32), m (m, k/32) or zeros) of row-major block bytes."""
    m = raw.shape[0]
    size = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}[kind]
    blocks = raw.reshape(m, k // 32, size)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if kind == "Q8_0":
        return blocks[..., 2:].view(np.int8).astype(np.int32).reshape(m, k), d, np.zeros_like(d)
    start = 4 if kind == "Q4_1" else 2
    qs = blocks[..., start:].astype(np.int32)
    nib = np.concatenate([qs & 15, qs >> 4], axis=2).reshape(m, k)
    if kind == "Q4_0":
        return nib - 8, d, np.zeros_like(d)
    return nib, d, blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)


def twin_q8(x: np.ndarray, kind: str, raw: np.ndarray) -> np.ndarray:
    n, k = x.shape
    xq, dx, sx, _ = twin_quantize(x, kind == "Q4_1")
    codes, dw, mw = codes_and_scales(kind, raw, k)
    acc = np.zeros((n, raw.shape[0]), np.float32)
    for b in range(k // 32):
        part = slice(32 * b, 32 * b + 32)
        s = xq[:, part].astype(np.int64) @ codes[:, part].T.astype(np.int64)  # exact
        scale = (dx[:, b : b + 1] * dw[None, :, b]).astype(np.float32)
        acc = fma32(scale, s.astype(np.float32), acc)
        if kind == "Q4_1":
            acc = fma32(np.broadcast_to(mw[None, :, b], acc.shape), sx[:, b : b + 1], acc)
    return acc


def product(x: np.ndarray, packed: np.ndarray, kind: str, m: int, **kw: object) -> np.ndarray:
    out = np.full((x.shape[0], m), np.nan, np.float32)
    _core.qlinear(x, packed, TYPES[kind], m, out, **kw)  # type: ignore[arg-type]
    return out


def activations_x(n: int, k: int, seed: int) -> np.ndarray:
    """Rows with mixed magnitudes, an all-zero block and exact halves (ties)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, k)) * np.exp(rng.uniform(-4, 2, (n, 1)))).astype(np.float32)
    x[0, :32] = 0.0
    if n > 1:
        x[1, 32:64] = np.arange(32, dtype=np.float32) - 15.5  # many exact .5 after scaling
    return x


@pytest.mark.parametrize("kind", list(TYPES))
@pytest.mark.parametrize(("n", "k", "m"), [(1, 32, 3), (5, 96, 70), (17, 64, 19)])
def test_float32_activations_equal_the_twin_on_every_path(
    kind: str, n: int, k: int, m: int
) -> None:
    raw, values = weight(kind, m, k, seed=n + m)
    packed = _core.pack_weight(raw, TYPES[kind], k)
    x = activations_x(n, k, seed=k)
    want = twin_f32(x, values)
    for path in available_paths():
        for threads in (1, 2):
            got = product(x, packed, kind, m, threads=threads, path=path)
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=path)


@pytest.mark.parametrize("kind", BLOCKS)
@pytest.mark.parametrize(("n", "k", "m"), [(1, 32, 3), (5, 96, 70), (17, 576, 19)])
def test_q8_activations_equal_the_twin_on_every_path(kind: str, n: int, k: int, m: int) -> None:
    raw, _ = weight(kind, m, k, seed=n * m)
    packed = _core.pack_weight(raw, TYPES[kind], k)
    x = activations_x(n, k, seed=m)
    want = twin_q8(x, kind, raw)
    for path in available_paths():
        for threads in (1, 2):
            got = product(x, packed, kind, m, threads=threads, path=path, activations="q8")
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=path)


def test_the_quantization_equals_ggmls() -> None:
    x = activations_x(6, 320, seed=4)
    x[2, 7], x[3, 40], x[3, 41] = np.nan, np.inf, -np.inf
    for with_s in (False, True):
        got = _core.quantize_q8(x, with_s)
        for a, b in zip(got, twin_quantize(x, with_s), strict=True):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="multiple of 32"):
        _core.quantize_q8(np.zeros((1, 40), np.float32), True)


@pytest.mark.parametrize("activations", ["f32", "q8"])
def test_a_row_has_the_same_bits_alone_or_among_others(activations: str) -> None:
    k, m = 128, 150
    for kind in BLOCKS:
        raw, _ = weight(kind, m, k, seed=3)
        packed = _core.pack_weight(raw, TYPES[kind], k)
        x = activations_x(20, k, seed=5)
        alone = np.concatenate(
            [
                product(x[r : r + 1], packed, kind, m, threads=1, activations=activations)
                for r in range(20)
            ]
        )
        for n in (2, 3, 5, 9, 16, 17, 20):
            for path in available_paths():
                got = product(x[:n], packed, kind, m, threads=2, path=path, activations=activations)
                np.testing.assert_array_equal(got.view(np.uint32), alone[:n].view(np.uint32))


def test_the_transposed_dequantization_is_gguf_pys() -> None:
    for kind in TYPES:
        raw, values = weight(kind, 70, 64, seed=9)
        packed = _core.pack_weight(raw, TYPES[kind], 64)
        out = np.full((64, 70), np.nan, np.float32)
        _core.dequantize_transposed(packed, TYPES[kind], 64, 70, out, 2)
        np.testing.assert_array_equal(out.view(np.uint32), values.T.view(np.uint32))


def test_bad_activations_and_paths_are_value_errors() -> None:
    raw, _ = weight("Q4_1", 4, 32, seed=1)
    packed = _core.pack_weight(raw, 3, 32)
    x = np.zeros((1, 32), np.float32)
    with pytest.raises(ValueError, match="activations = \"q4\"; expected 'f32'"):
        product(x, packed, "Q4_1", 4, threads=1, activations="q4")
    with pytest.raises(ValueError, match='path = "sse"; expected one of portable'):
        product(x, packed, "Q4_1", 4, threads=1, path="sse")
