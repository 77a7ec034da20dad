"""Monte Carlo engine (Rust) for toy models given as tables. p = target, q = draft, k = γ.

A table has shape (S, V): S = V is a Markov chain on the last token (row r
is the distribution after token r), S = 1 a prefix-independent model.
`variant` selects the exact rule or one of the known bugs (see `VARIANTS`).
Results are identical for a given seed whatever the thread count.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from specdec_rs import _checks, _core


def _tables(p_table: Any, q_table: Any) -> tuple[np.ndarray, np.ndarray]:
    p = _checks.prob_array(p_table, "p_table", 2).astype(np.float64, copy=False)
    q = _checks.prob_array(q_table, "q_table", 2).astype(np.float64, copy=False)
    return p, q


def _variant(variant: str) -> str:
    if variant not in _core.VARIANTS:
        raise ValueError(f"variant = {variant!r}; expected one of {', '.join(_core.VARIANTS)}")
    return variant


def simulate(
    p_table: Any,
    q_table: Any,
    *,
    k: int,
    runs: int,
    num_tokens: int,
    start: int,
    variant: str = "exact",
    seed: int = 0,
    threads: int | None = None,
) -> npt.NDArray[np.int64]:
    """Joint histogram of the first `num_tokens` tokens emitted after `start`.

    Each of `runs` runs starts from context token `start` and runs rounds
    until at least num_tokens are out. Returns int64 counts of shape
    (V,) * num_tokens summing to `runs`; compare with Π p(t_j | t_{j−1}).
    """
    p, q = _tables(p_table, q_table)
    m = _checks.integer(num_tokens, "num_tokens", minimum=1)
    flat = _core.simulate(
        p,
        q,
        _checks.integer(k, "k", maximum=10_000),
        _checks.integer(runs, "runs", minimum=1, maximum=_checks.U64_MAX),
        m,
        _checks.integer(start, "start"),
        _variant(variant),
        _checks.seed(seed),
        _checks.threads(threads),
    )
    return flat.reshape((p.shape[1],) * m)


def simulate_round_lengths(
    p_table: Any,
    q_table: Any,
    *,
    k: int,
    rounds: int,
    start: int = 0,
    variant: str = "exact",
    seed: int = 0,
    threads: int | None = None,
) -> npt.NDArray[np.int64]:
    """Counts of rounds by tokens emitted: shape (k+2,), index = tokens emitted
    (index 0 is always 0). Rounds run as continuing generations from `start`
    in blocks of 4096: each round's context is the previous round's last token.
    """
    p, q = _tables(p_table, q_table)
    return _core.simulate_round_lengths(
        p,
        q,
        _checks.integer(k, "k", maximum=10_000),
        _checks.integer(rounds, "rounds", minimum=1, maximum=_checks.U64_MAX),
        _checks.integer(start, "start"),
        _variant(variant),
        _checks.seed(seed),
        _checks.threads(threads),
    )
