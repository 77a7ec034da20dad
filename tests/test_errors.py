"""Bad input: a ValueError that names the array, the row and the problem.
Never a panic (PanicException escapes `except Exception`), NaN or wrong answer."""

from __future__ import annotations

import numpy as np
import pytest
import specdec_rs as sd
from conftest import P_TABLE, Q_TABLE

P = np.array([[0.5, 0.3, 0.2], [0.2, 0.3, 0.5]])
Q = np.array([[0.3, 0.3, 0.4]])


def verify_with(**changes):  # type: ignore[no-untyped-def]
    args = {"p_rows": P, "q_rows": Q, "drafts": np.array([1]), "seed": 0, "check": "full"}
    args |= changes
    return sd.verify(args.pop("p_rows"), args.pop("q_rows"), args.pop("drafts"), **args)


def with_entry(
    a: np.ndarray, index: tuple[int, int], value: float, dtype: type = np.float64
) -> np.ndarray:
    out = a.astype(dtype).copy()
    out[index] = value
    return out


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"p_rows": P[0]}, r"p_rows has shape \(3,\); expected 2 dimensions"),
        ({"q_rows": np.vstack([Q, Q])}, r"q_rows must have 1 rows.*q_rows has 2 rows"),
        ({"drafts": np.array([1, 2])}, r"drafts 1 entries.*drafts 2 entries"),
        (
            {"q_rows": np.full((1, 4), 0.25)},
            r"vocabulary mismatch: p_rows has V = 3 columns but q_rows has 4",
        ),
        (
            {"p_rows": with_entry(P, (1, 2), np.nan)},
            r"p_rows row 1 has a non-finite value.*column 2",
        ),
        (
            {"q_rows": with_entry(Q, (0, 0), np.inf)},
            r"q_rows row 0 has a non-finite value.*column 0",
        ),
        ({"p_rows": with_entry(P, (0, 0), -0.1)}, r"p_rows row 0 has a negative probability -0.1"),
        (
            {"p_rows": with_entry(P, (1, 0), 0.17, np.float32)},
            r"p_rows row 1 sums to 0.97.*expected 1 ± 1e-3",
        ),
        (
            {"q_rows": with_entry(Q, (0, 0), 0.30001)},
            r"q_rows row 0 sums to 1.00001.*expected 1 ± 1e-6",
        ),
        ({"drafts": np.array([3])}, r"drafts\[0\] = 3 is outside the vocabulary \[0, 3\)"),
        ({"drafts": np.array([-1])}, r"drafts\[0\] = -1 is outside the vocabulary"),
        ({"drafts": np.array([1.0])}, r"drafts has dtype float64; expected integer token ids"),
        (
            {"q_rows": np.array([[0.5, 0.0, 0.5]])},
            r"drafts\[0\] = 1 has probability 0 under q row 0",
        ),
        ({"p_rows": P.astype(np.complex128)}, r"p_rows has dtype complex128"),
        ({"p_rows": np.zeros((0, 3))}, r"p_rows has 0 rows"),
        ({"seed": -1}, r"seed = -1 is out of range"),
        ({"seed": 2**64}, r"seed = .* is out of range"),
        ({"seed": 1.5}, r"seed = 1.5 must be an integer"),
    ],
)
def test_verify_rejects_bad_input(changes, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=match):
        verify_with(**changes)


def test_the_default_check_covers_every_row_the_round_reads() -> None:
    p = np.array([[0.5, 0.5], [np.nan, 1.0]])
    q = np.array([[0.5, 0.5]])
    with pytest.raises(ValueError, match=r"p_rows row 1 has a non-finite value"):
        sd.verify(p, q, [0], seed=0)  # p = q: accepted, bonus row read
    with pytest.raises(ValueError, match=r"q_rows row 0 has a non-finite value"):
        # p(1) = 0: rejected, so the residual pass reads q row 0
        sd.verify(np.array([[1.0, 0.0], [0.5, 0.5]]), np.array([[np.nan, 1.0]]), [1], 0)
    # a row the round never reads (the bonus row after a rejection) passes unseen
    # by default, and is caught by check="full"
    p = np.array([[1.0, 0.0], [np.nan, 1.0]])
    q = np.array([[0.0, 1.0]])
    assert sd.verify(p, q, [1], seed=0).tolist() == [0]
    with pytest.raises(ValueError, match=r"p_rows row 1 has a non-finite value"):
        sd.verify(p, q, [1], seed=0, check="full")
    with pytest.raises(ValueError, match=r"check = 'no'; expected one of 'read', 'full'"):
        sd.verify(p, q, [1], seed=0, check="no")  # type: ignore[arg-type]


def test_batch_errors_name_the_batch_row() -> None:
    p = np.broadcast_to(P, (4, *P.shape)).copy()
    q = np.broadcast_to(Q, (4, *Q.shape)).copy()
    d = np.ones((4, 1), dtype=np.int64)
    p[2, 1, 0] = np.nan
    p[3, 1, 0] = np.nan
    with pytest.raises(ValueError, match=r"p batch 2 row 1 has a non-finite value"):
        sd.verify_batch(p, q, d, seed=0)
    d[1, 0] = 7
    with pytest.raises(ValueError, match=r"drafts\[0\] of batch 1 = 7 is outside"):
        sd.verify_batch(p, q, d, seed=0)
    with pytest.raises(ValueError, match=r"batch sizes differ"):
        sd.verify_batch(p, q[:3], d, seed=0)
    with pytest.raises(ValueError, match=r"threads = 0"):
        sd.verify_batch(p, q, d, seed=0, threads=0)


def test_half_precision_rows_are_read_with_their_own_tolerance() -> None:
    """float16 / bfloat16 rows (NumPy or torch) are widened to float32 and held to
    their precision's tolerance: a softmax over 49,152 tokens rounded to float16
    loses mass to rounding and flushed tiny entries and must still pass; a row
    summing to 1.01 must not."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    v = 49_152
    logits = rng.normal(size=(2, v)) * 4
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    half = p.astype(np.float16)
    assert abs(half.astype(np.float64).sum(1) - 1).max() > 1e-4  # far past float64's 1e-6
    q = p[:1]
    for rows in (half, torch.tensor(half), torch.tensor(p, dtype=torch.bfloat16)):
        assert 1 <= len(sd.verify(rows, q, [int(np.argmax(q[0]))], seed=0)) <= 2
    off = torch.tensor(P * 1.01, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"p_rows row 0 sums to 1.00[89].*expected 1 ± 4e-3"):
        sd.verify(off, Q, [1], seed=0, check="full")


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        (
            {"p_table": P_TABLE[:2], "q_table": Q_TABLE[:2]},
            r"tables have shape \(2, 3\); expected \(V, V\)",
        ),
        ({"q_table": Q_TABLE[:1]}, r"p_table has shape \(3, 3\) but q_table has shape"),
        ({"p_table": P_TABLE * 1.1}, r"p_table row 0 sums to 1.1"),
        ({"q_table": with_entry(Q_TABLE, (1, 1), -0.4)}, r"q_table row 1 has a negative"),
        ({"start": 3}, r"start = 3 is outside the vocabulary \[0, 3\)"),
        ({"start": -1}, r"start = -1 is out of range"),
        ({"variant": "fast"}, r"variant = 'fast'; expected one of 'exact', 'no_bonus'"),
        ({"num_tokens": 0}, r"num_tokens = 0 is out of range"),
        ({"num_tokens": 40}, r"more than 16777216 entries; lower num_tokens"),
        ({"runs": 0}, r"runs = 0 is out of range"),
        ({"k": -2}, r"k = -2 is out of range"),
        ({"variant": "no_bonus", "k": 0}, r"no_bonus with k = 0 emits no tokens"),
        ({"threads": 0}, r"threads = 0 is out of range"),
    ],
)
def test_simulate_rejects_bad_input(changes, match: str) -> None:  # type: ignore[no-untyped-def]
    args = {
        "p_table": P_TABLE,
        "q_table": Q_TABLE,
        "k": 2,
        "runs": 10,
        "num_tokens": 2,
        "start": 0,
    } | changes
    with pytest.raises(ValueError, match=match):
        sd.simulate(args.pop("p_table"), args.pop("q_table"), **args)


def test_round_lengths_reject_bad_input() -> None:
    with pytest.raises(ValueError, match=r"rounds = 0 is out of range"):
        sd.simulate_round_lengths(P_TABLE, Q_TABLE, k=2, rounds=0)
    with pytest.raises(ValueError, match=r"p_table has shape \(3,\); expected 2 dimensions"):
        sd.simulate_round_lengths(P_TABLE[0], Q_TABLE, k=2, rounds=5)
