"""The Rust product for linear layers (`kernels`, `_core.linear_f32`): its
values against float64, its fixed summation order (a row gives the same bits
alone or in a batch), torch's path wherever the Rust one does not apply, and
a model whose layers are switched gives torch's logits and greedy tokens."""

from __future__ import annotations

import numpy as np
import pytest
from specdec_rs import _core, generate, kernels, models, runner

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(
    not kernels.rust_available(), reason="the CPU has no AVX2 + FMA; the Rust product is off"
)


@pytest.mark.parametrize(
    ("n", "k", "m"), [(1, 1, 1), (2, 7, 5), (3, 64, 9), (4, 576, 193), (9, 45, 70)]
)
def test_product_matches_float64(n: int, k: int, m: int) -> None:
    rng = np.random.default_rng(n * 1000 + k)
    x = rng.standard_normal((n, k)).astype(np.float32)
    w = rng.standard_normal((m, k)).astype(np.float32)
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    # float32 sums of k terms: error ≤ k·eps·Σ|x·w| (a loose, always-true bound)
    bound = k * np.finfo(np.float32).eps * (np.abs(x) @ np.abs(w).T) + 1e-30
    assert np.all(np.abs(kernels.linear(x, w) - exact) <= bound)


def test_a_row_gives_the_same_bits_alone_or_in_a_batch() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((7, 100)).astype(np.float32)
    w = rng.standard_normal((70, 100)).astype(np.float32)
    batch = kernels.linear(x, w)
    for r in range(7):
        np.testing.assert_array_equal(kernels.linear(x[r : r + 1], w)[0], batch[r])


def test_bad_input_is_a_value_error() -> None:
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError, match=r"x is float64; expected float32"):
        kernels.linear(np.ones((2, 3)), x)
    with pytest.raises(ValueError, match=r"w must be a 2-D NumPy array"):
        kernels.linear(x, np.ones(3, np.float32))
    with pytest.raises(ValueError, match=r"expected x \(n, k\) and w \(m, k\) with the same k"):
        kernels.linear(x, np.ones((2, 4), np.float32))
    # the raw binding checks shapes and layout itself
    with pytest.raises(ValueError, match=r"expected x \(n, k\), w \(m, k\) and out \(n, m\)"):
        _core.linear_f32(x, x, np.empty((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"C-contiguous"):
        _core.linear_f32(np.ones((3, 2), np.float32).T, x, np.empty((2, 2), np.float32))
    # a transposed view is copied to C order by the checked function
    np.testing.assert_array_equal(
        kernels.linear(np.ones((3, 2), np.float32).T, x), np.full((2, 2), 3.0, np.float32)
    )


@pytest.fixture(scope="module")
def tiny() -> torch.nn.Module:
    return models.tiny_llama(vocab_size=96, hidden_size=48, num_layers=2, seed=3)


def test_switching_keeps_the_weights_and_counts_the_layers(tiny: torch.nn.Module) -> None:
    linears = sum(type(m) is torch.nn.Linear for m in tiny.modules())
    keys = list(tiny.state_dict())
    try:
        assert kernels.use_rust_linears(tiny) == linears
        assert kernels.rust_rows(tiny) == kernels.MAX_ROWS
        assert list(tiny.state_dict()) == keys
        assert kernels.use_torch_linears(tiny) == linears
        assert kernels.rust_rows(tiny) is None
        assert kernels.apply_linear_choice(tiny, "rust") == linears
        assert kernels.apply_linear_choice(tiny, "torch") == 0
        assert kernels.rust_rows(tiny) is None
    finally:
        kernels.use_torch_linears(tiny)
    with pytest.raises(ValueError, match=r"linear = 'fast'; expected one of auto, rust, torch"):
        kernels.apply_linear_choice(tiny, "fast")
    with pytest.raises(ValueError, match=r"expected a torch.nn.Module"):
        kernels.use_rust_linears("model")
    with pytest.raises(ValueError, match=r"max_rows"):
        kernels.use_rust_linears(tiny, max_rows=1)
    big = torch.nn.Sequential(torch.nn.Linear(8, kernels.LARGE_WEIGHT // 8, bias=False))
    kernels.use_rust_linears(big, max_rows=3)
    assert big[0].max_rows == kernels.LARGE_MAX_ROWS  # an LM-head-sized weight
    half = models.tiny_llama(vocab_size=96, hidden_size=48, num_layers=1, dtype=torch.bfloat16)
    assert kernels.use_rust_linears(half) == 0  # bfloat16 weights keep torch's product


def test_the_layer_takes_the_rust_path_only_where_it_applies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    layer = torch.nn.Linear(16, 8, bias=True)
    kernels.use_rust_linears(layer)
    calls = []
    real = _core.linear_f32

    def counted(*args: object) -> None:
        calls.append(1)
        real(*args)

    monkeypatch.setattr(_core, "linear_f32", counted)
    x = torch.randn(2, 3, 16)
    with torch.inference_mode():
        small = layer(x[:1, :2])  # 2 rows, with the bias
        assert len(calls) == 1
        want = torch.nn.functional.linear(x[:1, :2], layer.weight, layer.bias)
        torch.testing.assert_close(small, want, rtol=1e-6, atol=1e-6)
        layer(x)  # 6 rows: more than MAX_ROWS
        layer(torch.randn(16, 2).T)  # 2 rows, not contiguous
        layer(x[0, 0])  # 1 row: torch's two-thread product is as fast
    assert len(calls) == 1
    out = layer(x[:1, :1])  # autograd on: torch's path, gradients flow
    out.sum().backward()
    assert layer.weight.grad is not None and len(calls) == 1


def last_three_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Logits of a cached forward over the last 3 of `ids` (the Rust path's rows)."""
    with torch.inference_mode():
        cache = runner.new_cache(model)
        runner.forward(model, ids[:-3], cache, keep=1)
        return runner.forward(model, ids[-3:], cache, keep=3)


def test_a_switched_model_gives_torch_logits_and_greedy_tokens(tiny: torch.nn.Module) -> None:
    ids = torch.tensor([1, 5, 9, 2, 7, 3])
    want = last_three_logits(tiny, ids)
    reference = generate(tiny, None, ids, max_new_tokens=24, temperature=0.0, seed=0).tokens
    try:
        kernels.use_rust_linears(tiny)
        got = last_three_logits(tiny, ids)
        tokens = generate(tiny, None, ids, max_new_tokens=24, temperature=0.0, seed=0).tokens
    finally:
        kernels.use_torch_linears(tiny)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert tokens == reference


def test_heads_follow_their_target(tiny: torch.nn.Module) -> None:
    head = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    try:
        kernels.use_rust_linears(tiny, max_rows=3)
        assert kernels.follow(head, tiny) == 2
        assert kernels.rust_rows(head) == 3
    finally:
        kernels.use_torch_linears(tiny)
    assert kernels.follow(head, tiny) == 0
    assert kernels.rust_rows(head) is None


def test_loaders_check_the_choice_before_any_work() -> None:
    with pytest.raises(ValueError, match=r"linear = 'mkl'"):
        models.load_local("/nonexistent", linear="mkl")
    with pytest.raises(ValueError, match=r"linear = 'mkl'"):
        models.load_smollm2(linear="mkl")


def test_a_switched_model_pickles_and_runs_under_no_grad() -> None:
    import io

    layer = torch.nn.Linear(16, 8)
    kernels.use_rust_linears(layer)
    buffer = io.BytesIO()
    torch.save(layer, buffer)
    buffer.seek(0)
    again = torch.load(buffer, weights_only=False)
    assert type(again) is kernels.rust_linear_class()
    x = torch.randn(3, 16, requires_grad=True)  # a leaf that wants gradients, under no_grad
    with torch.no_grad():
        torch.testing.assert_close(
            again(x), torch.nn.functional.linear(x, layer.weight, layer.bias)
        )
