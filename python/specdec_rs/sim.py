"""Monte Carlo engine (Rust) for toy models given as tables. p = target, q = draft, k = γ.

A table has shape (S, V): S = V is a Markov chain on the last token (row r
is the distribution after token r), S = 1 a prefix-independent model.
`variant` selects the exact rule (or "block", block verification) or one of
the known bugs (see `VARIANTS`). `simulate_tree` and
`simulate_tree_round_lengths` run tree rounds: a fixed tree shape whose node
tokens are drawn each round from q (iid, without replacement, or q's top
tokens for "fixed" children), verified by the tree walk of `verify_tree` or
one of the known tree bugs (`TREE_VARIANTS`).
Results are identical for a given seed whatever the thread count. Rows are
checked with the tolerance of the tables' own precision (1e-6 for float64,
1e-3 for float32); sampling normalizes each row by its sum. Ctrl-C stops a
long simulation within about 50 ms (KeyboardInterrupt).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from specdec_rs import _checks, _core

MAX_K = 10_000  # drafts per round; a round is O(k) work in the engine
MAX_NUM_TOKENS = 64  # the histogram has one axis per token; NumPy arrays have at most 64


def _setup(
    p_table: Any, q_table: Any, start: Any, variant: Any, seed: Any, **rounds: Any
) -> tuple[_core.Simulation, int]:
    """The checked simulation and V: tables as float64 with the row-sum
    tolerance of their own precision; `rounds` is k=... (chains) or
    parents=..., children=... (trees), checked here and, with the tables, by
    `_core.Simulation` (once, before any round runs)."""
    p, p_tol = _checks.prob_array(p_table, "p_table", 2)
    q, q_tol = _checks.prob_array(q_table, "q_table", 2)
    if "k" in rounds:
        rounds["k"] = _checks.integer(rounds["k"], "k", maximum=MAX_K)
        variant = _checks.choice(variant, "variant", _core.VARIANTS)
    else:
        from specdec_rs.verify import CHILDREN

        rounds["parents"] = _checks.token_array(rounds["parents"], "parents", 1)
        rounds["children"] = _checks.choice(rounds["children"], "children", CHILDREN)
        variant = _checks.choice(variant, "variant", _core.TREE_VARIANTS)
    sim = _core.Simulation(
        p.astype(np.float64, copy=False),
        q.astype(np.float64, copy=False),
        start=_checks.integer(start, "start", maximum=_checks.U64_MAX),  # < V: checked in Rust
        seed=_checks.seed(seed),
        variant=variant,
        p_tol=p_tol,
        q_tol=q_tol,
        **rounds,
    )
    return sim, p.shape[1]


def _histogram(
    sim: _core.Simulation, vocab: int, runs: Any, num_tokens: Any, threads: Any
) -> npt.NDArray[np.int64]:
    m = _checks.integer(num_tokens, "num_tokens", minimum=1, maximum=MAX_NUM_TOKENS)
    runs = _checks.integer(runs, "runs", minimum=1, maximum=_checks.U64_MAX)
    return sim.histogram(runs, m, _checks.threads(threads)).reshape((vocab,) * m)


def _round_lengths(sim: _core.Simulation, rounds: Any, threads: Any) -> npt.NDArray[np.int64]:
    rounds = _checks.integer(rounds, "rounds", minimum=1, maximum=_checks.U64_MAX)
    return sim.round_lengths(rounds, _checks.threads(threads))


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
    sim, vocab = _setup(p_table, q_table, start, variant, seed, k=k)
    return _histogram(sim, vocab, runs, num_tokens, threads)


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
    sim, _ = _setup(p_table, q_table, start, variant, seed, k=k)
    return _round_lengths(sim, rounds, threads)


def simulate_tree(
    p_table: Any,
    q_table: Any,
    *,
    parents: Any,
    children: str = "iid",
    runs: int,
    num_tokens: int,
    start: int,
    variant: str = "exact",
    seed: int = 0,
    threads: int | None = None,
) -> npt.NDArray[np.int64]:
    """`simulate` with tree rounds: each round draws a tree of the shape
    `parents` (as in `verify_tree`) from q, as `children` says, and walks it.
    Returns the joint histogram of the first `num_tokens` tokens, shape (V,) * num_tokens.
    """
    sim, vocab = _setup(p_table, q_table, start, variant, seed, parents=parents, children=children)
    return _histogram(sim, vocab, runs, num_tokens, threads)


def simulate_tree_round_lengths(
    p_table: Any,
    q_table: Any,
    *,
    parents: Any,
    children: str = "iid",
    rounds: int,
    start: int = 0,
    variant: str = "exact",
    seed: int = 0,
    threads: int | None = None,
) -> npt.NDArray[np.int64]:
    """Counts of tree rounds by tokens emitted: shape (depth + 2,), index =
    tokens emitted; continuing generations as in `simulate_round_lengths`."""
    sim, _ = _setup(p_table, q_table, start, variant, seed, parents=parents, children=children)
    return _round_lengths(sim, rounds, threads)
