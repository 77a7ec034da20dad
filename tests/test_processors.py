"""The shared processors equal transformers' warpers; prompt lookup finds the
longest earlier match."""

from __future__ import annotations

import numpy as np
import pytest
from specdec_rs.drafters import lookup
from specdec_rs.processors import Sampler, SamplingConfig, argmax, logits_to_probs

torch = pytest.importorskip("torch")
lp = pytest.importorskip("transformers.generation.logits_process")


def hf_probs(logits: torch.Tensor, c: SamplingConfig) -> torch.Tensor:
    warpers = [lp.TemperatureLogitsWarper(c.temperature)]
    if c.top_k is not None:
        warpers.append(lp.TopKLogitsWarper(c.top_k))
    if c.top_p is not None:
        warpers.append(lp.TopPLogitsWarper(c.top_p))
    if c.min_p is not None:
        warpers.append(lp.MinPLogitsWarper(c.min_p))
    scores = logits.clone()
    for w in warpers:
        scores = w(None, scores)
    return scores.softmax(-1)


@pytest.mark.parametrize(
    "config",
    [
        SamplingConfig(1.0),
        SamplingConfig(0.7, top_k=20),
        SamplingConfig(0.7, top_p=0.9),
        SamplingConfig(1.3, top_k=50, top_p=0.8),
        SamplingConfig(0.5, min_p=0.1),
        SamplingConfig(0.9, top_k=10, top_p=0.95, min_p=0.05),
    ],
)
def test_processors_match_transformers(config: SamplingConfig) -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 1000, generator=g) * 3
    logits[0, :3] = 4.0  # ties at the top-k boundary
    ours = logits_to_probs(logits, config)
    torch.testing.assert_close(ours, hf_probs(logits, config), rtol=1e-5, atol=1e-7)
    assert torch.allclose(ours.sum(-1), torch.ones(5))


def test_greedy_is_one_hot_at_the_first_argmax() -> None:
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0]])
    assert logits_to_probs(logits, SamplingConfig(0)).tolist() == [[0.0, 1.0, 0.0, 0.0]]


def test_greedy_tokens_are_the_greedy_rows_argmaxes_with_the_same_checks() -> None:
    """`Sampler.greedy_tokens`: the argmax of each one-hot row `probs` gives
    at temperature 0 (ties, a padded LM head's extra logits, float16, views),
    and the same ValueError for a row with a NaN, a +inf or no finite logit;
    refused for a sampling config."""
    g = torch.Generator().manual_seed(0)
    sampler = Sampler(SamplingConfig(0), 40, g)
    logits = torch.randint(-3, 4, (6, 48), generator=g).float()
    logits[0, 41] = 9.0  # beyond the vocabulary (padding): not a candidate
    for x in (logits, logits.half(), logits[::2], logits[None]):
        want = sampler.probs(x).argmax(-1)
        assert torch.equal(sampler.greedy_tokens(x), want)
    for bad in (float("nan"), float("inf")):
        x = logits.clone()
        x[3, 7] = bad
        with pytest.raises(ValueError, match="logits row 3 has a NaN, a \\+inf"):
            sampler.probs(x)
        with pytest.raises(ValueError, match="logits row 3 has a NaN, a \\+inf"):
            sampler.greedy_tokens(x)
    x = logits.clone()
    x[4] = float("-inf")
    with pytest.raises(ValueError, match="logits row 4 has a NaN"):
        sampler.greedy_tokens(x)
    with pytest.raises(ValueError, match="needs a greedy config"):
        Sampler(SamplingConfig(0.8), 40, g).greedy_tokens(logits)


def test_argmax_is_torchs_on_ties_nan_inf_views_and_other_dtypes() -> None:
    """`processors.argmax` (NumPy's on float32 CPU rows) returns torch.argmax's
    indices and dtype: the first of tied maxima, a NaN as the largest, +inf
    and all -inf rows, strided views, 1..3 dimensions, other dtypes."""
    g = torch.Generator().manual_seed(0)
    cases = [
        torch.randint(-2, 3, shape, generator=g).float() for shape in [(7,), (4, 9), (2, 3, 49152)]
    ]
    odd = torch.randn(5, 10, generator=g)
    odd[1, [3, 7]] = float("nan")
    odd[2, 5] = float("inf")
    odd[3] = float("-inf")
    cases += [odd, odd[:, ::3], odd.t(), odd.double(), odd.half(), torch.randint(0, 4, (3, 8))]
    for x in cases:
        got, want = argmax(x), x.argmax(dim=-1)
        assert torch.equal(got, want) and got.dtype == want.dtype == torch.int64, x.dtype
    with torch.enable_grad():
        x = torch.randn(2, 6, requires_grad=True)
        assert torch.equal(argmax(x), x.argmax(-1))


def test_top_k_and_top_p_on_the_cpu_drop_what_the_full_sort_drops() -> None:
    """The CPU's top-k (a partition) and top-p (the cut looked for among the
    largest scores) drop the tokens transformers' sort-based warpers drop:
    peaky and flat rows (cuts below the first 256 candidates), rounded
    scores (ties, some across the cut: those rows take the full sort), rows
    after top-k (-inf scores), 2..49,152 tokens."""
    from specdec_rs import processors

    g = torch.Generator().manual_seed(3)
    for trial in range(60):
        v = 49152 if trial % 10 == 0 else int(torch.randint(2, 3000, (1,), generator=g))
        x = torch.randn(3, v, generator=g) * float(torch.rand(1, generator=g) * 8)
        if trial % 4 == 0:
            x = torch.round(x)
        k = min(50, v)
        kth = processors._kth_largest(x, k)
        assert torch.equal(kth, torch.topk(x, k, dim=-1).values[..., -1:])
        if trial % 3 == 0:
            x = x.masked_fill(x < kth, float("-inf"))
        top_p = float(torch.rand(1, generator=g)) * 0.999 + 0.0005
        want = processors._top_p_drop_sorted(x, top_p)
        assert torch.equal(processors._top_p_drop(x, top_p), want), (trial, v, top_p)
        assert torch.equal(processors._top_p_drop(x[0], top_p), want[0])
    # a tie across the cut: torch.sort's order decides, as in transformers
    tied = torch.tensor([[0.0, 2.0, 2.0, 2.0, -1.0]])
    assert torch.equal(processors._top_p_drop(tied, 0.5), processors._top_p_drop_sorted(tied, 0.5))


def test_lookup_takes_the_longest_match() -> None:
    seq = np.array([1, 2, 3, 4, 9, 2, 3, 5, 6, 1, 2, 3])
    # "2 3" occurs twice earlier, "1 2 3" once (at the start): copy what followed it
    assert lookup(seq, 3, 1, 8).tolist() == [4, 9, 2]
    assert lookup(seq, 3, 4, 8).tolist() == []  # no 4-token match
    assert lookup(np.array([5, 7, 5]), 4, 1, 3).tolist() == [7, 5]
    assert lookup(np.array([5]), 4, 1, 3).tolist() == []
    first_last = np.array([8, 1, 2, 8, 3, 4, 8])
    assert lookup(first_last, 2, 1, 3).tolist() == [1, 2]
    assert lookup(first_last, 2, 1, 3, first=False).tolist() == [3, 4]


def test_row_max_is_torchs_amax_with_its_nans() -> None:
    """`processors.row_max` (NumPy on float32 CPU rows) gives `amax`'s
    numbers: a NaN anywhere in a row makes it NaN, +inf and an all -inf row
    come through; float64 and autograd rows take torch's own."""
    from specdec_rs.processors import row_max

    rows = torch.randn(4, 49_152, generator=torch.Generator().manual_seed(2))
    rows[1, 7] = float("nan")
    rows[2, 40_000] = float("inf")
    rows[3] = float("-inf")
    for x in (rows, rows.double(), rows[0].clone().requires_grad_()):
        got, want = row_max(x), x.amax(dim=-1, keepdim=True)
        assert got.shape == want.shape and got.dtype == want.dtype
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0))
    assert bool(row_max(rows)[1].isnan()) and float(row_max(rows)[2]) == float("inf")
