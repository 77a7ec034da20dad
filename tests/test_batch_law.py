"""The end-to-end law of batched generation: B = 4 rows of mixed settings
(temperatures, top-k/top-p, a greedy row, different k, one row whose γ the
`Goodput` policy chooses, two rows joining mid-run), each row's joint law
of its first two tokens against the target's at that row's settings, and
the rows' independence. p = target, q = draft.

Target: the law tests' GGUF target (V = 4, the batched Rust layer, a
1-layer draft model per row). One run = one `BatchEngine` over six
requests (seeds 10·run + row): rows 0-3 start, row 2 (greedy, 2 tokens)
finishes first and row 4 takes its slot, then row 5 joins; every prompt
is prefilled one token a round (`prefill_chunk=1`), so rows 4 and 5
prefill in rounds where the others decode and verify (even runs); in odd
runs a prefix cache of one-position blocks (fresh each run) gives rows 4
and 5 the prompt positions the first rows stored. Tests per run
set (each at p-value > 1e-6, Pearson chi-square): the pair law of rows 0,
1, 3, 4, 5 (5 tests), the greedy row's pair equals the target's greedy
pair every run, and the first tokens of rows 0 and 4 (the same settings)
follow the product of their laws (a shared random stream makes them
equal). False alarm of the exact engine: 6e-6.

Power: the effects Σ (p_bug − p)² / p below were measured with 2,000 runs
of each bug (noise (cells − 1)/2000 removed; `measure_effects` below),
each on the test it fails most: the known bugs injected into the verifier
(resample-from-p, continue-after-reject, inverted ratio, greedy check,
off-by-one target row, no verification) and two bugs of a batch engine:
the batch forward's output handed to the rows one place off (`RowSwap`),
and every row drawing from one stream, the first request's seed
(`SharedStream`). (A cache cut by another row's accepted count barely moves
this target's two-token law: its next token depends little on the context
before the last; the per-row identity test in test_batch.py catches it.)
At RUNS runs each is caught with probability > 1 − 1e-4
(`test_the_batch_runs_give_the_stated_power`). A bug run stops at its
first p-value under 1e-6.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import specdec_rs as sd
from specdec_rs.engine import BatchEngine, Request
from specdec_rs.generation.prefix import PrefixCache
from specdec_rs.policy import ForwardProfile, Goodput
from specdec_rs.processors import SamplingConfig
from specdec_rs.stats import chi2_pvalue
from test_law import PROMPT, SIGNIFICANCE, V, buggy_verifier, exact_pairs, gguf_target, power

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.law

RUNS = 900
BUG_ESCAPES = 1e-4

# (settings, k, max_new_tokens) of the six requests; None: the Goodput policy's γ
ROWS = (
    (SamplingConfig(1.0), 2, 3),
    (SamplingConfig(0.7, top_k=3, top_p=0.9), 3, 3),
    (SamplingConfig(0.0), 1, 2),
    (SamplingConfig(0.8, top_p=0.95), None, 3),
    (SamplingConfig(1.0), 2, 3),
    (SamplingConfig(0.9), 0, 3),
)
SAMPLED = (0, 1, 3, 4, 5)
GREEDY = 2
TWINS = (0, 4)  # the same settings: independent rows


def profile() -> ForwardProfile:
    """A forward profile under which γ depends on the load (B = 4 → 1 draft or 2)."""
    table = {(b, n): 1.0 + 0.3 * b * n for b in (1, 2, 4) for n in range(1, 5)}
    return ForwardProfile(table)


class RowSwap(BatchEngine):
    """Bug: the batch forward's outputs reach the rows one place off (row s
    verifies against row s + 1's target rows), among rows whose blocks have
    the same length (the split of the batched output at wrong offsets)."""

    def forward(self, work: Any, pieces: Any = ()) -> Any:
        out = super().forward(work, pieces)
        groups: dict[int, list[int]] = {}
        for i, (_, pending) in enumerate(work):
            groups.setdefault(len(pending.block), []).append(i)
        moved = list(out)
        for rows in groups.values():
            for a, b in zip(rows, rows[1:] + rows[:1], strict=True):
                moved[a] = out[b]
        return moved


class SharedStream(BatchEngine):
    """Bug: every row draws from the stream of the first request's seed."""

    def _start(self, item: Any) -> Any:
        if not hasattr(self, "shared"):
            self.shared = item.seed
        return super()._start(dataclasses.replace(item, seed=self.shared))


def batch_counts(
    engine_type: type[BatchEngine],
    runs: int,
    *,
    verifier: Callable[..., Any] | None = None,
    stop_at: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Counts over `runs` runs: "row i" (V, V) pair counts of each sampled
    row, "twins" (V, V) the first tokens of rows 0 and 4, "greedy" (1,) the
    runs whose greedy pair was the target's greedy pair. With `stop_at`
    (the exact laws), stop once any test's p-value falls below 1e-6."""
    from test_law import models_pair

    target, draft = gguf_target(), models_pair()[1]
    best = divmod(int(exact_pairs(target, SamplingConfig(0.0)).argmax()), V)
    counts = {f"row {i}": np.zeros((V, V)) for i in SAMPLED}
    counts["twins"] = np.zeros((V, V))
    counts["greedy"] = np.zeros(1)
    module = sys.modules["specdec_rs.generation.decoder"]
    original = module.verify
    if verifier is not None:
        module.verify = verifier
    try:
        for run in range(runs):
            engine = engine_type(
                target,
                lambda: sd.DraftModel(draft),
                max_batch=4,
                k=2,
                goodput=Goodput(k_max=3, profile=profile(), probe=2),
                prefill_chunk=1,
                prefix_cache=PrefixCache(megabytes=1, block=1) if run % 2 else None,
            )
            requests = [
                Request(
                    PROMPT,
                    n,
                    c.temperature,
                    c.top_k,
                    c.top_p,
                    seed=10 * run + i,
                    eos_token_id=[],
                    k=k,
                )
                for i, (c, k, n) in enumerate(ROWS)
            ]
            out = engine.run(requests)
            tokens = []
            for f in out.rows:
                assert f.result is not None, f.error
                tokens.append(f.result.tokens)
            for i in SAMPLED:
                counts[f"row {i}"][tokens[i][0], tokens[i][1]] += 1
            counts["twins"][tokens[TWINS[0]][0], tokens[TWINS[1]][0]] += 1
            counts["greedy"][0] += tuple(tokens[GREEDY][:2]) == best
            if stop_at is not None and run % 50 == 49 and caught(counts, stop_at, run + 1):
                break
    finally:
        module.verify = original
    return counts


def exact_laws() -> dict[str, np.ndarray]:
    """The exact pair law of each sampled row's settings, and the twins'
    product law of first tokens."""
    target = gguf_target()
    laws = {f"row {i}": exact_pairs(target, ROWS[i][0]) for i in SAMPLED}
    first = laws[f"row {TWINS[0]}"].sum(1)
    laws["twins"] = first[:, None] * first[None, :]
    return laws


def pvalues(counts: dict[str, np.ndarray], laws: dict[str, np.ndarray]) -> dict[str, float]:
    return {name: chi2_pvalue(counts[name], law) for name, law in laws.items()}


def caught(counts: dict[str, np.ndarray], laws: dict[str, np.ndarray], runs: int) -> bool:
    if counts["greedy"][0] < runs:
        return True
    return min(pvalues(counts, laws).values()) < SIGNIFICANCE


# bug -> (engine, verifier, the test it fails most, its effect Σ (p_bug − p)² / p)
BUGS: dict[str, tuple[type[BatchEngine], Any, str, float]] = {
    "resample_from_p": (BatchEngine, "resample_from_p", "row 1", 0.1185),
    "continue_after_reject": (BatchEngine, "continue_after_reject", "row 3", 0.9264),
    "inverted_ratio": (BatchEngine, "inverted_ratio", "row 4", 15.52),
    "greedy_check": (BatchEngine, "greedy_check", "row 0", 3.409),
    "off_by_one": (BatchEngine, "off_by_one", "row 3", 2.810),
    "no_verification": (BatchEngine, "no_verification", "row 4", 15.57),
    "rows one place off": (RowSwap, None, "row 0", 0.3599),
    "shared stream": (SharedStream, None, "twins", 3.017),
}


def test_the_batch_runs_give_the_stated_power() -> None:
    laws = exact_laws()
    for name, (_, _, test, effect) in BUGS.items():
        cells = int((laws[test] > 0).sum())
        assert power(effect, cells, RUNS) > 1 - BUG_ESCAPES, name


def test_every_row_follows_the_target_at_its_settings() -> None:
    laws = exact_laws()
    counts = batch_counts(BatchEngine, RUNS)
    assert counts["greedy"][0] == RUNS, "the greedy row left the target's greedy pair"
    for name, p in pvalues(counts, laws).items():
        assert p > SIGNIFICANCE, f"{name}: p = {p:.2e}"


@pytest.mark.parametrize("bug", BUGS)
def test_each_bug_fails_the_batch_law(bug: str) -> None:
    engine, variant, _, _ = BUGS[bug]
    laws = exact_laws()
    verifier = None if variant is None else buggy_verifier(variant)
    counts = batch_counts(engine, RUNS, verifier=verifier, stop_at=laws)
    runs = int(counts["row 0"].sum())
    assert caught(counts, laws, runs), f"{bug} went unnoticed after {runs} runs"


def measure_effects(runs: int = 2000) -> dict[str, dict[str, float]]:
    """Σ (p_bug − p)² / p − (cells − 1)/runs of each bug on each test (the
    constants in BUGS): `python tests/test_batch_law.py`."""
    laws = exact_laws()
    out = {}
    for name, (engine, variant, _, _) in BUGS.items():
        verifier = None if variant is None else buggy_verifier(variant)
        counts = batch_counts(engine, runs, verifier=verifier)
        effects = {}
        for test, law in laws.items():
            observed = counts[test] / counts[test].sum()
            mass = law > 0
            cells = int(mass.sum())
            effects[test] = float(
                (((observed - law) ** 2)[mass] / law[mass]).sum() - (cells - 1) / runs
            )
        effects["greedy"] = 1.0 - counts["greedy"][0] / runs
        out[name] = effects
        print(name, {k: round(v, 4) for k, v in effects.items()}, flush=True)
    return out


if __name__ == "__main__":
    measure_effects(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
