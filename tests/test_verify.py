"""The verifier: properties on random inputs, a chi-square suite for exactness
with its power against the known bugs, numerics, inputs and threads.

p = target, q = draft, k = γ.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import specdec_rs as sd
from conftest import chi2_pvalue, softmax
from hypothesis import assume, given
from hypothesis import strategies as st
from scipy import stats
from specdec_rs import _checks
from specdec_rs.reference import verify_batch_numpy, verify_numpy

SIGNIFICANCE = 1e-6  # per chi-square test; a suite of k + 2 tests alarms at <= 8e-6


# ---------------------------------------------------------------- random rounds


def random_rows(rng: np.random.Generator, n: int, v: int, sparsity: float) -> np.ndarray:
    """n probability rows over v tokens, with about `sparsity` of entries zero."""
    w = rng.gamma(0.5, size=(n, v)) * (rng.random((n, v)) >= sparsity)
    w[np.arange(n), rng.integers(0, v, n)] += 0.1  # at least one positive entry
    return w / w.sum(axis=1, keepdims=True)


@st.composite
def rounds(draw):  # type: ignore[no-untyped-def]
    v = draw(st.integers(1, 24))
    k = draw(st.integers(0, 6))
    sparsity = draw(st.sampled_from([0.0, 0.5, 0.9]))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    p = random_rows(rng, k + 1, v, sparsity).astype(dtype)
    q = random_rows(rng, k, v, sparsity).astype(dtype)
    drafts = np.array(
        [rng.choice(v, p=row / row.sum()) for row in q.astype(np.float64)], dtype=np.int64
    )
    return p, q.reshape(k, v), drafts, draw(st.integers(0, 2**64 - 1))


@given(rounds())
def test_round_properties(case) -> None:  # type: ignore[no-untyped-def]
    p, q, drafts, seed = case
    k = len(drafts)
    out = sd.verify(p, q, drafts, seed)
    n = len(out)
    assert out.dtype == np.int64
    assert 1 <= n <= k + 1
    assert np.array_equal(out[: n - 1], drafts[: n - 1])
    assert ((out >= 0) & (out < p.shape[1])).all()
    last = out[-1]
    p64, q64 = p.astype(np.float64), q.astype(np.float64)
    if n == k + 1:  # all accepted: the bonus has p > 0 (or the last draft was accepted)
        assert p64[k, last] > 0 or n - 1 < k
    else:  # rejected at position n - 1: a residual token
        i = n - 1
        residual = np.maximum(p64[i] - q64[i], 0)
        assert residual[last] > 0 or (residual.sum() == 0 and p64[i, last] > 0)
    assert np.array_equal(out, sd.verify(p, q, drafts, seed))  # deterministic
    assert np.array_equal(out, sd.verify(p, q, drafts, seed, check="full"))


@given(rounds())
def test_equal_p_and_q_accept_every_draft(case) -> None:  # type: ignore[no-untyped-def]
    p, _, drafts, seed = case
    k = len(drafts)
    q = p[:k]
    drafts = np.array([np.argmax(row) for row in q], dtype=np.int64)  # q(x) > 0
    out = sd.verify(p, q, drafts, seed)
    assert len(out) == k + 1
    assert np.array_equal(out[:k], drafts)


@given(rounds())
def test_one_hot_q_on_a_token_p_excludes_is_always_rejected(case) -> None:  # type: ignore[no-untyped-def]
    p, q, drafts, seed = case
    assume(len(drafts) > 0 and not (p[0] > 0).all())  # a draft, and a token p excludes
    x = int(np.flatnonzero(p[0] == 0)[0])
    q = np.zeros_like(q)
    q[np.arange(len(drafts)), drafts] = 1
    q[0] = 0
    q[0, x] = 1
    drafts = drafts.copy()
    drafts[0] = x
    out = sd.verify(p, q, drafts, seed)
    assert len(out) == 1 and out[0] != x and p[0, out[0]] > 0


@given(st.lists(rounds(), min_size=1, max_size=1), st.integers(1, 9), st.integers(0, 2**64 - 1))
def test_batch_equals_per_row_calls(cases, b: int, seed: int) -> None:  # type: ignore[no-untyped-def]
    p0, q0, d0, _ = cases[0]
    rng = np.random.default_rng(seed % 2**32)
    order = rng.permutation(b)  # rows that differ: shuffle one case's columns per row
    p = np.stack([np.roll(p0, int(s), axis=1) for s in order])
    q = np.stack([np.roll(q0, int(s), axis=1) for s in order])
    d = np.stack([(d0 + int(s)) % p0.shape[1] for s in order])
    tokens, num = sd.verify_batch(p, q, d, seed)
    assert tokens.shape == (b, len(d0) + 1) and num.shape == (b,)
    for row in range(b):
        single = sd.verify(p[row], q[row], d[row], seed=sd.row_seed(seed, row))
        assert num[row] == len(single)
        assert np.array_equal(tokens[row, : num[row]], single)
        assert (tokens[row, num[row] :] == -1).all()
    for threads in (1, 2, 3):
        t2, n2 = sd.verify_batch(p, q, d, seed, threads=threads)
        assert np.array_equal(t2, tokens) and np.array_equal(n2, num)


# ------------------------------------------------- exactness: chi-square suite


def exactness_pvalues(
    p: np.ndarray, q: np.ndarray, tokens: np.ndarray, num: np.ndarray
) -> list[float]:
    """p-values of: the round length law (with α_i = Σ min(p_i, q_i)), and for each
    position i, the emitted token given the first i drafts accepted follows p_i."""
    k, v = q.shape
    alphas = np.minimum(p[:k], q).sum(axis=1)
    length_law = np.array(
        [0.0]
        + [np.prod(alphas[: n - 1]) * (1 - alphas[n - 1]) for n in range(1, k + 1)]
        + [np.prod(alphas)]
    )
    out = [chi2_pvalue(np.bincount(num, minlength=k + 2), length_law)]
    for i in range(k + 1):
        reached = num > i
        out.append(chi2_pvalue(np.bincount(tokens[reached, i], minlength=v), p[i]))
    return out


def draw_drafts(q: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    cdf = np.cumsum(q, axis=1)
    u = rng.random((n, q.shape[0]))
    return np.stack(
        [np.minimum((cdf[i] <= u[:, i, None]).sum(1), q.shape[1] - 1) for i in range(q.shape[0])],
        axis=1,
    ).astype(np.int64)


CASES = ["dense", "one_hot_q", "sparse"]


def chi2_case(name: str, n: int = 200_000):  # type: ignore[no-untyped-def]
    """Fixed rows (k = 3, V = 6) of one kind, and n rounds' drafts sampled from q."""
    rng = np.random.default_rng(CASES.index(name) if name in CASES else 99)
    k, v = 3, 6
    p = softmax(rng.normal(size=(k + 1, v)) * 1.5)
    q = softmax(rng.normal(size=(k, v)) * 1.5)
    if name == "one_hot_q":  # greedy drafter: q one-hot on its argmax
        q = np.eye(v)[q.argmax(1)]
    if name == "sparse":
        p[:, :2] = 0
        p /= p.sum(1, keepdims=True)
    return p, q, draw_drafts(q, n, rng)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES)
def test_emitted_tokens_follow_p_at_every_position(case: str, dtype: type) -> None:
    p, q, drafts = chi2_case(case)
    n = len(drafts)
    pb = np.broadcast_to(p.astype(dtype), (n, *p.shape))
    qb = np.broadcast_to(q.astype(dtype), (n, *q.shape))
    tokens, num = sd.verify_batch(pb, qb, drafts, seed=7)
    pvalues = exactness_pvalues(p, q, tokens, num)
    assert min(pvalues) > SIGNIFICANCE, pvalues


def numpy_suite_min_pvalue(variant: str, seed: int) -> float:
    """The chi-square suite on the NumPy reference round with `variant`."""
    p, q, drafts = chi2_case("dense")
    n = len(drafts)
    tokens, num = verify_batch_numpy(
        np.broadcast_to(p, (n, *p.shape)),
        np.broadcast_to(q, (n, *q.shape)),
        drafts,
        np.random.default_rng(seed),
        variant=variant,
    )
    return min(exactness_pvalues(p, q, tokens, num))


def test_numpy_reference_passes_the_same_suite() -> None:
    assert numpy_suite_min_pvalue("exact", seed=8) > SIGNIFICANCE


@pytest.mark.parametrize("variant", [v for v in sd.VARIANTS if v not in ("exact", "block")])
def test_every_bug_fails_the_chi_square_suite(variant: str) -> None:
    assert numpy_suite_min_pvalue(variant, seed=9) < SIGNIFICANCE


def test_greedy_drafter_with_its_softmax_as_q_fails() -> None:
    """A drafter that emits its argmax is exact only with q one-hot; plugging in
    its softmax is the handout's bug, and the suite catches it."""
    p, q_soft, _ = chi2_case("dense")
    n = 200_000
    drafts = np.broadcast_to(q_soft.argmax(1), (n, q_soft.shape[0])).astype(np.int64)
    q_hot = np.eye(p.shape[1])[q_soft.argmax(1)]
    for q, exact in ((q_hot, True), (q_soft, False)):
        tokens, num = sd.verify_batch(
            np.broadcast_to(p, (n, *p.shape)), np.broadcast_to(q, (n, *q.shape)), drafts, seed=4
        )
        ok = min(exactness_pvalues(p, q_hot, tokens, num)) > SIGNIFICANCE
        assert ok == exact


def test_rust_and_numpy_single_round_agree_in_distribution() -> None:
    """verify() against the NumPy reference one round at a time: two-sample
    chi-square on (length, last token) at significance 1e-6."""
    p, q, _ = chi2_case("dense")
    rng = np.random.default_rng(10)
    n = 20_000
    drafts = draw_drafts(q, n, rng)
    cells = (q.shape[0] + 2) * p.shape[1]
    a, b = np.zeros(cells), np.zeros(cells)
    for i in range(n):
        r = sd.verify(p, q, drafts[i], seed=i)
        s = verify_numpy(p, q, drafts[i], rng)
        a[len(r) * p.shape[1] + r[-1]] += 1
        b[len(s) * p.shape[1] + s[-1]] += 1
    keep = (a + b) > 0
    _, pvalue, _, _ = stats.chi2_contingency(np.stack([a[keep], b[keep]]))
    assert pvalue > SIGNIFICANCE


# ---------------------------------------------------------------- numerics


def test_rounding_that_leaves_no_residual_mass_falls_back_to_p() -> None:
    """p <= q everywhere (p sums to 0.9995, inside float32's tolerance): a
    rejection (probability 0.001) has no residual mass; the token comes from p."""
    p = np.array([[0.4995, 0.5], [0.5, 0.5]], dtype=np.float32)
    q = np.array([[0.5, 0.5]], dtype=np.float32)
    rejected = 0
    for seed in range(20_000):
        out = sd.verify(p, q, [0], seed)
        assert out[0] in (0, 1)
        rejected += len(out) == 1
    assert 0 < rejected < 100  # about 20 expected


def test_k0_returns_one_token_from_p() -> None:
    p = np.array([[0.0, 0.0, 1.0]])
    for q in ([], np.zeros((0, 3))):
        assert sd.verify(p, q, [], seed=0).tolist() == [2]


def test_large_vocab_round_matches_the_numpy_reference_marginal() -> None:
    """V = 49,152 (float32): the first token's distribution over coarse buckets
    of 4,096 ids follows p_0 (chi-square, significance 1e-6)."""
    rng = np.random.default_rng(11)
    v, k, n = 49_152, 2, 4_000
    p = softmax(rng.normal(size=(k + 1, v)) * 2).astype(np.float32)
    q = softmax(rng.normal(size=(k, v)) * 2).astype(np.float32)
    drafts = draw_drafts(q.astype(np.float64), n, rng)
    firsts = np.array([sd.verify(p, q, drafts[i], seed=i)[0] for i in range(n)])
    buckets = p[0].astype(np.float64).reshape(12, -1).sum(1)
    assert (
        chi2_pvalue(np.bincount(firsts // 4096, minlength=12), buckets / buckets.sum())
        > SIGNIFICANCE
    )


# ---------------------------------------------------------------- inputs


def test_contiguous_inputs_are_not_copied() -> None:
    torch = pytest.importorskip("torch")
    for dtype in (np.float32, np.float64):
        a = np.ones((3, 4), dtype=dtype) / 4
        assert _checks.prob_array(a, "p", 2)[0] is a
        t = torch.from_numpy(a)
        assert np.shares_memory(_checks.prob_array(t, "p", 2)[0], a)
    assert _checks.prob_array(np.ones((4, 3)).T, "p", 2)[0].flags.c_contiguous  # copied when needed
    f64 = np.ones((2, 2)) / 2
    assert _checks.prob_array(f64, "p", 2)[0].dtype == np.float64  # never narrowed to float32


def test_torch_cpu_tensors_give_the_numpy_result() -> None:
    torch = pytest.importorskip("torch")
    p, q, drafts = chi2_case("dense", n=50)
    for dtype in (torch.float32, torch.float64):
        pt = torch.tensor(p, dtype=dtype, requires_grad=True)
        qt = torch.tensor(q, dtype=dtype)
        for i in range(50):
            expect = sd.verify(pt.detach().numpy(), qt.numpy(), drafts[i], seed=i)
            got = sd.verify(pt, qt, torch.from_numpy(drafts[i]), seed=i)
            assert np.array_equal(got, expect)


def test_mixed_precisions_are_read_as_they_are() -> None:
    """float32 p with float64 q (and back) give the same tokens as float64 both,
    and each row is checked with its own precision's tolerance."""
    p, q, drafts = chi2_case("dense", n=50)
    p32, q32 = p.astype(np.float32), q.astype(np.float32)
    for i in range(50):
        both = sd.verify(p32.astype(np.float64), q, drafts[i], seed=i)
        assert np.array_equal(sd.verify(p32, q, drafts[i], seed=i), both)
        both = sd.verify(p, q32.astype(np.float64), drafts[i], seed=i)
        assert np.array_equal(sd.verify(p, q32, drafts[i], seed=i), both)
    off = p32.copy()
    off[0] *= 1.0005  # inside float32's 1e-3, outside float64's 1e-6
    assert len(sd.verify(off, q, drafts[0], seed=0)) >= 1
    with pytest.raises(ValueError, match="expected 1 ± 1e-6"):
        sd.verify(off.astype(np.float64), q, drafts[0], seed=0, check="full")


def test_the_gil_is_released_during_rust_work() -> None:
    """While simulate runs on another thread, this thread keeps running Python."""
    from conftest import P_TABLE, Q_TABLE

    done = threading.Event()

    def work() -> None:
        sd.simulate_round_lengths(P_TABLE, Q_TABLE, k=2, rounds=8_000_000, threads=1)
        done.set()

    worker = threading.Thread(target=work)
    start = time.perf_counter()
    worker.start()
    ticks = 0
    while not done.is_set():
        ticks += 1
        time.sleep(0)
    worker.join()
    assert time.perf_counter() - start > 0.2  # the Rust call did run a while
    assert ticks > 1000


def test_verify_device_equals_verify() -> None:
    """The two-transfer path (gathered values, then only the sampled rows) gives
    the tokens `verify` gives on the same values and seed; run here on CPU
    tensors, the same code runs on an accelerator."""
    torch = pytest.importorskip("torch")
    p, q, drafts = chi2_case("dense", n=400)
    for dtype in (torch.float32, torch.float64):
        pt, qt = torch.tensor(p, dtype=dtype), torch.tensor(q, dtype=dtype)
        lengths = set()
        for i in range(400):
            d = torch.from_numpy(drafts[i])
            expect = sd.verify(pt, qt, d, seed=i)
            got = sd.verify_device(pt, qt, d, seed=i)
            assert np.array_equal(got, expect), i
            lengths.add(len(got))
        assert lengths == {1, 2, 3, 4}  # rejections at every position, and bonus tokens
    with pytest.raises(ValueError, match=r"drafts\[1\] = 9 is outside the vocabulary \[0, 6\)"):
        sd.verify_device(torch.tensor(p), torch.tensor(q), torch.tensor([0, 9, 1]), seed=0)
    with pytest.raises(ValueError, match="has a non-finite value"):
        bad = torch.tensor(p)
        bad[3] = float("nan")  # the bonus row
        sd.verify_device(bad, torch.tensor(p[:3]), torch.tensor([0, 1, 2]), seed=0)


@given(rounds(), st.integers(0, 6))
def test_verify_greedy_is_verify_on_one_hot_target_rows(case, agree: int) -> None:  # type: ignore[no-untyped-def]
    """A greedy target's rows are one-hot at their argmaxes: `verify_greedy`
    on the argmaxes gives what `verify` gives on those rows, whatever the seed
    and q, its drafts agreeing with the argmaxes for `agree` positions, then
    not; and both refuse the same drafts that q gives no mass."""
    _, q, drafts, seed = case
    k, v = len(drafts), q.shape[1]
    rng = np.random.default_rng(seed % 2**32)
    argmaxes = rng.integers(0, v, k + 1)
    argmaxes[: min(agree, k)] = drafts[: min(agree, k)]
    p = np.eye(v, dtype=q.dtype)[argmaxes]
    for s in (seed, seed ^ 1):
        try:
            expect = sd.verify(p, q, drafts, s)
        except ValueError:
            with pytest.raises(ValueError, match="cannot have been sampled from q"):
                sd.verify_greedy(argmaxes, q, drafts)
            continue
        assert np.array_equal(sd.verify_greedy(argmaxes, q, drafts), expect)


def test_verify_greedy_reads_only_the_drafts_it_tests() -> None:
    """Like `verify`: a draft after the first rejected one is never tested, so
    q's mass there is not read; a tested draft with q = 0 is refused."""
    q = np.eye(5)[[2, 3, 4]]
    q_wrong_late = q.copy()
    q_wrong_late[2] = np.eye(5)[0]  # draft 2 (= 4) has q = 0 there
    drafts = np.array([2, 3, 4])
    argmaxes = np.array([2, 1, 4, 0])  # draft 1 rejected: emits 1; draft 2 never tested
    for rows in (q, q_wrong_late):
        assert sd.verify_greedy(argmaxes, rows, drafts).tolist() == [2, 1]
        assert sd.verify(np.eye(5)[argmaxes], rows, drafts, seed=3).tolist() == [2, 1]
    assert sd.verify_greedy([2, 3, 4, 0], q, drafts).tolist() == [2, 3, 4, 0]  # all kept: bonus
    assert sd.verify_greedy([4], np.zeros((0, 5)), []).tolist() == [4]  # k = 0
    q_wrong_first = q.copy()
    q_wrong_first[1] = np.eye(5)[0]  # draft 1 (= 3) has q = 0 and is tested
    for call in (
        lambda: sd.verify_greedy(argmaxes, q_wrong_first, drafts),
        lambda: sd.verify(np.eye(5)[argmaxes], q_wrong_first, drafts, seed=3),
    ):
        with pytest.raises(ValueError, match=r"drafts\[1\] = 3 has probability 0"):
            call()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (([1, 2], np.eye(5)[[1, 2]], [1, 2]), "p_argmax has 2 entries for 2 drafts"),
        (([1, 2, 3], np.eye(5)[[1]], [1, 2]), r"q_rows has shape \(1, 5\)"),
        (([1, 2, 3], np.eye(5, dtype=int)[[1, 2]], [1, 2]), "expected float rows"),
        (([1, 2, 7], np.eye(5)[[1, 2]], [1, 2]), r"p_argmax holds ids outside \[0, 5\)"),
        (([7], np.zeros((0, 5)), []), r"p_argmax holds ids outside \[0, 5\)"),  # k = 0
        (([1, 2, 3], np.eye(5)[[1, 2]], [1, -2]), r"drafts holds ids outside \[0, 5\)"),
        (([1.5, 2, 3], np.eye(5)[[1, 2]], [1, 2]), "p_argmax has dtype float64"),
    ],
)
def test_verify_greedy_refuses_bad_inputs(args, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        sd.verify_greedy(*args)
