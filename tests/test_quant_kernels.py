"""The GGUF products (`_core.qlinear`) against a NumPy twin of their
documented functions (`rust/quant.rs`), bit for bit, on every instruction
path this CPU runs, on 1 and 2 threads, a row alone or among 2..20:

- float32 activations: out[r, o] = the fused multiply-adds of
  gguf-py's dequantized w[o, j] and x[r, j] in index order;
- q8 activations: x quantized per 32-block as ggml's quantize_row_q8_0 /
  q8_1 (x86), exact integer block sums, acc = fma(d_w·d_x, s, acc) per
  block (Q4_1, Q5_1: then fma(m_w, s_x, acc));
- the K-quants (Q4_K, Q5_K, Q6_K) with q8 activations: x quantized per
  256 as ggml's quantize_row_q8_K_ref, per super-block the exact integer
  sums S (scales times code-x dots) and M (mins times x sums),
  acc = fma(d_w·d_x, S, acc), then fma(dmin_w·(−d_x), M, acc) (Q6_K: S
  over codes − 32, no M).

The twin rounds a fused multiply-add exactly: the product in float64 is
exact, the sum's rounding error comes from TwoSum, and rounding to odd
before float32 (53 ≥ 24 + 2 bits) gives the correctly rounded result."""

from __future__ import annotations

import numpy as np
import pytest
from specdec_rs import _core

gguf = pytest.importorskip("gguf")

TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "BF16": 30, "Q5_0": 6, "Q5_1": 7}
BLOCKS = ("Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1")
KQUANTS = {"Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
WITH_MIN = ("Q4_1", "Q5_1")
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


def kquant_weight(kind: str, m: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(row-major bytes, gguf-py's float32 values) of random valid
    super-blocks: every scale, min and code byte random, d and dmin modest
    float16s of both signs (gguf-py has no K-quant quantizer)."""
    rng = np.random.default_rng(seed)
    qtype = gguf.GGMLQuantizationType[kind]
    size = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}[kind]
    blocks = rng.integers(0, 256, (m * k // 256, size), dtype=np.uint8)
    scales = rng.uniform(2**-10, 2**-4, (len(blocks), 2)) * rng.choice([-1, 1], (len(blocks), 2))
    halves = scales.astype(np.float16).view(np.uint8).reshape(len(blocks), 4)
    if kind == "Q6_K":
        blocks[:, 208:210] = halves[:, :2]
    else:
        blocks[:, 0:4] = halves
    data = np.ascontiguousarray(blocks).view(np.uint8).reshape(m, -1)
    values = gguf.dequantize(data, qtype).reshape(m, k).astype(np.float32)
    return data, values


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
    size = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34, "Q5_0": 22, "Q5_1": 24}[kind]
    blocks = raw.reshape(m, k // 32, size)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if kind == "Q8_0":
        return blocks[..., 2:].view(np.int8).astype(np.int32).reshape(m, k), d, np.zeros_like(d)
    start = 4 if kind in WITH_MIN else 2
    high = kind.startswith("Q5")
    qs = blocks[..., start + 4 * high :].astype(np.int32)
    nib = np.concatenate([qs & 15, qs >> 4], axis=2)
    if high:
        qh = blocks[..., start : start + 4].copy().view(np.uint32)[..., 0].astype(np.int64)
        nib = nib | (((qh[..., None] >> np.arange(32)) & 1) << 4).astype(np.int32)
    nib = nib.reshape(m, k)
    mins = (
        blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        if kind in WITH_MIN
        else np.zeros_like(d)
    )
    offset = {"Q4_0": 8, "Q5_0": 16}.get(kind, 0)
    return nib - offset, d, mins


def twin_q8(x: np.ndarray, kind: str, raw: np.ndarray) -> np.ndarray:
    n, k = x.shape
    xq, dx, sx, _ = twin_quantize(x, kind in WITH_MIN)
    codes, dw, mw = codes_and_scales(kind, raw, k)
    acc = np.zeros((n, raw.shape[0]), np.float32)
    for b in range(k // 32):
        part = slice(32 * b, 32 * b + 32)
        s = xq[:, part].astype(np.int64) @ codes[:, part].T.astype(np.int64)  # exact
        scale = (dx[:, b : b + 1] * dw[None, :, b]).astype(np.float32)
        acc = fma32(scale, s.astype(np.float32), acc)
        if kind in WITH_MIN:
            acc = fma32(np.broadcast_to(mw[None, :, b], acc.shape), sx[:, b : b + 1], acc)
    return acc


def product(x: np.ndarray, packed: np.ndarray, kind: str, m: int, **kw: object) -> np.ndarray:
    out = np.full((x.shape[0], m), np.nan, np.float32)
    _core.qlinear(x, packed, {**TYPES, **KQUANTS}[kind], m, out, **kw)  # type: ignore[arg-type]
    return out


def assert_every_path(
    x: np.ndarray, packed: np.ndarray, kind: str, m: int, want: np.ndarray, activations: str
) -> None:
    """The product equals `want` bit for bit on every path this CPU runs, on 1 and 2 threads."""
    for path in available_paths():
        for threads in (1, 2):
            got = product(x, packed, kind, m, threads=threads, path=path, activations=activations)
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=path)


def activations_x(n: int, k: int, seed: int) -> np.ndarray:
    """Rows with mixed magnitudes, an all-zero block and exact halves (ties)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, k)) * np.exp(rng.uniform(-4, 2, (n, 1)))).astype(np.float32)
    x[0, :32] = 0.0
    if n > 1:
        x[1, 32:64] = np.arange(32, dtype=np.float32) - 15.5  # many exact .5 after scaling
    return x


@pytest.mark.parametrize("kind", list(TYPES))
@pytest.mark.parametrize(
    ("n", "k", "m"), [(1, 32, 3), (5, 96, 70), (17, 64, 19), (5, 576, 70), (33, 288, 19)]
)
def test_float32_activations_equal_the_twin_on_every_path(
    kind: str, n: int, k: int, m: int
) -> None:
    raw, values = weight(kind, m, k, seed=n + m)
    packed = _core.pack_weight(raw, TYPES[kind], k)
    x = activations_x(n, k, seed=k)
    want = twin_f32(x, values)
    assert_every_path(x, packed, kind, m, want, "f32")


@pytest.mark.parametrize("kind", BLOCKS)
@pytest.mark.parametrize(
    ("n", "k", "m"), [(1, 32, 3), (5, 96, 70), (17, 576, 19), (5, 576, 70), (33, 288, 19)]
)
def test_q8_activations_equal_the_twin_on_every_path(kind: str, n: int, k: int, m: int) -> None:
    raw, _ = weight(kind, m, k, seed=n * m)
    packed = _core.pack_weight(raw, TYPES[kind], k)
    x = activations_x(n, k, seed=m)
    want = twin_q8(x, kind, raw)
    assert_every_path(x, packed, kind, m, want, "q8")


@pytest.mark.parametrize("kind", list(KQUANTS))
@pytest.mark.parametrize(("n", "k", "m"), [(1, 256, 3), (5, 768, 70), (17, 512, 19)])
def test_kquants_equal_gguf_pys_values_and_the_float32_twin(
    kind: str, n: int, k: int, m: int
) -> None:
    raw, values = kquant_weight(kind, m, k, seed=n + m)
    packed = _core.pack_weight(raw, KQUANTS[kind], k)
    got_values = np.full((m, k), np.nan, np.float32)
    _core.dequantize_rows(packed, KQUANTS[kind], k, m, np.arange(m), got_values, 2)
    np.testing.assert_array_equal(got_values.view(np.uint32), values.view(np.uint32))
    x = activations_x(n, k, seed=k)
    want = twin_f32(x, values)
    assert_every_path(x, packed, kind, m, want, "f32")
    back = _core.unpack_rows(packed, KQUANTS[kind], k, m, np.arange(m)[::-1].copy())
    np.testing.assert_array_equal(back, raw[::-1])


def twin_quantize_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's quantize_row_q8_K_ref in NumPy float32: (codes (n, k), d (n, k/256))."""
    n, k = x.shape
    blocks = x.reshape(n, k // 256, 256)
    first = np.abs(blocks).argmax(axis=2)  # the first of equal magnitudes
    top = np.take_along_axis(blocks, first[..., None], axis=2)[..., 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(top != 0, np.float32(-127) / top, np.float32(0)).astype(np.float32)
        scaled = (blocks * iscale[..., None]).astype(np.float32)
        d = np.where(top != 0, np.float32(1) / iscale, np.float32(0)).astype(np.float32)
    codes = np.minimum(np.rint(scaled), 127).astype(np.int32)  # nearest_int: ties to even
    return codes.reshape(n, k), d


def kquant_fields(kind: str, raw: np.ndarray, k: int) -> tuple[np.ndarray, ...]:
    """(unsigned codes (m, k), scales (m, k/16 or k/32), mins (m, k/32), d, dmin (m, k/256))
    of row-major super-blocks, as gguf-py reads them."""
    m, nb = raw.shape[0], k // 256
    size = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}[kind]
    b = raw.reshape(m * nb, size)
    if kind == "Q6_K":
        ql, qh = b[:, :128].astype(np.int32), b[:, 128:192].astype(np.int32)
        low = np.stack([ql[:, :64] & 15, ql[:, :64] >> 4, ql[:, 64:] & 15, ql[:, 64:] >> 4], 1)
        low = low.reshape(-1, 256)  # element 128c + 64h + i
        high = np.stack(
            [(qh[:, 32 * c : 32 * c + 32] >> (2 * u)) & 3 for c in range(2) for u in range(4)], 1
        )
        codes = low | (high.reshape(-1, 256) << 4)
        sc = b[:, 192:208].view(np.int8).astype(np.int32)
        d = b[:, 208:210].copy().view(np.float16)[:, 0].astype(np.float32)
        zeros = np.zeros((m, k // 32), np.int32)
        return codes.reshape(m, k), sc.reshape(m, -1), zeros, d.reshape(m, nb), np.zeros((m, nb))
    sc_raw = b[:, 4:16].astype(np.int32)
    dd, mm, md = sc_raw[:, 0:4], sc_raw[:, 4:8], sc_raw[:, 8:12]
    sc = np.concatenate([dd & 63, (md & 15) | ((dd >> 2) & 48)], 1)
    mins = np.concatenate([mm & 63, (md >> 4) | ((mm >> 2) & 48)], 1)
    qs = b[:, 48:176] if kind == "Q5_K" else b[:, 16:144]
    qs = qs.astype(np.int32).reshape(-1, 4, 32)
    codes = np.stack([qs & 15, qs >> 4], 2).reshape(-1, 256)  # element 64c + 32h + l
    if kind == "Q5_K":
        qh = b[:, 16:48].astype(np.int32)
        codes = codes | (((qh[:, None, :] >> np.arange(8)[None, :, None]) & 1) << 4).reshape(
            -1, 256
        )
    d = b[:, 0:2].copy().view(np.float16)[:, 0].astype(np.float32)
    dmin = b[:, 2:4].copy().view(np.float16)[:, 0].astype(np.float32)
    return (
        codes.reshape(m, k),
        sc.reshape(m, -1),
        mins.reshape(m, -1),
        d.reshape(m, nb),
        dmin.reshape(m, nb),
    )


def twin_q8k(x: np.ndarray, kind: str, raw: np.ndarray) -> np.ndarray:
    n, k = x.shape
    xq, dx = twin_quantize_k(x)
    codes, sc, mins, dw, dmin = kquant_fields(kind, raw, k)
    acc = np.zeros((n, raw.shape[0]), np.float32)
    for b in range(k // 256):
        if kind == "Q6_K":
            total = np.zeros(acc.shape, np.int64)
            for t in range(16):
                part = slice(256 * b + 16 * t, 256 * b + 16 * t + 16)
                dot = xq[:, part].astype(np.int64) @ (codes[:, part].T.astype(np.int64) - 32)
                total += dot * sc[None, :, 16 * b + t]
            mins_total = None
        else:
            total = np.zeros(acc.shape, np.int64)
            mins_total = np.zeros(acc.shape, np.int64)
            for u in range(8):
                part = slice(256 * b + 32 * u, 256 * b + 32 * u + 32)
                dot = xq[:, part].astype(np.int64) @ codes[:, part].T.astype(np.int64)
                total += dot * sc[None, :, 8 * b + u]
                mins_total += (
                    xq[:, part].sum(axis=1, dtype=np.int64)[:, None] * mins[None, :, 8 * b + u]
                )
        scale = (dx[:, b : b + 1] * dw[None, :, b]).astype(np.float32)
        acc = fma32(scale, total.astype(np.float32), acc)
        if mins_total is not None:
            mscale = (dmin[None, :, b] * -dx[:, b : b + 1]).astype(np.float32)
            acc = fma32(mscale, mins_total.astype(np.float32), acc)
    return acc


@pytest.mark.parametrize("kind", list(KQUANTS))
@pytest.mark.parametrize(("n", "k", "m"), [(1, 256, 3), (5, 768, 70), (17, 512, 19)])
def test_kquants_with_q8_activations_equal_the_twin_on_every_path(
    kind: str, n: int, k: int, m: int
) -> None:
    raw, _ = kquant_weight(kind, m, k, seed=n * m)
    packed = _core.pack_weight(raw, KQUANTS[kind], k)
    x = activations_x(n, k, seed=m)
    want = twin_q8k(x, kind, raw)
    assert_every_path(x, packed, kind, m, want, "q8")


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
@pytest.mark.parametrize("k", [256, 768])
def test_a_row_has_the_same_bits_alone_or_among_others(activations: str, k: int) -> None:
    """(k = 768: 24 blocks, so a block of rows walks the panels in 3 chunks.)"""
    m = 150
    for kind in (*BLOCKS, *KQUANTS):
        raw, _ = kquant_weight(kind, m, k, 3) if kind in KQUANTS else weight(kind, m, k, 3)
        packed = _core.pack_weight(raw, {**TYPES, **KQUANTS}[kind], k)
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
    for kind, ggml_type in {**TYPES, **KQUANTS}.items():
        k = 256 if kind in KQUANTS else 64
        raw, values = kquant_weight(kind, 70, k, 9) if kind in KQUANTS else weight(kind, 70, k, 9)
        packed = _core.pack_weight(raw, ggml_type, k)
        out = np.full((k, 70), np.nan, np.float32)
        _core.dequantize_transposed(packed, ggml_type, k, 70, out, 2)
        np.testing.assert_array_equal(out.view(np.uint32), values.T.view(np.uint32), kind)


def test_bad_activations_and_paths_are_value_errors() -> None:
    raw, _ = weight("Q4_1", 4, 32, seed=1)
    packed = _core.pack_weight(raw, 3, 32)
    x = np.zeros((1, 32), np.float32)
    with pytest.raises(ValueError, match="activations = \"q4\"; expected 'f32'"):
        product(x, packed, "Q4_1", 4, threads=1, activations="q4")
    with pytest.raises(ValueError, match='path = "sse"; expected one of portable'):
        product(x, packed, "Q4_1", 4, threads=1, path="sse")
