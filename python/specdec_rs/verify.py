"""The verifier's Python face. p = target, q = draft, k = γ.

One round: accept draft i with probability min(1, p_i(x)/q_i(x)); at the
first rejection emit a sample of norm(max(0, p_i − q_i)) and stop; if all k
drafts pass, emit a bonus token from p_k. The output is distributed exactly as
sampling from p would be. The work runs in Rust with the GIL released.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from specdec_rs import _checks, _core


def _rows(p_rows: Any, q_rows: Any, ndim: int) -> tuple[np.ndarray, np.ndarray, float, float]:
    """(p, q, p_tol, q_tol): the arrays as the Rust core reads them and their
    row-sum tolerances."""
    p, p_tol = _checks.prob_array(p_rows, "p_rows" if ndim == 2 else "p", ndim)
    q_name = "q_rows" if ndim == 2 else "q"
    q = q_rows
    empty_array = type(q) is np.ndarray and q.size == 0 and q.ndim < ndim
    if empty_array or (isinstance(q, list | tuple) and len(q) == 0):  # k = 0, given flat
        q = np.zeros((*p.shape[:-2], 0, p.shape[-1]), dtype=p.dtype)
    q, q_tol = _checks.prob_array(q, q_name, ndim)
    return p, q, p_tol, q_tol


def verify(
    p_rows: Any, q_rows: Any, drafts: Any, seed: int, *, validate: bool = True
) -> npt.NDArray[np.int64]:
    """One speculative round; returns the 1..k+1 emitted token ids (int64).

    p_rows: (k+1, V) target probabilities; row i conditioned on prefix + drafts[:i].
    q_rows: (k, V) the distributions draft i was actually sampled from
        (one-hot rows for a greedy drafter: acceptance is then p(x), the residual p without x).
    drafts: (k,) integer token ids.  seed: int in [0, 2**64).
    validate: check every row in full (finite, >= 0, sums to 1 within 1e-6 for
        float64, 1e-3 for float32, 4e-3 for bfloat16, 1e-3 + V·2^-25 for
        float16). With False only what the round reads is checked: the 2k
        gathered entries and the one or two rows it samples from.

    float32 and float64 NumPy arrays and CPU torch tensors are read without a
    copy (p and q may differ in precision; each row is checked with its own
    tolerance); float16/bfloat16 rows are widened to float32 (a copy), tensors
    on another device are copied to the host. Same inputs + same seed give the
    same output.

    >>> import numpy as np
    >>> p = np.array([[0.0, 1.0], [0.5, 0.5], [0.5, 0.5]]); q = np.array([[1.0, 0.0], [1.0, 0.0]])
    >>> verify(p, q, [0, 0], seed=1).tolist()   # p(0) = 0: rejected, the residual is token 1
    [1]
    """
    p, q, p_tol, q_tol = _rows(p_rows, q_rows, 2)
    d = _checks.token_array(drafts, "drafts", 1)
    full = _checks.boolean(validate, "validate")
    return _core.verify(p, q, d, _checks.seed(seed), full, p_tol, q_tol)


def verify_batch(
    p: Any,
    q: Any,
    drafts: Any,
    seed: int,
    *,
    validate: bool = True,
    threads: int | None = None,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """B independent rounds, spread over threads with the GIL released.

    p: (B, k+1, V), q: (B, k, V), drafts: (B, k). Returns tokens (B, k+1)
    int64 padded with -1 and num_emitted (B,). Row b equals
    ``verify(p[b], q[b], drafts[b], seed=row_seed(seed, b))`` whatever the
    thread count (threads=None uses one per core).
    """
    pa, qa, p_tol, q_tol = _rows(p, q, 3)
    d = _checks.token_array(drafts, "drafts", 2)
    full = _checks.boolean(validate, "validate")
    return _core.verify_batch(
        pa, qa, d, _checks.seed(seed), full, p_tol, q_tol, _checks.threads(threads)
    )


def row_seed(seed: int, index: int) -> int:
    """The seed that row `index` of ``verify_batch(..., seed)`` uses: an int in [0, 2**64)."""
    return _core.row_seed(
        _checks.seed(seed), _checks.integer(index, "index", maximum=_checks.U64_MAX)
    )
