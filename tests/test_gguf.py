"""GGUF weights at their own precision: the kernels against gguf-py's
dequantize and a float64 product, tiny random Llamas written as GGUF files
and read back (logits against their dequantized float32 twin, greedy
identity through `generate` with each drafter, the heads trained and run on
them), and bad files. p = target, q = draft, k = γ."""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import specdec_rs as sd
from hypothesis import given, settings
from hypothesis import strategies as st
from specdec_rs import _core, models, runner
from specdec_rs.gguf import load_gguf
from specdec_rs.gguf.model import activations_of as gguf_activations
from specdec_rs.gguf.modules import NATIVE_TYPES
from specdec_rs.gguf.writer import write_llama
from test_fuzz import deadline

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")

EXAMPLES = int(os.environ.get("SPECDEC_FUZZ_EXAMPLES", "40"))
TYPES = {
    "F32": 0,
    "F16": 1,
    "Q4_0": 2,
    "Q4_1": 3,
    "Q8_0": 8,
    "BF16": 30,
    "Q5_0": 6,
    "Q5_1": 7,
    "IQ4_NL": 20,
}
V = 64


def quantized(kind: str, rows: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(row-major bytes, gguf-py's float32 values) of random weights in
    `kind`, with an all-zero row (scales of 0), a negative row (negative
    minima), a constant row, and mixed magnitudes."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, k)).astype(np.float32) * np.exp(rng.uniform(-3, 1, (rows, 1)))
    w[0] = 0.0
    w[1 % rows] = -np.abs(w[1 % rows]) - 0.5
    w[2 % rows] = 0.25
    qtype = gguf.GGMLQuantizationType[kind]
    data = _iq4_nl_bytes(w, rng) if kind == "IQ4_NL" else gguf.quantize(w, qtype)
    values = gguf.dequantize(data, qtype).reshape(rows, k).astype(np.float32)
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(rows, -1)
    return raw, values


def _iq4_nl_bytes(w: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """IQ4_NL blocks for w's shape (gguf-py cannot quantize it): random
    nibbles, each block's float16 scale its largest |w| / 127 (0 for a zero
    block), the second row's negative."""
    rows, k = w.shape
    blocks = rng.integers(0, 256, (rows, k // 32, 18), dtype=np.uint8)
    d = (np.abs(w).reshape(rows, k // 32, 32).max(-1) / 127).astype(np.float16)
    d[1 % rows] = -d[1 % rows]
    blocks[..., :2] = d.view(np.uint8).reshape(rows, k // 32, 2)
    return blocks.reshape(rows, -1)


@pytest.mark.parametrize("kind", list(TYPES))
def test_the_kernels_dequantize_as_gguf_py_and_multiply_as_float64(kind: str) -> None:
    k, m = 96, 27
    raw, values = quantized(kind, m, k, 1)
    packed = _core.pack_weight(raw, TYPES[kind], k)
    out = np.empty((m, k), np.float32)
    _core.dequantize_rows(packed, TYPES[kind], k, m, np.arange(m, dtype=np.int64), out)
    assert np.array_equal(out.view(np.uint32), values.view(np.uint32))  # bit for bit
    x = np.random.default_rng(2).standard_normal((16, k)).astype(np.float32)
    exact = x.astype(np.float64) @ values.astype(np.float64).T
    bound = k * 2.0**-23 * (np.abs(x).astype(np.float64) @ np.abs(values).astype(np.float64).T)
    got = np.empty((16, m), np.float32)
    _core.qlinear(x, packed, TYPES[kind], m, got, 1)
    assert (np.abs(got - exact) <= bound + 1e-30).all()
    # one row alone, or inside any batch of 2..16: the same bits
    for n in range(2, 17):
        batch = np.empty((n, m), np.float32)
        _core.qlinear(x[:n], packed, TYPES[kind], m, batch, 2)
        assert np.array_equal(batch.view(np.uint32), got[:n].view(np.uint32)), n


def test_rows_that_are_not_whole_blocks_are_refused() -> None:
    with pytest.raises(ValueError, match="whole blocks of 32"):
        _core.pack_weight(np.zeros((2, 60), np.uint8), TYPES["Q4_1"], 48)
    with pytest.raises(ValueError, match="whole blocks of 256"):
        _core.pack_weight(np.zeros((2, 144), np.uint8), 12, 288)
    with pytest.raises(ValueError, match="no native kernel"):
        _core.pack_weight(np.zeros((2, 84), np.uint8), 10, 256)  # Q2_K


@pytest.fixture(scope="module")
def tiny() -> Any:
    return models.tiny_llama(vocab_size=V, hidden_size=64, num_layers=2, seed=1)


@pytest.fixture(scope="module")
def files(tiny: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any]]:
    """kind -> (a GGUF file of `tiny` with its linears in that kind, its float32 twin)."""
    folder = tmp_path_factory.mktemp("gguf")
    out = {}
    for kind in ("Q4_0", "Q4_1", "Q8_0"):
        path = folder / f"tiny-{kind}.gguf"
        out[kind] = (path, write_llama(tiny, path, linear_type=kind, embed_type="Q8_0"))
    # heads of 32 (a q8_0 cache's block): hidden 128, 4 heads
    wide = models.tiny_llama(vocab_size=V, hidden_size=128, num_layers=2, seed=1)
    path = folder / "tiny-wide-Q4_1.gguf"
    out["Q4_1 wide"] = (path, write_llama(wide, path, linear_type="Q4_1", embed_type="Q8_0"))
    return out


@pytest.fixture(
    scope="module",
    params=[("f32", "f32"), ("q8", "f32"), ("q8", "f16"), ("q8", "q8_0")],
    ids=["f32", "q8", "q8-f16cache", "q8-q8cache"],
)
def target(files: dict[str, tuple[Path, Any]], request: pytest.FixtureRequest) -> Any:
    """A Q4_1 file's model with float32 or q8 activations, its keys and
    values cached in float32, float16 or q8_0 (the file with heads of 32):
    four target functions, each exact by itself (every test on `target`
    runs on each); `target.test_file` names its file in `files`."""
    activations, cache_type = request.param
    kind = "Q4_1 wide" if cache_type == "q8_0" else "Q4_1"
    model = load_gguf(
        files[kind][0], tokenizer=False, activations=activations, cache_type=cache_type
    )[0]
    model.test_file = kind
    return model


def test_a_half_or_q8_cache_is_another_function_close_to_the_f32_one(
    files: dict[str, tuple[Path, Any]],
) -> None:
    """cache_type="f16" stores float16 keys and values (half the bytes),
    "q8_0" ggml's q8_0 blocks as uint8 rows (34 bytes per 32 values): logits
    move by the rounding of the cached keys and values only."""
    ids = torch.randint(0, V, (23,), generator=torch.Generator().manual_seed(4))
    for kind, cache_type, dtype, width, tolerance in (
        ("Q4_1", "f16", torch.float16, 16, 2e-3),
        ("Q4_1 wide", "q8_0", torch.uint8, 34, 3e-2),
    ):
        path = files[kind][0]
        full, _ = load_gguf(path, tokenizer=False)
        small, _ = load_gguf(path, tokenizer=False, cache_type=cache_type)
        with torch.inference_mode():
            small_cache, full_cache = runner.new_cache(small), runner.new_cache(full)
            a = runner.forward(small, ids, small_cache, keep=len(ids))
            b = runner.forward(full, ids, full_cache, keep=len(ids))
        keys = small_cache.layers[0].keys
        assert keys.dtype == dtype and keys.shape[-1] == width, (keys.dtype, keys.shape)
        assert full_cache.layers[0].keys.dtype == torch.float32
        scale = float(b.abs().max())
        error = float((a - b).abs().max())
        assert not torch.equal(a, b) and error < tolerance * scale, (cache_type, error, scale)
    with pytest.raises(ValueError, match="cache_type"):
        load_gguf(files["Q4_1"][0], tokenizer=False, cache_type="q4_0")
    with pytest.raises(ValueError, match="blocks of 32 values; layer 0's heads have 16"):
        load_gguf(files["Q4_1"][0], tokenizer=False, cache_type="q8_0")
    # a cache filled in one type refuses the other's writes (a model whose type changed)
    from specdec_rs.gguf.model import set_cache_type

    set_cache_type(full, "f16")
    with torch.inference_mode(), pytest.raises(ValueError, match="start a new cache"):
        runner.forward(full, ids[:2], full_cache, keep=1)


def test_the_q8_target_is_another_function_close_to_the_f32_one(
    files: dict[str, tuple[Path, Any]],
) -> None:
    path, twin = files["Q4_1"]
    f32, _ = load_gguf(path, tokenizer=False)
    q8, _ = load_gguf(path, tokenizer=False, activations="q8")
    ids = torch.randint(0, V, (1, 11), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        a, b = f32(ids).logits, q8(ids).logits
    scale = float(a.abs().max())
    assert not torch.equal(a, b) and float((a - b).abs().max()) < 0.05 * scale
    with pytest.raises(ValueError, match="activations = 'q4'|activations"):
        load_gguf(path, tokenizer=False, activations="q4")


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_logits_match_the_dequantized_float32_twin(
    files: dict[str, tuple[Path, Any]], kind: str
) -> None:
    path, twin = files[kind]
    model, _ = load_gguf(path, tokenizer=False)
    ids = torch.randint(0, V, (1, 11), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        got, want = model(ids).logits, twin(ids).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4 * float(want.abs().max()))
    # the weights the model reads are the file's values, bit for bit
    q = model.model.layers[1].print_weights()["self_attn.q_proj.weight"]
    rows = torch.arange(q[0])
    assert torch.equal(q[2](rows), twin.model.layers[1].self_attn.q_proj.weight.detach())


def test_the_weights_are_gathered_on_huge_pages_and_keep_their_bytes(
    files: dict[str, tuple[Path, Any]], tiny: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`gguf.arena`: every packed weight is a read-only view into one buffer
    starting at a 2 MiB boundary, in module order, a weight shared by the
    embedding and the head once, each the bytes a fresh load packs; the
    layers' weight lists see the moved arrays; the logits are the same bits
    as with `SPECDEC_HUGE_PAGES=0` (the weights left where they were packed)."""
    from specdec_rs.gguf.arena import HUGE_PAGE
    from specdec_rs.gguf.modules import QuantLinear

    path = tmp_path / "mixed.gguf"  # stacked and apart weights, two formats
    write_llama(tiny, path, linear_type="Q4_1", types={"blk.1.ffn_up.weight": "Q4_0"})
    gathered = load_gguf(path, tokenizer=False)[0]
    monkeypatch.setenv("SPECDEC_HUGE_PAGES", "0")
    apart = load_gguf(path, tokenizer=False)[0]

    def packed(model: Any) -> list[np.ndarray]:
        seen: dict[int, np.ndarray] = {}
        for m in model.modules():
            if isinstance(m, QuantLinear):
                seen.setdefault(id(m.packed), m.packed)
        return list(seen.values())

    mine, theirs = packed(gathered), packed(apart)
    assert len(mine) == len(theirs) > 8
    bases = {w.base.ctypes.data if w.base is not None else None for w in mine}
    assert len(bases) == 1 and None not in bases  # one buffer
    starts = [w.ctypes.data for w in mine]
    assert starts[0] % HUGE_PAGE == 0 and starts == sorted(starts)
    assert all(s % 64 == 0 for s in starts)
    assert all(not w.flags.writeable for w in mine)
    assert all(np.array_equal(a, b) for a, b in zip(mine, theirs, strict=True))
    tied = apart.lm_head.packed is apart.model.embed_tokens.table.packed
    assert (gathered.lm_head.packed is gathered.model.embed_tokens.table.packed) == tied
    for layer in gathered.model.layers:
        assert all(any(w is p for p in mine) for w, _ in layer._weights)
    assert not any(np.shares_memory(w, mine[0].base) for w in theirs)
    ids = torch.randint(0, V, (1, 9), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        assert torch.equal(gathered(ids).logits, apart(ids).logits)


def test_a_file_that_mixes_formats_within_a_projection(tiny: Any, tmp_path: Path) -> None:
    """q, k, v (and gate, up) of different formats, as a Q4_K_M file keeps
    attn_v: each its own product; the same function as the twin, in torch's
    operations and in the Rust layer."""
    path = tmp_path / "mixed.gguf"
    types = {"blk.0.attn_v.weight": "Q8_0", "blk.1.ffn_up.weight": "Q4_0"}
    twin = write_llama(tiny, path, linear_type="Q4_1", types=types)
    model, _ = load_gguf(path, tokenizer=False)
    assert len(model.model.layers[0].qkv) == 3 and len(model.model.layers[1].gate_up) == 2
    # the Rust layer takes them as they are, no rows copied: layer 0's q, k, v
    # apart and gate_up stacked; layer 1's all apart (its k rows fill no stripe of 64)
    assert [len(layer._weights) for layer in model.model.layers] == [6, 7]
    ids = torch.randint(0, V, (1, 8), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        want = twin(ids).logits
        for use_cache in (True, False):  # torch's operations; the Rust layer
            torch.testing.assert_close(
                model(ids, use_cache=use_cache).logits,
                want,
                rtol=0,
                atol=1e-4 * float(want.abs().max()),
            )


def test_a_position_has_the_same_logits_alone_or_in_a_verification_batch(target: Any) -> None:
    """By construction: every value of a position comes from its own row in
    a fixed order, so one forward over 6 positions equals 6 forwards of one."""
    ids = torch.randint(0, V, (9,), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        one = runner.new_cache(target)
        runner.forward(target, ids[:3], one, keep=1)
        singles = torch.cat(
            [runner.forward(target, ids[i : i + 1], one, keep=1) for i in range(3, 9)]
        )
        batch = runner.new_cache(target)
        runner.forward(target, ids[:3], batch, keep=1)
        together = runner.forward(target, ids[3:], batch, keep=6)
    assert torch.equal(singles, together)


def test_a_long_prompt_is_prefilled_by_the_kernels_in_chunks(
    files: dict[str, tuple[Path, Any]], target: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prompt longer than a call's chunk, into an empty cache: every
    position on the kernels (no dense product), so the target is one
    function whatever the prompt's length; the same bits as the prompt fed
    in other pieces; close to the float32 twin (q8: to within its
    quantization). The model's own forward (a direct model(...) call) still
    prefills float32 activations by dense products: the float64 product of
    the file's values."""
    from specdec_rs.gguf.modules import QuantLinear
    from specdec_rs.runner import stack

    q8 = target.model.layers[0].o_proj.activations == "q8"
    rows: list[int] = []
    real = QuantLinear.dense

    def counted(self: QuantLinear, x: Any) -> Any:
        rows.append(x.shape[0])
        return real(self, x)

    monkeypatch.setattr(QuantLinear, "dense", counted)
    monkeypatch.setattr(stack, "CHUNK", 16)
    twin = files[target.test_file][1]
    n = 3 * 16 + 5
    ids = torch.randint(0, V, (n + 2,), generator=torch.Generator().manual_seed(7))
    with torch.inference_mode():
        cache = runner.new_cache(target)
        prefill = runner.forward(target, ids[:n], cache, keep=n)
        step = runner.forward(target, ids[n:], cache, keep=2)
        assert rows == []  # the kernels throughout
        pieces = runner.new_cache(target)
        first = runner.forward(target, ids[:7], pieces, keep=7)
        rest = runner.forward(target, ids[7:n], pieces, keep=n - 7)
        assert torch.equal(torch.cat([first, rest]), prefill)  # the chunking changes nothing
        want = twin(ids[None]).logits[0]
    got = torch.cat([prefill, step])
    tolerance = (0.05 if q8 else 1e-4) * float(want.abs().max())
    torch.testing.assert_close(got, want, rtol=0, atol=tolerance)
    # the dense product itself: the float64 product of the file's values
    layer = target.model.layers[0]
    module = layer.gate_up[0]
    x = torch.randn(n, module.in_features, generator=torch.Generator().manual_seed(8))
    w = module.dequantize_rows(torch.arange(module.out_features)).double()
    torch.testing.assert_close(real(module, x).double(), x.double() @ w.T, rtol=1e-5, atol=1e-5)


def test_greedy_output_agrees_after_a_long_prefill(target: Any) -> None:
    """Target-only and speculative decoding prefill a long prompt alike, so
    the greedy identity holds there too."""
    from specdec_rs.gguf.layer import DENSE_PREFILL

    for seed in range(2):
        head = prompt(seed, DENSE_PREFILL + 3)
        ids = torch.cat([head, head[:6]])  # a repeat for the lookup to find
        plain = sd.generate(target, None, ids, max_new_tokens=16, temperature=0, eos_token_id=[])
        out = sd.generate(
            target, sd.PromptLookup(), ids, max_new_tokens=16, k=4, temperature=0, eos_token_id=[]
        )
        assert out.tokens == plain.tokens, seed
        assert out.drafted > 0


def prompt(seed: int, n: int = 7) -> Any:
    return torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    "make",
    [
        lambda t: (sd.PromptLookup(), {"k": 4}),
        lambda t: (sd.EarlyExit(t, 1), {"k": 3}),
        lambda t: (sd.PromptLookup(), {"tree": 6}),
    ],
    ids=["prompt-lookup", "early-exit", "lookup-tree"],
)
def test_greedy_speculative_output_is_the_targets(target: Any, make: Any) -> None:
    drafter, kw = make(target)
    for seed in range(3):
        ids = torch.cat([prompt(seed), prompt(seed)[:4]])  # a repeat for the lookup to find
        plain = sd.generate(target, None, ids, max_new_tokens=20, temperature=0, eos_token_id=[])
        out = sd.generate(
            target, drafter, ids, max_new_tokens=20, temperature=0, eos_token_id=[], **kw
        )
        assert out.tokens == plain.tokens, seed
        assert out.drafted > 0


def test_heads_train_and_draft_on_a_gguf_target(target: Any, tmp_path: Path) -> None:
    """The training data (batched, padded generation), the training (the
    gradient through the draft vocabulary's quantized rows) and the
    drafting all run on the GGUF target; greedy output stays the target's."""
    from heads_fixtures import tiny_head
    from specdec_rs import drafters

    for kind, kw in (("eagle", {"depth": 2}), ("medusa", {"medusa_heads": 2})):
        path = tiny_head(target, tmp_path, kind, draft_vocab=40, steps_epochs=2.0, **kw)
        drafter = drafters.from_spec(f"{kind}:{path}", target, greedy=True)
        assert type(drafter.head if kind == "eagle" else drafter.heads).__name__
        ids = prompt(4)
        plain = sd.generate(target, None, ids, max_new_tokens=12, temperature=0, eos_token_id=[])
        out = sd.generate(
            target, drafter, ids, max_new_tokens=12, k=2, temperature=0, eos_token_id=[]
        )
        assert out.tokens == plain.tokens and out.drafted > 0


def test_sampled_generation_is_reproducible_and_in_range(target: Any) -> None:
    ids = prompt(5)
    a = sd.generate(target, sd.PromptLookup(), ids, max_new_tokens=16, temperature=0.8, seed=3)
    b = sd.generate(target, sd.PromptLookup(), ids, max_new_tokens=16, temperature=0.8, seed=3)
    assert a.tokens == b.tokens and all(0 <= t < V for t in a.tokens)


# ---- bad files ---------------------------------------------------------------------------


def _corrupt(source: Path, dest: Path, edit: Any) -> Path:
    body = bytearray(source.read_bytes())
    edit(body)
    dest.write_bytes(bytes(body))
    return dest


def test_bad_files_are_refused_naming_the_file_and_the_tensor(
    files: dict[str, tuple[Path, Any]], tiny: Any, tmp_path: Path
) -> None:
    good = files["Q4_1"][0]
    truncated = _corrupt(good, tmp_path / "cut.gguf", lambda b: b.__delitem__(slice(-100, None)))
    with pytest.raises(ValueError, match=r"cut.gguf is truncated: tensor .* ends at byte"):
        load_gguf(truncated, tokenizer=False)
    header = _corrupt(good, tmp_path / "head.gguf", lambda b: b.__delitem__(slice(40, None)))
    with pytest.raises(ValueError, match=r"head.gguf is corrupt or truncated"):
        load_gguf(header, tokenizer=False)
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"GGML" + bytes(100))
    with pytest.raises(ValueError, match="is not a GGUF file"):
        load_gguf(not_gguf, tokenizer=False)
    # another architecture
    arch = _corrupt(
        good,
        tmp_path / "arch.gguf",
        lambda b: b.__setitem__(slice(b.find(b"llama"), b.find(b"llama") + 5), b"mamba"),
    )
    with pytest.raises(ValueError, match="architecture is 'mamba'"):
        load_gguf(arch, tokenizer=False)
    # a tensor of a type no reader knows: its type id set to 99
    unknown = _corrupt(good, tmp_path / "type.gguf", _retype(b"blk.0.ffn_up.weight", 99))
    with pytest.raises(ValueError, match=r"tensor blk.0.ffn_up.weight has ggml type 99"):
        load_gguf(unknown, tokenizer=False)
    # shapes that disagree with the metadata: an MLP wider than its tensors
    wide = _corrupt(good, tmp_path / "wide.gguf", _set_metadata(b"llama.feed_forward_length", 256))
    with pytest.raises(ValueError, match=r"tensor blk.0.ffn_gate.weight has shape \[64, 128\]"):
        load_gguf(wide, tokenizer=False)


def _retype(name: bytes, ggml_type: int) -> Any:
    def edit(b: bytearray) -> None:
        at = b.find(name) + len(name)
        dims = struct.unpack_from("<I", b, at)[0]
        struct.pack_into("<I", b, at + 4 + 8 * dims, ggml_type)

    return edit


def _set_metadata(key: bytes, value: float, kind: str = "u32") -> Any:
    """An edit setting the uint32 ("u32") or float32 ("f32") metadata value of `key`."""
    type_id, fmt = {"u32": (4, "<I"), "f32": (6, "<f")}[kind]

    def edit(b: bytearray) -> None:
        at = b.find(key) + len(key)
        assert struct.unpack_from("<I", b, at)[0] == type_id  # a value of that type follows
        struct.pack_into(fmt, b, at + 4, value)

    return edit


def _k_quant_bytes(w: np.ndarray, qtype: Any) -> np.ndarray:
    """Random blocks of a K-quant for w's shape (gguf-py cannot quantize
    them): random quant bytes, small positive float16 super-block scales."""
    elems, size = gguf.GGML_QUANT_SIZES[qtype]
    rows, k = w.shape
    raw = np.random.default_rng(7).integers(0, 256, (rows, k // elems, size), dtype=np.uint8)
    scale = np.array([2.0**-8], dtype=np.float16).view(np.uint8)
    at = {"Q6_K": [size - 2], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q2_K": [size - 4, size - 2]}[
        qtype.name
    ]
    for offset in at:
        raw[..., offset : offset + 2] = scale
    return raw.reshape(rows, -1)


def _with_k_quants(quantize: Any) -> Any:
    """gguf-py's `quantize`, with random valid blocks for the K-quants and
    IQ4_NL, which it cannot write."""

    def quantize_k(w: np.ndarray, qtype: Any) -> np.ndarray:
        if qtype.name == "IQ4_NL":
            return _iq4_nl_bytes(w, np.random.default_rng(5))
        return _k_quant_bytes(w, qtype) if qtype.name.endswith("_K") else quantize(w, qtype)

    return quantize_k


@pytest.fixture(scope="module")
def k_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """A Q4_K_M-like file (rows of 256): Q4_K, Q5_K and Q6_K projections
    beside Q5_0, Q5_1, IQ4_NL and Q8_0 ones, and its float32 twin."""
    big = models.tiny_llama(vocab_size=V, hidden_size=256, num_layers=2, seed=2)
    path = tmp_path_factory.mktemp("kquant") / "k.gguf"
    kinds = {
        "blk.0.ffn_gate.weight": "Q4_K",
        "blk.0.ffn_up.weight": "Q5_K",
        "blk.0.ffn_down.weight": "Q6_K",
        "blk.0.attn_q.weight": "Q5_0",
        "blk.0.attn_k.weight": "Q5_1",
        "blk.1.attn_v.weight": "Q4_K",
        "blk.1.ffn_gate.weight": "IQ4_NL",
        "blk.1.ffn_down.weight": "Q6_K",
    }
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "quantize", _with_k_quants(gguf.quantize))
        twin = write_llama(big, path, linear_type="Q4_K", types=kinds)
    return path, twin


def test_k_quants_and_q5_are_read_natively_at_the_files_values(
    k_file: tuple[Path, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    path, twin = k_file
    model, _ = load_gguf(path, tokenizer=False)
    assert "no native kernel" not in capsys.readouterr().err
    for layer, name in (
        (0, "mlp.gate_proj"),
        (0, "mlp.up_proj"),
        (0, "self_attn.q_proj"),
        (1, "mlp.gate_proj"),
        (1, "mlp.down_proj"),
    ):
        rows, _, dequantize, _ = model.model.layers[layer].print_weights()[f"{name}.weight"]
        want = twin.model.layers[layer].get_submodule(name).weight.detach()
        assert torch.equal(dequantize(torch.arange(rows)), want), name  # bit for bit
    ids = torch.randint(0, V, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        want = twin(ids).logits
        got = model(ids).logits
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4 * float(want.abs().max()))
    # the same file with the new formats dequantized to float32 first: the
    # same function (float32 activations sum the same values in the same order)
    with pytest.MonkeyPatch.context() as patch:
        for t in (6, 7, 12, 13, 14, 20):
            patch.delitem(NATIVE_TYPES, t)
        dequantized, _ = load_gguf(path, tokenizer=False)
    with torch.inference_mode():
        assert torch.equal(dequantized(ids).logits, got)


@pytest.mark.parametrize("activations", ["f32", "q8"])
def test_greedy_speculation_on_k_quants_is_the_targets(
    k_file: tuple[Path, Any], activations: str
) -> None:
    model, _ = load_gguf(k_file[0], tokenizer=False, activations=activations)
    ids = torch.cat([prompt(3), prompt(3)[:4]])
    plain = sd.generate(model, None, ids, max_new_tokens=20, temperature=0, eos_token_id=[])
    for drafter in (sd.PromptLookup(), sd.EarlyExit(model, 1)):
        out = sd.generate(
            model, drafter, ids, max_new_tokens=20, temperature=0, eos_token_id=[], k=3
        )
        assert out.tokens == plain.tokens, type(drafter).__name__
        assert out.drafted > 0


def test_other_formats_are_read_through_float32_with_a_notice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gguf, "quantize", _with_k_quants(gguf.quantize))
    big = models.tiny_llama(vocab_size=V, hidden_size=256, num_layers=1, seed=2)
    path = tmp_path / "q2k.gguf"
    twin = write_llama(big, path, types={"blk.0.ffn_gate.weight": "Q2_K"})
    model, _ = load_gguf(path, tokenizer=False)
    assert "Q2_K has no native kernel" in capsys.readouterr().err
    ids = torch.randint(0, V, (1, 5), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        want = twin(ids).logits
        torch.testing.assert_close(
            model(ids).logits, want, rtol=0, atol=1e-4 * float(want.abs().max())
        )


def test_weights_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    assert models.weights_choice("auto", "float32", "cpu") == "gguf"
    assert models.weights_choice("auto", "bfloat16", "cpu") == "float32"
    with pytest.raises(ValueError, match="runs on the CPU in float32"):
        models.weights_choice("gguf", "bfloat16", "cpu")
    with pytest.raises(ValueError, match="weights = 'int4'"):
        models.weights_choice("int4", "float32", "cpu")


def test_the_thread_count_can_be_forced(target: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from specdec_rs.gguf.model import choose_threads

    monkeypatch.setenv("SPECDEC_KERNEL_THREADS", "1")
    assert choose_threads(target) == 1
    monkeypatch.setenv("SPECDEC_KERNEL_THREADS", "0")
    with pytest.raises(ValueError, match="SPECDEC_KERNEL_THREADS"):
        choose_threads(target)


def test_the_thread_probe_times_a_decode_row_and_a_verification_block(
    target: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe's products are the step's two largest weights at one row
    and at a k = 4 block, on both thread counts: one row alone is bound by
    the memory's bandwidth and chose 1 thread in a third of the loads on a
    two-core host where the step runs 1.3-1.8 times faster on 2."""
    from specdec_rs.gguf.model import BLOCK_ROWS, choose_threads
    from specdec_rs.gguf.modules import QuantLinear

    monkeypatch.delenv("SPECDEC_KERNEL_THREADS", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    seen: set[tuple[int, int, int]] = set()
    product = QuantLinear.product

    def recording(self: QuantLinear, rows: torch.Tensor) -> torch.Tensor:
        seen.add((id(self), rows.shape[0], self.threads))
        return product(self, rows)

    monkeypatch.setattr(QuantLinear, "product", recording)
    weights = [m for m in target.modules() if isinstance(m, QuantLinear)]
    before = [m.threads for m in weights]
    try:
        assert choose_threads(target, repeats=1) in (1, 2)
    finally:
        for m, t in zip(weights, before, strict=True):
            m.threads = t
    probed = {w for w, _, _ in seen}
    assert len(probed) == 2 and probed <= {id(m) for m in weights}
    assert {(n, t) for _, n, t in seen} == {(1, 1), (1, 2), (BLOCK_ROWS, 1), (BLOCK_ROWS, 2)}


@settings(max_examples=EXAMPLES)
@given(
    how=st.sampled_from(["cut", "flip", "append"]),
    at=st.integers(0, 2**20),
    value=st.integers(1, 255),
)
def test_damaged_gguf_bytes_are_refused(
    files: dict[str, tuple[Path, Any]],
    tmp_path_factory: pytest.TempPathFactory,
    how: str,
    at: int,
    value: int,
) -> None:
    """Bytes cut, flipped (in the header and metadata, the part that is
    parsed) or appended: a ValueError naming the file, or a model that loads."""
    body = bytearray(files["Q4_1"][0].read_bytes())
    if how == "cut":
        body = body[: at % len(body)]
    elif how == "flip":
        body[at % 2048] ^= value
    else:
        body += bytes([value]) * (1 + at % 64)
    path = tmp_path_factory.mktemp("damaged") / "model.gguf"
    path.write_bytes(bytes(body))
    with deadline():
        try:
            load_gguf(path, tokenizer=False)
        except ValueError as e:
            assert str(path) in str(e)


# ---- metadata of the wrong type, and the format's own rules (issue: hardening) -----------


def _written(tiny: Any, path: Path, monkeypatch: pytest.MonkeyPatch, **keys: Any) -> Path:
    """`tiny` written to `path` with metadata keys set to (value, GGUF type) pairs."""
    original = gguf.GGUFWriter.write_header_to_file

    def with_keys(self: Any, *args: Any, **kwargs: Any) -> None:
        for key, (value, kind, *sub) in keys.items():
            self.kv_data[0][key] = gguf.GGUFValue(value, kind, sub[0] if sub else None)
        original(self, *args, **kwargs)

    monkeypatch.setattr(gguf.GGUFWriter, "write_header_to_file", with_keys)
    write_llama(tiny, path)
    monkeypatch.undo()
    return path


T = gguf.GGUFValueType
WRONG_TYPES = [
    ("llama.vocab_size", ([64, 64], T.ARRAY, T.UINT32), "an integer"),
    ("llama.vocab_size", ("abc", T.STRING), "an integer"),
    ("llama.vocab_size", (64.0, T.FLOAT32), "an integer"),
    ("llama.block_count", (True, T.BOOL), "an integer"),
    ("llama.attention.layer_norm_rms_epsilon", (True, T.BOOL), "a finite number"),
    ("llama.attention.layer_norm_rms_epsilon", (float("nan"), T.FLOAT32), "a finite number"),
    ("llama.rope.freq_base", ("10000", T.STRING), "a finite number"),
    ("general.architecture", (7, T.UINT32), "a string"),
]


@pytest.mark.parametrize(("key", "value", "says"), WRONG_TYPES)
def test_metadata_of_the_wrong_type_is_refused_naming_the_file_and_key(
    tiny: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str, value: Any, says: str
) -> None:
    path = _written(tiny, tmp_path / "typed.gguf", monkeypatch, **{key: value})
    with pytest.raises(ValueError) as e:
        load_gguf(path, tokenizer=False)
    assert str(path) in str(e.value) and key in str(e.value) and says in str(e.value), e.value


def test_numeric_metadata_arrays_stay_numpy_views(
    tiny: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large numeric array key costs no copy (it was a Python list, 8x its bytes)."""
    from specdec_rs.gguf.reader import read

    big = np.arange(100_000, dtype=np.uint32)
    path = _written(
        tiny, tmp_path / "array.gguf", monkeypatch, big=(big.tolist(), T.ARRAY, T.UINT32)
    )
    value = read(path).metadata["big"]
    assert isinstance(value, np.ndarray) and value.dtype == np.uint32 and len(value) == 100_000
    assert not value.flags.writeable and np.array_equal(value, big)
    load_gguf(path, tokenizer=False)  # the model still loads


def _tensor_offset_at(b: bytearray, name: bytes) -> int:
    """Where tensor `name`'s offset field sits in the header."""
    at = b.find(name + struct.pack("<I", 2)) + len(name)  # 2-D: its dims field follows
    dims = struct.unpack_from("<I", b, at)[0]
    return at + 4 + 8 * dims + 4


def test_misaligned_overlapping_and_bool_alignment_files_are_refused(
    files: dict[str, tuple[Path, Any]],
    tiny: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    good = files["Q4_1"][0]
    name = b"blk.0.ffn_up.weight"

    def shift(by: int) -> Any:
        def edit(b: bytearray) -> None:
            at = _tensor_offset_at(b, name)
            struct.pack_into("<Q", b, at, struct.unpack_from("<Q", b, at)[0] + by)

        return edit

    misaligned = _corrupt(good, tmp_path / "misaligned.gguf", shift(4))
    with pytest.raises(ValueError, match=r"misaligned.gguf: tensor blk.0.ffn_up.weight's offset"):
        load_gguf(misaligned, tokenizer=False)

    def overlap(b: bytearray) -> None:  # ffn_up pointed at ffn_gate's bytes
        gate = struct.unpack_from("<Q", b, _tensor_offset_at(b, b"blk.0.ffn_gate.weight"))[0]
        struct.pack_into("<Q", b, _tensor_offset_at(b, name), gate)

    overlapping = _corrupt(good, tmp_path / "overlap.gguf", overlap)
    with pytest.raises(ValueError, match=r"overlap.gguf: tensors .* overlap"):
        load_gguf(overlapping, tokenizer=False)
    flagged = _written(
        tiny, tmp_path / "bool.gguf", monkeypatch, **{"general.alignment": (True, T.BOOL)}
    )
    with pytest.raises(ValueError, match=r"bool.gguf: general.alignment = True"):
        load_gguf(flagged, tokenizer=False)


def test_a_file_without_a_tokenizer_says_so(files: dict[str, tuple[Path, Any]]) -> None:
    path = files["Q4_1"][0]
    with pytest.raises(ValueError, match=r"holds no tokenizer \(no tokenizer.ggml.tokens\)"):
        load_gguf(path)


@pytest.mark.slow
def test_a_load_pauses_the_collector_and_leaves_it_as_it_found_it(
    files: dict[str, tuple[Path, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`load_gguf` builds with Python's cyclic collector off (`_collector`),
    then turns it back on, or leaves it off where the caller had it off."""
    import gc

    from specdec_rs.gguf import model as gguf_model

    seen: list[bool] = []
    build = gguf_model.build

    def watched(f: Any) -> Any:
        seen.append(gc.isenabled())
        return build(f)

    monkeypatch.setattr(gguf_model, "build", watched)
    assert gc.isenabled()
    load_gguf(files["Q4_1"][0], tokenizer=False)
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        load_gguf(files["Q4_1"][0], tokenizer=False)
        assert seen == [False, False] and not gc.isenabled()
    finally:
        gc.enable()


def test_a_damaged_tokenizer_cache_is_rebuilt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A cached tokenizer that cannot be read is said so on stderr, built
    again from the GGUF file and cached whole again (a small Gemma-style
    vocabulary: transformers builds it in milliseconds)."""
    from specdec_rs.gguf.model import tokenizer_folder, tokenizer_for
    from test_gguf_architectures import gemma_vocabulary

    path, cache = tmp_path / "vocab.gguf", tmp_path / "cache"
    size = gemma_vocabulary(path)
    built = tokenizer_for(path, cache)("def the")["input_ids"]
    folder = tokenizer_folder(path, cache)
    (folder / "tokenizer.json").write_text("{damaged")
    tok = tokenizer_for(path, cache)
    assert "cannot be read" in capsys.readouterr().err and len(tok) == size
    assert tok("def the")["input_ids"] == built
    assert tokenizer_for(path, cache)("def the")["input_ids"] == built  # cached whole again
    assert capsys.readouterr().err == ""


def test_a_tokenizer_folder_another_process_placed_meanwhile_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes that find no cached tokenizer both build it; the one
    that finishes second leaves the first one's folder in place (a third
    may be reading it) and removes its own, and its tokenizer still works."""
    from specdec_rs.gguf import model as gguf_model
    from test_gguf_architectures import gemma_vocabulary
    from transformers import AutoTokenizer

    path, cache = tmp_path / "vocab.gguf", tmp_path / "cache"
    gemma_vocabulary(path)
    folder = gguf_model.tokenizer_folder(path, cache)
    want = gguf_model.tokenizer_for(path, tmp_path / "elsewhere")("def the")["input_ids"]
    build = AutoTokenizer.from_pretrained

    def while_building(*args: Any, **kwargs: Any) -> Any:
        tok = build(*args, **kwargs)
        if "gguf_file" in kwargs:  # the other process places its folder now
            tok.save_pretrained(folder)
            (folder / "placed-by-the-other").write_text("")
        return tok

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", while_building)
    assert gguf_model.tokenizer_for(path, cache)("def the")["input_ids"] == want
    assert (folder / "placed-by-the-other").exists()
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]  # nothing left over
    monkeypatch.undo()
    assert gguf_model.tokenizer_for(path, cache)("def the")["input_ids"] == want


def test_the_tokenizer_cache_is_keyed_by_what_the_tokenizer_is_built_from(tmp_path: Path) -> None:
    """Copies, moves, other weights and other quantizations of one model share one
    tokenizer folder (SmolLM2's own among them); another architecture or a
    changed tokenizer value gets another; a file's architecture names the
    folder but never makes it a path."""
    import shutil

    from specdec_rs.gguf.model import tokenizer_folder
    from specdec_rs.gguf.reader import read
    from specdec_rs.gguf.writer import write_gguf

    def patched(source: Path, name: str, key: str, old: bytes, new: bytes) -> Path:
        """A copy of `source` whose value of `key` has `old` replaced by `new` (same length)."""
        start, end = read(source).spans[key]
        data = bytearray(source.read_bytes())
        value = bytes(data[start:end])
        assert old in value and len(old) == len(new)
        data[start:end] = value.replace(old, new)
        (tmp_path / name).write_bytes(bytes(data))
        return tmp_path / name

    a = tmp_path / "a.gguf"
    model = models.tiny_llama(vocab_size=49152, hidden_size=32, num_layers=1, seed=0)
    write_gguf(model, a, tokenizer=models.smollm2_gguf())
    folder = tokenizer_folder(a, tmp_path)
    assert folder.parent == tmp_path / "gguf-tokenizers" and folder.name.startswith("llama-")
    moved = tmp_path / "elsewhere" / "a.gguf"
    moved.parent.mkdir()
    shutil.copy(a, moved)
    os.utime(moved, ns=(1, 1))
    same = [moved, models.smollm2_gguf()]  # other weights, another quantization
    assert {tokenizer_folder(p, tmp_path) for p in same} == {folder}
    qwen2 = tokenizer_folder(
        patched(a, "c.gguf", "general.architecture", b"llama", b"qwen2"), tmp_path
    )
    assert qwen2.name.startswith("qwen2-") and qwen2 != folder
    eos = read(a).metadata["tokenizer.ggml.eos_token_id"]
    other_eos = patched(
        a, "d.gguf", "tokenizer.ggml.eos_token_id", struct.pack("<I", eos), struct.pack("<I", 1)
    )
    assert tokenizer_folder(other_eos, tmp_path) not in {folder, qwen2}
    slashed = patched(a, "e.gguf", "general.architecture", b"llama", b"../ma")
    assert tokenizer_folder(slashed, tmp_path).parent == tmp_path / "gguf-tokenizers"
    assert tokenizer_folder(slashed, tmp_path).name.startswith("___ma-")


def test_a_gguf_draft_model_speculates_exactly(
    files: dict[str, tuple[Path, Any]], k_file: tuple[Path, Any], tmp_path: Path
) -> None:
    """``model:DRAFT.gguf``: a separate GGUF draft (its own cache, the
    target's activation mode) gives target-only's greedy text, for a 32-block
    and a K-quant target; a draft of another vocabulary is refused."""
    draft_path = tmp_path / "draft.gguf"
    write_llama(models.tiny_llama(vocab_size=V, hidden_size=32, num_layers=1, seed=5), draft_path)
    for path in (files["Q4_1"][0], k_file[0]):
        for activations in ("f32", "q8"):
            target, _ = load_gguf(path, tokenizer=False, activations=activations)
            drafter = sd.drafters.DraftModel.from_spec(str(draft_path), target, None, False)
            assert gguf_activations(drafter.model) == activations
            ids = torch.cat([prompt(2), prompt(2)[:4]])
            kw: dict[str, Any] = {"max_new_tokens": 16, "temperature": 0, "eos_token_id": []}
            plain = sd.generate(target, None, ids, **kw)
            out = sd.generate(target, drafter, ids, k=3, **kw)
            assert out.tokens == plain.tokens and out.drafted > 0, (path.name, activations)
    other = tmp_path / "other.gguf"
    write_llama(models.tiny_llama(vocab_size=V + 16, hidden_size=32, num_layers=1), other)
    target, _ = load_gguf(files["Q4_1"][0], tokenizer=False)
    drafter = sd.drafters.DraftModel.from_spec(str(other), target, None, False)
    with pytest.raises(ValueError, match="LM head has 64 rows and the drafter's 80"):
        sd.generate(target, drafter, prompt(1), max_new_tokens=4, temperature=0, k=2)


def test_string_arrays_are_decoded_on_demand(tmp_path: Path) -> None:
    """`GGUFFile.strings` gives a string array's items (the metadata holds its
    length), non-ASCII included; a numeric array's item type is kept."""
    from specdec_rs.gguf.reader import read

    words = ["a", "", "Ġhello", "日本", "x" * 300]
    writer = gguf.GGUFWriter(str(tmp_path / "s.gguf"), "llama")
    writer.add_array("tokenizer.ggml.tokens", words)
    writer.add_array("tokenizer.ggml.token_type", [1, 2, 3, 4, 5])
    writer.add_tensor("x", np.zeros(32, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    f = read(tmp_path / "s.gguf")
    assert f.metadata["tokenizer.ggml.tokens"] == len(words)
    assert f.strings("tokenizer.ggml.tokens") == words
    assert f.items["tokenizer.ggml.token_type"] == gguf.GGUFValueType.INT32
    with pytest.raises(KeyError):
        f.strings("tokenizer.ggml.token_type")


def test_the_layer_refuses_cache_arrays_of_other_types(target: Any) -> None:
    """The Rust layer takes float32 or float16 caches, keys and values of
    one type, each array once: anything else is a ValueError naming it."""
    import numpy as np
    from specdec_rs import _core

    layer = target.model.layers[0]
    h, d = target.config.hidden_size, layer.head_dim
    x = np.zeros((1, h), np.float32)
    cos, sin = np.ones((1, d), np.float32), np.zeros((1, d), np.float32)

    def call(keys: Any, values: Any) -> None:
        _core.llama_layer(
            x, cos, sin, [keys], [values], [0], [1], None, layer._weights,
            *layer._norms, layer._dims, 1,
        )  # fmt: skip

    shape = (layer.kv_heads, 4, d)
    call(np.zeros(shape, np.float16), np.zeros(shape, np.float16))  # accepted
    with pytest.raises(ValueError, match=r"keys\[0\] is a float64 array.*float32 or float16"):
        call(np.zeros(shape), np.zeros(shape))
    with pytest.raises(ValueError, match="one type"):
        call(np.zeros(shape, np.float16), np.zeros(shape, np.float32))
    same = np.zeros(shape, np.float32)
    with pytest.raises(ValueError, match="pass each cache array once"):
        call(same, same)
    # q8_0 rows: uint8, 34 bytes per 32 values, for heads of a multiple of 32
    rows = (layer.kv_heads, 4, d // 32 * 34)
    if d % 32 == 0:
        call(np.zeros(rows, np.uint8), np.zeros(rows, np.uint8))  # accepted
        with pytest.raises(ValueError, match="bytes of q8_0 rows"):
            call(np.zeros(shape, np.uint8), np.zeros(shape, np.uint8))
        with pytest.raises(ValueError, match=r"uint8 \(q8_0\) but values\[0\] is float16"):
            call(np.zeros(rows, np.uint8), np.zeros(rows, np.float16))
    else:
        with pytest.raises(ValueError, match="blocks of 32 values"):
            call(np.zeros(shape, np.uint8), np.zeros(shape, np.uint8))


def test_the_rotary_table_holds_the_modules_bits(target: Any) -> None:
    """The stack looks a forward's rotary rows up in a table the model's own
    rotary module computed over all positions at once (`runner.stack.
    RotaryTable`): each row is the module's bits for that position in a call
    of any length (grown past its first rows), also at other head sizes; a
    rotary whose frequencies depend on the sequence gets no table."""
    import types

    from specdec_rs.runner.stack import RotaryTable, stack_of
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    with torch.inference_mode():
        stack = stack_of(target, runner.new_cache(target))
    assert stack is not None
    modules = [target.model.rotary_emb]
    for d in (8, 16, 128):
        config = LlamaConfig(hidden_size=4 * d, num_attention_heads=4, head_dim=d)
        modules.append(LlamaRotaryEmbedding(config))
    g = torch.Generator().manual_seed(4)
    for module in modules:
        table = stack.rotary if module is target.model.rotary_emb else RotaryTable(module)
        assert table is not None
        for n in (1, 2, 5, 17, 33):
            start = int(torch.randint(0, 3000, (1,), generator=g))
            at = torch.arange(start, start + n)
            d = module.inv_freq.numel() * 2
            cos, sin = module(torch.zeros(1, 1, d), at[None])
            got = table.rows(at.numpy())
            assert np.array_equal(got[0], cos[0].numpy()) and np.array_equal(got[1], sin[0].numpy())
    assert RotaryTable.of(types.SimpleNamespace(rope_type="dynamic")) is None
    assert RotaryTable.of(types.SimpleNamespace(rope_type="longrope")) is None


def test_a_cache_that_grows_keeps_every_rows_bits(files: dict[str, tuple[Path, Any]]) -> None:
    """The stack keeps a cache's key and value arrays between forwards
    (`Stack._arrays`) until a buffer is made or dropped anywhere: a cache of
    8 positions grown to 64 one step at a time, while another cache grows
    between its steps and its own buffers are once dropped and made again,
    gives the logits of one made large enough at once."""
    from specdec_rs.kv_cache import PreallocatedCache

    model, _ = load_gguf(files["Q4_1"][0], tokenizer=False)
    seq = torch.randint(0, V, (60,), generator=torch.Generator().manual_seed(8))
    layers = int(model.config.num_hidden_layers)
    with torch.inference_mode():
        big = PreallocatedCache(layers, capacity=128)
        want = runner.forward(model, seq, big, keep=len(seq))
        small, other = PreallocatedCache(layers, capacity=8), PreallocatedCache(layers, capacity=8)
        got = [runner.forward(model, seq[:3], small, keep=3)]
        for i in range(3, len(seq)):
            got.append(runner.forward(model, seq[i : i + 1], small, keep=1))
            if i % 7 == 0:  # another cache's buffers grow between this one's steps
                runner.forward(model, seq[:i], other, keep=1)
                runner.crop(other, 0)
            if i == 40:  # this one's buffers dropped and made again (as transformers assigns)
                for layer in small.layers:
                    k, v = layer.keys.clone(), layer.values.clone()
                    layer.keys = layer.values = None
                    layer.keys, layer.values = k, v
    assert torch.equal(torch.cat(got), want)
    for grown, made in zip(small.layers, big.layers, strict=True):  # written where it reads
        assert torch.equal(grown.keys, made.keys) and torch.equal(grown.values, made.values)
    assert small.layers[0]._k.shape[2] >= len(seq)  # grown (from 8, and from 41)


def test_a_tree_row_has_the_bits_of_its_chain_row(files: dict[str, tuple[Path, Any]]) -> None:
    """The same logits for a node of a draft tree and for its path decoded as
    a chain: a sibling branch puts node 4's ancestors at other cache slots
    (attention takes a row's keys in their own order: `rust/attention.rs`)."""
    model, _ = load_gguf(files["Q4_1"][0], tokenizer=False)
    seq = torch.randint(0, V, (40,), generator=torch.Generator().manual_seed(6))
    with torch.inference_mode():
        tree_cache = runner.new_cache(model)
        runner.forward(model, seq[:-1], tree_cache, keep=1)
        tokens, parents = torch.tensor([11, 12, 13, 14, 5, 6]), [-1, 0, 1, 2, 0, 4]
        tree, _ = runner.forward_tree(model, seq[-1:], tokens, parents, tree_cache)
        chain_cache = runner.new_cache(model)
        runner.forward(model, seq, chain_cache, keep=1)
        chain = runner.forward(model, torch.tensor([11, 5, 6]), chain_cache, keep=3)
    assert torch.equal(tree[[1, 5, 6]], chain)
