"""Adversarial arguments for every public function and constructor.

Each call must either return a valid result (checked: shapes, ranges, the
law it promises where that is cheap to check) or raise ValueError. Any other
exception fails, and so does a call that runs longer than CALL_SECONDS (an
alarm interrupts it). Arguments start valid; hypothesis replaces one or two of
them with an odd value (wrong types, NumPy scalars, NaN/inf, negative, empty,
huge, wrong shapes and dtypes, non-contiguous, read-only and big-endian
arrays, torch tensors of odd dtypes and devices) or a broken variant of the
same argument (a NaN planted in a row, a row scaled off 1, ...).
p = target, q = draft, k = γ.
"""

from __future__ import annotations

import math
import operator
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import specdec_rs as sd
from conftest import P_TABLE, Q_TABLE
from hypothesis import given, settings
from hypothesis import strategies as st
from specdec_rs import models, theory
from specdec_rs.measure import acceptance as measure
from specdec_rs.measure.predict import forecast
from specdec_rs.policy import AdaptiveK, FixedK, HeuristicK
from specdec_rs.prompts import workloads

torch = pytest.importorskip("torch")

CALL_SECONDS = 10.0
# examples per function; SPECDEC_FUZZ_EXAMPLES=2000 (with --hypothesis-seed=N) digs deeper
EXAMPLES = int(os.environ.get("SPECDEC_FUZZ_EXAMPLES", "60"))


class TookTooLong(Exception):
    pass


@contextmanager
def deadline(seconds: float = CALL_SECONDS) -> Iterator[None]:
    def ring(signum: int, frame: Any) -> None:
        raise TookTooLong(f"call ran past {seconds} s")

    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def outcome(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[bool, Any]:
    """(True, result) or (False, the ValueError); anything else propagates."""
    with deadline():
        try:
            return True, fn(*args, **kwargs)
        except ValueError as e:
            assert str(e), "a ValueError without a message"
            return False, e


# ---- odd values -------------------------------------------------------------------------


def _arrays() -> list[Any]:
    big_endian = np.array([[0.5, 0.5], [0.25, 0.75]], dtype=">f8")
    read_only = np.array([[0.5, 0.5], [0.5, 0.5]])
    read_only.setflags(write=False)
    return [
        np.array([]),
        np.zeros((0, 3)),
        np.zeros((2, 0)),
        np.array(0.5),
        np.full((2, 3), np.nan),
        np.full((2, 3), np.inf),
        np.full((2, 3), -1.0 / 3),
        np.ones((2, 3), dtype=np.float16) / 3,
        np.ones((2, 3), dtype=np.complex128) / 3,
        np.array([[0.5, "a"]], dtype=object),
        np.ones((3, 3, 3)) / 3,
        np.ones((6, 4))[::2, ::2] / 2,  # non-contiguous
        big_endian,
        read_only,
        np.array([[True, False]]),
        np.array([1, 2, 3], dtype=np.uint64),
        np.array([2**63 + 5], dtype=np.uint64),
        np.array([-5, 10**9]),
    ]


def _tensors() -> list[Any]:
    return [
        torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=torch.bfloat16),
        torch.tensor([[0.5, 0.5]], dtype=torch.float16),
        torch.tensor([[1, 0]]),
        torch.tensor([[True, False]]),
        torch.tensor([[0.5, 0.5]], requires_grad=True),
        torch.ones(3, 2).t() / 2,  # non-contiguous
        torch.empty(2, 2, device="meta"),
        torch.tensor([[0.5 + 0j, 0.5]]),
        torch.tensor([3, 4]),
        torch.tensor(2),
    ]


ODD_SCALARS: list[Any] = [
    None,
    True,
    False,
    np.bool_(True),
    -1,
    0,
    1,
    2,
    3,
    7,
    2**31,
    2**63,
    2**64,
    -(2**64),
    10**30,
    np.int64(3),
    np.int8(-1),
    np.uint64(2**64 - 1),
    0.0,
    -0.0,
    0.5,
    0.7,
    1.0,
    1.5,
    -1.0,
    math.nan,
    math.inf,
    -math.inf,
    1e-300,
    1e-45,
    1e300,
    5e-324,
    np.float32(0.7),
    np.float16(0.5),
    np.float64(math.nan),
    1j,
    "",
    "10",
    "nan",
    "exact",
    "prompt-lookup",
    b"1",
    [],
    [[]],
    [1, [2]],
    [0.5, 0.5],
    ["a"],
    (0,),
    {},
    set(),
    object(),
    len,
    lambda *a, **k: None,
    lambda *a, **k: [0.5, 0.5],
]

ODD = st.sampled_from(ODD_SCALARS) | st.sampled_from(_arrays()) | st.sampled_from(_tensors())


@st.composite
def call_args(
    draw: Any, base: dict[str, Any], special: dict[str, st.SearchStrategy[Any]] | None = None
) -> dict[str, Any]:
    """`base` with zero to two arguments replaced by odd or broken values."""
    kwargs = dict(base)
    names = draw(st.lists(st.sampled_from(sorted(base)), max_size=2, unique=True))
    for name in names:
        pools = [ODD] + ([special[name]] if special and name in special else [])
        kwargs[name] = draw(st.one_of(pools))
    return kwargs


@st.composite
def broken(draw: Any, a: np.ndarray) -> Any:
    """A damaged copy of the probability array `a`, or `a` in another container."""
    kind = draw(
        st.sampled_from(
            ["nan", "inf", "neg", "scale", "float16", "float32", "torch", "bf16", "T", "list"]
        )
    )
    out = np.array(a, dtype=np.float64, copy=True)
    index = tuple(draw(st.integers(0, n - 1)) for n in out.shape) if out.size else None
    if kind in ("nan", "inf", "neg") and index is not None:
        out[index] = {"nan": np.nan, "inf": np.inf, "neg": -0.25}[kind]
    elif kind == "scale" and out.size:
        out = out * draw(st.sampled_from([0.0, 0.99, 1.0005, 1.01, 2.0]))
    elif kind == "float16":
        return out.astype(np.float16)
    elif kind == "float32":
        return out.astype(np.float32)
    elif kind == "torch":
        return torch.from_numpy(out)
    elif kind == "bf16":
        return torch.from_numpy(out).to(torch.bfloat16)
    elif kind == "T" and out.ndim == 2:
        return np.asfortranarray(out)
    elif kind == "list":
        return out.tolist()
    return out


def rows(rng: np.random.Generator, n: int, v: int) -> np.ndarray:
    w = rng.gamma(0.5, size=(n, v)) + 1e-3
    return w / w.sum(-1, keepdims=True)


RNG = np.random.default_rng(0)
P3 = rows(RNG, 3, 5)
Q2 = rows(RNG, 2, 5)
DRAFTS = np.array([int(np.argmax(Q2[0])), int(np.argmax(Q2[1]))])


def int_or_none(x: Any) -> int | None:
    """x as an int when it is one (Python or NumPy, not bool)."""
    if isinstance(x, bool | np.bool_):
        return None
    try:
        return operator.index(x)
    except TypeError:
        return None


def as_f64(x: Any) -> np.ndarray:
    """Any accepted array-like as float64 NumPy, for checking results."""
    if torch.is_tensor(x):
        return x.detach().double().numpy()
    return np.asarray(x, dtype=np.float64)


# ---- the verifier -----------------------------------------------------------------------


def check_round(out: Any, k: int, v: int, drafts: Any) -> None:
    assert isinstance(out, np.ndarray) and out.dtype == np.int64 and out.ndim == 1
    assert 1 <= len(out) <= k + 1
    assert ((out >= 0) & (out < v)).all()
    assert np.array_equal(out[:-1], np.asarray(drafts)[: len(out) - 1])


@settings(max_examples=EXAMPLES)
@given(
    call_args(
        {"p_rows": P3, "q_rows": Q2, "drafts": DRAFTS, "seed": 0, "check": "read"},
        {
            "p_rows": broken(P3),
            "q_rows": broken(Q2),
            "drafts": st.just([5, 0]),
            "check": st.sampled_from(["full", "none"]),
        },
    )
)
def test_verify(kwargs: dict[str, Any]) -> None:
    ok, out = outcome(sd.verify, **kwargs)
    if ok:
        p = as_f64(kwargs["p_rows"])
        check_round(out, p.shape[0] - 1, p.shape[1], kwargs["drafts"])


@settings(max_examples=EXAMPLES)
@given(
    call_args(
        {"p": P3[None], "q": Q2[None], "drafts": DRAFTS[None], "seed": 0, "threads": None},
        {"p": broken(P3[None]), "q": broken(Q2[None]), "threads": st.sampled_from([1, 256, 257])},
    )
)
def test_verify_batch(kwargs: dict[str, Any]) -> None:
    ok, out = outcome(sd.verify_batch, **kwargs)
    if ok:
        tokens, num = out
        assert tokens.shape == (1, 3) and num.shape == (1,) and 1 <= num[0] <= 3
        check_round(tokens[0, : num[0]], 2, 5, kwargs["drafts"][0])
        assert (tokens[0, num[0] :] == -1).all()


# ---- the engine -------------------------------------------------------------------------


@settings(max_examples=EXAMPLES)
@given(
    call_args(
        {
            "p_table": P_TABLE,
            "q_table": Q_TABLE,
            "k": 2,
            "runs": 1000,
            "num_tokens": 2,
            "start": 0,
            "variant": "exact",
            "seed": 0,
            "threads": None,
        },
        {
            "p_table": broken(P_TABLE),
            "q_table": broken(Q_TABLE),
            "variant": st.sampled_from(sd.VARIANTS),
            "k": st.sampled_from([0, 5, 10_000, 10_001]),
            "num_tokens": st.sampled_from([1, 3, 16, 17, 64, 65, 10**6]),
            "runs": st.sampled_from([1, 4097]),
        },
    )
)
def test_simulate(kwargs: dict[str, Any]) -> None:
    heavy = int_or_none(kwargs["runs"]) is not None and int_or_none(kwargs["runs"]) > 10_000
    k = int_or_none(kwargs["k"])
    if heavy or (k is not None and k >= 5_000):
        kwargs["runs"] = 10  # a real workload, not a fault: keep the call short
    ok, hist = outcome(sd.simulate, **kwargs)
    if ok:
        assert hist.dtype == np.int64 and (hist >= 0).all() and hist.sum() == kwargs["runs"]
        assert hist.ndim == kwargs["num_tokens"]


@settings(max_examples=EXAMPLES)
@given(
    call_args(
        {"p_table": P_TABLE, "q_table": Q_TABLE, "k": 2, "rounds": 1000, "start": 0, "seed": 0},
        {"p_table": broken(P_TABLE), "q_table": broken(Q_TABLE)},
    )
)
def test_simulate_round_lengths(kwargs: dict[str, Any]) -> None:
    rounds = int_or_none(kwargs["rounds"])
    if rounds is not None and rounds > 10**6:
        kwargs["rounds"] = 1000  # a real workload, not a fault
    ok, counts = outcome(sd.simulate_round_lengths, **kwargs)
    if ok:
        assert counts.shape == (int(kwargs["k"]) + 2,) and counts[0] == 0
        assert counts.sum() == kwargs["rounds"]


@settings(max_examples=EXAMPLES)
@given(call_args({"seed": 3, "index": 4}))
def test_row_seed(kwargs: dict[str, Any]) -> None:
    ok, out = outcome(sd.row_seed, **kwargs)
    if ok:
        assert isinstance(out, int) and 0 <= out < 2**64


# ---- the theory -------------------------------------------------------------------------


@settings(max_examples=EXAMPLES)
@given(
    call_args(
        {"p": P3[0], "q": Q2[0]},
        {"p": broken(P3[0]), "q": broken(Q2[0])},
    )
)
def test_acceptance_rate(kwargs: dict[str, Any]) -> None:
    ok, alpha = outcome(sd.acceptance_rate, **kwargs)
    if ok:
        p, q = as_f64(kwargs["p"]), as_f64(kwargs["q"])
        assert (p >= 0).all() and (q >= 0).all() and abs(p.sum() - 1) < 5e-3
        assert 0.0 <= alpha <= 1.0
        assert alpha == pytest.approx(np.minimum(p, q).sum(), abs=1e-12)


ALPHAS = st.sampled_from([0.0, 0.3, 0.8, 1.0 - 1e-12, 1.0])
KS = st.sampled_from([0, 1, 4, 2**40, 2**53, 2**53 + 1, 10**12])


@settings(max_examples=EXAMPLES)
@given(call_args({"alpha": 0.8, "k": 4}, {"alpha": ALPHAS, "k": KS}))
def test_expected_tokens(kwargs: dict[str, Any]) -> None:
    ok, e = outcome(sd.expected_tokens, **kwargs)
    if ok:
        a, k = float(kwargs["alpha"]), int(kwargs["k"])
        assert 1.0 <= e <= k + 1 and math.isfinite(e)
        if k <= 64:
            assert e == pytest.approx(sum(a**i for i in range(k + 1)), rel=1e-12)


@settings(max_examples=EXAMPLES)
@given(
    call_args(
        {"alpha": 0.8, "k": 4, "cost_ratio": 0.05, "verify_cost": 1.0},
        {"alpha": ALPHAS, "k": KS},
    )
)
def test_expected_speedup(kwargs: dict[str, Any]) -> None:
    ok, s = outcome(sd.expected_speedup, **kwargs)
    if ok:
        assert math.isfinite(s) and s >= 0  # 0.0 when k·c overflows: the limit


@settings(max_examples=EXAMPLES)
@given(
    call_args(
        {"alpha": 0.8, "cost_ratio": 0.05, "k_max": 10},
        {
            "alpha": ALPHAS,
            "cost_ratio": st.sampled_from([0.0, 0.01, 0.32, 1.0, 2.0]),
            "k_max": st.sampled_from([1, 200, 10**6, 2**53]),
        },
    )
)
def test_best_k(kwargs: dict[str, Any]) -> None:
    ok, best = outcome(sd.best_k, **kwargs)
    if ok:
        a, c, k_max = float(kwargs["alpha"]), float(kwargs["cost_ratio"]), int(kwargs["k_max"])
        assert 0 <= best <= k_max
        brute = [sd.expected_speedup(a, k, c) for k in range(1, min(k_max, 200) + 1)]
        if best == 0:
            assert max(brute) <= 1.0
        elif k_max <= 200:  # the bisection finds the brute-force maximum
            assert sd.expected_speedup(a, best, c) >= max(brute) * (1 - 1e-12)


@settings(max_examples=EXAMPLES)
@given(call_args({"alpha": 0.8, "k": 4}, {"alpha": ALPHAS, "k": KS}))
def test_break_even_cost(kwargs: dict[str, Any]) -> None:
    ok, c = outcome(sd.break_even_cost, **kwargs)
    if ok:
        assert 0.0 <= c <= 1.0


@settings(max_examples=EXAMPLES)
@given(call_args({"alphas": [0.5, 0.9]}, {"alphas": st.lists(ODD, max_size=3)}))
def test_expected_tokens_per_position(kwargs: dict[str, Any]) -> None:
    ok, e = outcome(sd.expected_tokens_per_position, **kwargs)
    if ok:
        assert 1.0 <= e <= len(list(kwargs["alphas"])) + 1


# ---- the lab API ------------------------------------------------------------------------


def markov(table: np.ndarray) -> Callable[[tuple[int, ...]], np.ndarray]:
    return lambda prefix: table[(prefix[-1] if prefix else 0) % len(table)]


@settings(max_examples=EXAMPLES)
@given(
    call_args(
        {
            "p_fn": markov(P_TABLE),
            "q_fn": markov(Q_TABLE),
            "prefix": (0,),
            "k": 2,
            "rng": np.random.default_rng(0),
            "backend": "rust",
        },
        {
            "p_fn": st.sampled_from([markov(P_TABLE[:, :2]), lambda pre: [np.nan, 1.0, 0.0]]),
            "q_fn": st.sampled_from([lambda pre: [0.2, 0.2, 0.2], lambda pre: [1.5, -0.5, 0.0]]),
            "backend": st.sampled_from(["python", "cuda"]),
        },
    )
)
def test_speculative_step(kwargs: dict[str, Any]) -> None:
    ok, out = outcome(sd.speculative_step, **kwargs)
    if ok:
        assert isinstance(out, list) and 1 <= len(out) <= int(kwargs["k"]) + 1
        assert all(isinstance(t, int) and 0 <= t < 3 for t in out)


# ---- processors and policies ------------------------------------------------------------


@settings(max_examples=EXAMPLES)
@given(call_args({"temperature": 0.7, "top_k": None, "top_p": None, "min_p": None}))
def test_sampling_config(kwargs: dict[str, Any]) -> None:
    ok, config = outcome(sd.SamplingConfig, **kwargs)
    if ok:
        assert type(config.temperature) is float and config.temperature >= 0
        assert config.top_k is None or (type(config.top_k) is int and config.top_k >= 1)
        assert config.top_p is None or 0 < config.top_p <= 1
        assert config.min_p is None or 0 <= config.min_p <= 1


LOGITS = torch.randn(3, 7, generator=torch.Generator().manual_seed(0)) * 3


@settings(max_examples=EXAMPLES)
@given(
    call_args(
        {"logits": LOGITS, "config": sd.SamplingConfig(0.7, top_k=3)},
        {
            "logits": st.sampled_from(
                [
                    LOGITS.masked_fill(LOGITS > 0, float("-inf")),
                    torch.full((2, 4), float("-inf")),
                    LOGITS.clone().index_fill_(1, torch.tensor([2]), float("nan")),
                    LOGITS.clone().index_fill_(1, torch.tensor([2]), float("inf")),
                    LOGITS.to(torch.bfloat16),
                    LOGITS[0],
                ]
            ),
            "config": st.sampled_from(
                [sd.SamplingConfig(t) for t in (0.0, 1e-45, 1e-38, 1e-10, 1e30)]
                + [sd.SamplingConfig(1.0, top_p=1e-9, min_p=1.0)]
            ),
        },
    )
)
def test_logits_to_probs(kwargs: dict[str, Any]) -> None:
    ok, probs = outcome(sd.logits_to_probs, **kwargs)
    if ok:
        assert probs.dtype == torch.float32 and probs.shape == kwargs["logits"].shape
        assert bool(torch.isfinite(probs).all()) and bool((probs >= 0).all())
        torch.testing.assert_close(probs.sum(-1), torch.ones(probs.shape[:-1]))


@settings(max_examples=EXAMPLES)
@given(
    st.sampled_from(["fixed", "heuristic", "adaptive"]),
    call_args(
        {"k": 2, "k_max": 8, "cost_ratio": 0.1, "verify_cost": None, "decay": 0.9, "probe": 4}
    ),
)
def test_policies(kind: str, kwargs: dict[str, Any]) -> None:
    make = {
        "fixed": lambda a: FixedK(a["k"]),
        "heuristic": lambda a: HeuristicK(a["k"], a["k_max"]),
        "adaptive": lambda a: AdaptiveK(
            a["cost_ratio"], a["verify_cost"], k_max=a["k_max"], decay=a["decay"], probe=a["probe"]
        ),
    }[kind]
    ok, policy = outcome(make, kwargs)
    if ok:
        for _ in range(20):
            k = policy.next_k()
            assert isinstance(k, int) and 0 <= k <= 1024
            policy.observe(k, k, k // 2)


# ---- generation -------------------------------------------------------------------------

V = 16


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any, Any]:
    target = models.tiny_llama(vocab_size=V, hidden_size=16, num_layers=2, seed=1)
    draft = models.tiny_llama(vocab_size=V, hidden_size=16, num_layers=1, seed=2)
    other = models.tiny_llama(vocab_size=V, hidden_size=8, num_layers=2, seed=3)
    return target, draft, other


class Rogue:
    """A custom drafter that hands back whatever it was given."""

    name = "rogue"

    def __init__(self, tokens: Any, q: Any):
        self.tokens, self.q = tokens, q

    def start(self, seq: Any, cache: Any, hidden: Any) -> None:
        pass

    def propose(self, seq: Any, k: int, sampler: Any) -> Any:
        return sd.Draft(self.tokens, self.q)

    def update(self, seq: Any, num_accepted: int, hidden: Any) -> None:
        pass


class OldRogue(Rogue):
    """A drafter written for an older interface: start/update without target_hidden."""

    def start(self, seq: Any, cache: Any) -> None:  # type: ignore[override]
        pass


def rogues() -> list[Any]:
    one_hot = torch.eye(V)
    nan_q = one_hot[[3]].clone()
    nan_q[0, 5] = float("nan")
    return [
        Rogue(torch.tensor([V + 3]), one_hot[[0]]),  # id outside the vocabulary
        Rogue(torch.tensor([1, 2, 3, 4, 5]), one_hot[[1, 2, 3, 4, 5]]),  # more than k
        Rogue(torch.tensor([1]), one_hot[[1, 2]]),  # q of the wrong shape
        Rogue(torch.tensor([1.0]), one_hot[[1]]),  # float ids
        Rogue(torch.tensor([[1]]), one_hot[[1]]),  # 2-D ids
        Rogue(torch.tensor([3]), nan_q),  # NaN in q
        Rogue(torch.tensor([3]), one_hot[[4]]),  # q(x) = 0 for its own draft
        Rogue(torch.tensor([3]), -one_hot[[3]]),  # negative q
        Rogue(torch.tensor([3]), 0.5 * one_hot[[3]]),  # q that sums to 0.5
        Rogue(None, None),
        OldRogue(torch.tensor([3]), one_hot[[3]]),
    ]


@settings(max_examples=EXAMPLES + 20)
@given(st.data())
def test_generate(tiny: tuple[Any, Any, Any], data: Any) -> None:
    target, draft, other = tiny
    drafters = st.sampled_from(
        [
            None,
            "prompt-lookup",
            sd.PromptLookup(min_ngram=1),
            sd.DraftModel(draft),
            sd.EarlyExit(target, 1),
            sd.EarlyExit(other, 1),  # built on another model
            sd.DraftModel(models.tiny_llama(vocab_size=V + 4, hidden_size=8, num_layers=1)),
            *rogues(),
        ]
    )
    base = {
        "target": target,
        "drafter": sd.PromptLookup(min_ngram=1),
        "input_ids": [1, 2, 3, 1, 2],
        "max_new_tokens": 5,
        "k": 2,
        "temperature": 0.7,
        "top_k": None,
        "top_p": None,
        "min_p": None,
        "seed": 0,
        "eos_token_id": [],
        "vocab_size": None,
        "on_tokens": None,
        "allow_past_context": False,
    }
    kwargs = data.draw(
        call_args(
            base,
            {
                "drafter": drafters,
                "input_ids": st.sampled_from(
                    ["hello", [[1, 2], [3, 4]], [1, V], torch.tensor([[1, 2, 3]]), [1] * 1030]
                ),
                "k": st.sampled_from([HeuristicK(), AdaptiveK(0.1), 10**6]),
                "max_new_tokens": st.sampled_from([1, 30, 1020, 10**9]),
                "eos_token_id": st.sampled_from(["10", [1, "a"], 3, np.int64(3)]),
            },
        )
    )
    ok, out = outcome(sd.generate, **kwargs)
    if ok:
        budget = int(kwargs["max_new_tokens"])
        assert 1 <= out.new_tokens <= budget
        assert all(0 <= t < V for t in out.tokens)
        assert out.rounds == sum(out.accepted_histogram)


def test_policy_objects_are_reset_by_each_generation(tiny: tuple[Any, Any, Any]) -> None:
    """One HeuristicK / AdaptiveK object reused: same seed, same output and rounds."""
    target, draft, _ = tiny
    for policy in (HeuristicK(), AdaptiveK(0.1, k_max=4)):
        runs = [
            sd.generate(
                target,
                sd.DraftModel(draft),
                [1, 2, 3],
                max_new_tokens=20,
                k=policy,
                seed=5,
                eos_token_id=[],
            )
            for _ in range(2)
        ]
        assert runs[0].tokens == runs[1].tokens
        assert runs[0].k_per_round == runs[1].k_per_round


@settings(max_examples=EXAMPLES)
@given(
    st.sampled_from(["draft-model", "early-exit", "prompt-lookup", "layer-view", "tiny"]),
    call_args(
        {
            "model": None,
            "num_layers": 1,
            "greedy": False,
            "name": "m",
            "max_ngram": 8,
            "min_ngram": 2,
        },
        {"num_layers": st.sampled_from([1.5, 0, 3, np.int64(1)])},
    ),
)
def test_constructors(tiny: tuple[Any, Any, Any], kind: str, a: dict[str, Any]) -> None:
    target, draft, _ = tiny
    make: dict[str, Callable[[], Any]] = {
        "draft-model": lambda: sd.DraftModel(
            draft if a["model"] is None else a["model"], greedy=a["greedy"], name=a["name"]
        ),
        "early-exit": lambda: sd.EarlyExit(target, a["num_layers"], greedy=a["greedy"]),
        "prompt-lookup": lambda: sd.PromptLookup(a["max_ngram"], a["min_ngram"]),
        "layer-view": lambda: models.layer_view(target, a["num_layers"]),
        "tiny": lambda: models.tiny_llama(vocab_size=4, num_layers=a["num_layers"]),
    }
    outcome(make[kind])


@pytest.mark.parametrize("model", [None, "a model", object(), torch.nn.Linear(2, 2)])
def test_a_non_model_is_refused(model: Any) -> None:
    with pytest.raises(ValueError, match="expected a transformers causal LM|has no LM head"):
        sd.DraftModel(model)
    with pytest.raises(ValueError, match="expected a transformers causal LM|has no LM head"):
        sd.generate(model, None, [1, 2], max_new_tokens=2)


def test_theory_has_no_hang_at_huge_k() -> None:
    with deadline(2.0):
        assert sd.expected_tokens(0.8, 2**40) == pytest.approx(5.0)
        assert sd.expected_speedup(0.8, 10**12, 0.05) == pytest.approx(5.0 / (0.05e12 + 1))
        assert sd.break_even_cost(0.8, 2**52) == pytest.approx(4.0 / 2**52)
        assert sd.best_k(0.8, 0.05, k_max=10**6) == 8
        assert sd.best_k(0.8, 0.0, k_max=2**53) == 2**53  # free drafts: the longest pays most
    assert theory.MAX_K == 2**53


# ---- measurement helpers ----------------------------------------------------------------

A = np.array([[1.0, 0.5, np.nan], [0.25, np.nan, np.nan], [0.0, np.nan, np.nan]])


@settings(max_examples=EXAMPLES)
@given(
    call_args(
        {"a": A, "k": 2, "cost_ratio": 0.1, "verify_cost": [1.0, 1.1, 1.2]},
        {"a": broken(A), "k": st.sampled_from([0, 3, 4])},
    )
)
def test_replay(kwargs: dict[str, Any]) -> None:
    ok, out = outcome(measure.replay, **kwargs)
    if ok:
        rounds, cost = out
        assert 1.0 <= rounds <= len(A) and cost > 0


@settings(max_examples=EXAMPLES)
@given(
    call_args(
        {"matrices": [A, A], "cost_ratio": 0.1, "verify_cost": [1.0, 1.1, 1.2, 1.3]},
        {"matrices": st.lists(broken(A), max_size=2)},
    )
)
def test_summarize_and_predict(kwargs: dict[str, Any]) -> None:
    ok, acc = outcome(measure.summarize, kwargs["matrices"])
    if ok:
        assert 0.0 <= acc.alpha <= 1.0 and len(acc.survive) == 3
        ok, pred = outcome(forecast, acc, kwargs["cost_ratio"], kwargs["verify_cost"])
        if ok:
            assert pred.k == [1, 2, 3] and 0 <= pred.best_k_refined <= 3


@settings(max_examples=EXAMPLES)
@given(ODD | st.sampled_from(["code", "chat"]))
def test_workloads(workload: Any) -> None:
    ok, prompts = outcome(workloads.prompts, workload)
    if ok:
        assert len(prompts) == 20 and all(isinstance(p, str) and p for p in prompts)
