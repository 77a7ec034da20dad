"""The exactness harness as a library: run any speculative verifier through
a goodness-of-fit suite from your own tests. p = target, q = draft, k = γ.

A chain verifier is a callable

    verify_fn(p_rows, q_rows, drafts, rng) -> emitted tokens

with p_rows (k+1, V) float64 (row i the target after prefix + drafts[:i]),
q_rows (k, V) float64 (row i the distribution draft i was drawn from),
drafts (k,) int64 and rng a NumPy Generator (the verifier's only source of
randomness); it returns the 1..k+1 emitted token ids: the accepted drafts,
then one more. A tree verifier (`audit_tree`) takes (p_rows, q_rows,
tokens, parents, rng) as `specdec_rs.verify_tree` does. Needs scipy (in the
`hf` and `test` extras); auditing transformers needs torch and transformers.

What is tested. The verifier drives a whole generation: a target and a
drafter that are Markov chains on the last token (state = token mod S),
drafts drawn from q, rounds repeated from the last emitted token until two
tokens are out. An exact verifier makes the law of those two tokens
p(a | start) · p(b | a), whatever q is; this is what "lossless" means, and it
also holds for block verification, whose rounds are not token-wise. Each
case is checked twice on the same runs: Pearson chi-square (p-value above
`significance`) and total variation below the McDiarmid bound
`stats.tv_threshold` at false-alarm rate `significance`. Cells that the
target gives probability 0 fail at once when hit.

Cases (`default_cases`): dense random rows; sparse target rows (zeros the
draft proposes); one-hot q (a greedy drafter); q(x) near 0 where p is large
(ratios of 10^5); a large vocabulary (V = 4,096, tokens grouped into 8
buckets of consecutive ids, so 64 cells).

A verifier that returns anything but a prefix of the drafts and one more
token (at most k + 1 tokens), or an id outside [0, V), fails the case at
once, with the reason. The harness's own inputs are checked: no empty list
of cases, a significance in (0, 0.5], at most MAX_RUNS generations per case.

False alarms: 5 cases × 2 tests at significance 1e-6 each: an exact
verifier fails an audit with probability at most 1e-5 (union bound), for
any seed. Power (tests/test_testing.py, default runs and seed): every
known bug fails on the first (dense) case: resampling from p at a
rejection (TV 0.19), the inverted ratio min(1, q/p) (0.64), a greedy check
while sampling (0.81), the off-by-one target row (0.53), no verification
(0.65), continuing after a rejection (a broken contract: tokens after a
rejected draft); for trees, children tested without updating p' (0.20),
later children tested against the original p (0.15), the bonus drawn at a
rejected node (0.38), fixed children under the iid rule (0.64),
without-replacement children under the iid rule (0.12). The threshold is
0.033 there and an exact verifier's TV about 0.012, so even the smallest
of these effects escapes with probability below exp(−2 · 20,000 · 0.073²)
< 1e-90 (McDiarmid, as in `stats.tv_threshold`).

Over 400 lines on purpose: the harness is one module others import
(`from specdec_rs.testing import audit_chain, audit_tree, assert_exact`), with its
chain and tree suites, their cases and thresholds together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from specdec_rs import _checks
from specdec_rs.stats import chi2_pvalue, softmax, tv, tv_threshold
from specdec_rs.verify import ChildrenKind

ChainVerifier = Callable[[np.ndarray, np.ndarray, np.ndarray, np.random.Generator], Any]
TreeVerifier = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.random.Generator], Any]

SIGNIFICANCE = 1e-6
MAX_SIGNIFICANCE = 0.5  # a test that fails an exact verifier half the time tells nothing
RUNS = 20_000
MIN_RUNS = 100
MAX_RUNS = 10**7  # generations per case: about two hours per verifier on one core
BINARY_TREE = (-1, -1, 0, 0, 1, 1)


@dataclass(frozen=True)
class Case:
    """A target/draft pair as Markov chains: after token t the target is
    p_table[t % S] and the draft q_table[t % S], each (S, V)."""

    name: str
    p_table: np.ndarray
    q_table: np.ndarray
    k: int = 3
    start: int = 0
    buckets: int | None = None  # group the V ids into this many runs of consecutive ids

    def __post_init__(self) -> None:
        where = f"case {self.name!r}"
        for label in ("p_table", "q_table"):
            table, tol = _checks.prob_array(getattr(self, label), f"{where}: {label}", 2)
            bad = (~np.isfinite(table)) | (table < 0)
            sums = table.sum(1)
            if table.size == 0 or bad.any() or np.abs(sums - 1).max() > tol:
                raise ValueError(
                    f"{where}: {label} of shape {table.shape} must hold probability rows "
                    "(finite, >= 0, each summing to 1)"
                )
            object.__setattr__(self, label, table)
        if self.p_table.shape != self.q_table.shape:
            raise ValueError(
                f"{where}: p_table {self.p_table.shape} and q_table {self.q_table.shape} "
                "must have one shape (S, V)"
            )
        _checks.integer(self.k, f"{where}: k", minimum=1, maximum=64)
        _checks.integer(self.start, f"{where}: start", maximum=self.vocab - 1)
        if self.buckets is not None:
            _checks.integer(self.buckets, f"{where}: buckets", minimum=1, maximum=self.vocab)

    @property
    def vocab(self) -> int:
        return int(self.p_table.shape[1])

    def state(self, token: int) -> int:
        return int(token % self.p_table.shape[0])

    def cell(self, token: int) -> int:
        """The histogram cell of a token: itself, or its bucket."""
        if self.buckets is None:
            return token
        return token * self.buckets // self.vocab

    def cells(self) -> int:
        return self.buckets or self.vocab

    def exact(self) -> np.ndarray:
        """The exact law of the first two tokens, (cells, cells)."""
        p0 = self.p_table[self.state(self.start)]
        pairs = p0[:, None] * self.p_table[np.arange(self.vocab) % self.p_table.shape[0]]
        group = np.array([self.cell(t) for t in range(self.vocab)])
        out = np.zeros((self.cells(), self.cells()))
        np.add.at(out, (group[:, None], group[None, :]), pairs)
        return out


def default_cases(seed: int = 0) -> list[Case]:
    """The adversarial pairs of the module docstring (fixed by `seed`)."""
    rng = np.random.default_rng(seed)

    def rows(s: int, v: int, scale: float = 1.5) -> np.ndarray:
        return softmax(rng.normal(size=(s, v)) * scale)

    dense = Case("dense", rows(5, 5), rows(5, 5))
    p = rows(6, 6)
    p[np.arange(6), (np.arange(6) + 1) % 6] = 0.0
    p[np.arange(6), (np.arange(6) + 3) % 6] = 0.0
    sparse = Case("sparse target", p / p.sum(1, keepdims=True), rows(6, 6))
    q = rows(5, 5, 2.0)
    one_hot = Case("one-hot q", rows(5, 5), np.eye(5)[q.argmax(1)])
    p, q = rows(5, 5), rows(5, 5)
    big = p.argmax(1)
    q[np.arange(5), big] = 1e-5
    near_zero = Case("q(x) near 0", p, q / q.sum(1, keepdims=True))
    large = Case("large V", rows(4, 4096, 3.0), rows(4, 4096, 3.0), buckets=8)
    return [dense, sparse, one_hot, near_zero, large]


@dataclass(frozen=True)
class CaseResult:
    """One case's verdict: chi-square p-value, TV and its threshold."""

    case: str
    runs: int
    chi2_pvalue: float
    tv: float
    tv_threshold: float
    passed: bool
    note: str = ""  # why the case failed before any statistics (a broken contract)


@dataclass(frozen=True)
class Audit:
    """A verifier's verdict over the cases; `false_alarm` bounds the chance
    that an exact verifier fails (union bound over the tests). `passed`:
    every case passed (a field, so `--json` carries it)."""

    verifier: str
    significance: float
    false_alarm: float
    results: list[CaseResult] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # cases the verifier cannot take
    passed: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "passed", all(r.passed for r in self.results))

    def report(self) -> str:
        lines = [f"{self.verifier}: {'PASS' if self.passed else 'FAIL'}"]
        for name in self.skipped:
            lines.append(f"  {name:<14} skipped: this kind of children cannot be drawn from q")
        for r in self.results:
            if r.note:
                lines.append(f"  {r.case:<14} FAIL: {r.note}")
                continue
            lines.append(
                f"  {r.case:<14} chi2 p = {r.chi2_pvalue:.3g}  TV = {r.tv:.4f} "
                f"(threshold {r.tv_threshold:.4f})  {'ok' if r.passed else 'FAIL'}"
            )
        return "\n".join(lines)


class _Drafter:
    """Draws drafts from a case's q chain with inverse CDFs (rows precomputed)."""

    def __init__(self, case: Case) -> None:
        self.case = case
        self.cdf = np.cumsum(case.q_table, axis=1)
        self.cdf /= self.cdf[:, -1:]

    def draw(self, state: int, rng: np.random.Generator) -> int:
        row = self.cdf[state]
        return min(int(np.searchsorted(row, rng.random(), side="right")), len(row) - 1)

    def draw_without(self, state: int, taken: list[int], rng: np.random.Generator) -> int:
        """A draw from q restricted to the tokens not in `taken` (rejection:
        redraw until new, which is that law; explicitly after 64 tries)."""
        for _ in range(64):
            x = self.draw(state, rng)
            if x not in taken:
                return x
        w = self.case.q_table[state].copy()
        w[taken] = 0.0
        return int(rng.choice(len(w), p=w / w.sum()))


def _emitted(out: Any, what: str, vocab: int) -> list[int]:
    """The emitted ids of one round: 1 or more integers in [0, V). Anything
    else breaks the contract (AssertionError with the reason): a negative id
    would otherwise index the histogram from its end, unseen."""
    if isinstance(out, tuple) and len(out) == 2:
        raise AssertionError(
            f"{what} returned a pair {type(out[0]).__name__}, {type(out[1]).__name__}; expected "
            "the emitted token ids alone (for specdec_rs.verify_tree: its [0], the tokens, "
            "not (tokens, nodes))"
        )
    try:
        tokens = np.asarray(out).ravel()
    except (ValueError, TypeError) as e:
        raise AssertionError(f"{what} returned {out!r}, not an array of token ids ({e})") from None
    if tokens.size == 0 or tokens.dtype.kind not in "iu":
        raise AssertionError(f"{what} returned {out!r}; expected 1 or more integer token ids")
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0 or high >= vocab:
        raise AssertionError(
            f"{what} returned {tokens.tolist()}: token id {low if low < 0 else high} out of "
            f"[0, {vocab})"
        )
    return [int(t) for t in tokens]


def _chain_round(
    verify_fn: ChainVerifier, case: Case, drafter: _Drafter
) -> Callable[..., list[int]]:
    k = case.k

    def round_(last: int, rng: np.random.Generator) -> list[int]:
        states, drafts = [case.state(last)], []
        for _ in range(k):
            drafts.append(drafter.draw(states[-1], rng))
            states.append(case.state(drafts[-1]))
        p_rows = case.p_table[states]
        q_rows = case.q_table[states[:k]]
        d = np.array(drafts, dtype=np.int64)
        tokens = _emitted(verify_fn(p_rows, q_rows, d, rng), "verify_fn", case.vocab)
        n = len(tokens)
        if n > k + 1 or tokens[: n - 1] != drafts[: n - 1]:
            raise AssertionError(
                f"verify_fn returned {tokens} for drafts {drafts}; expected the accepted drafts "
                "(a prefix of the drafts) and then one more token"
            )
        return tokens

    return round_


def _tree_round(
    verify_fn: TreeVerifier, case: Case, drafter: _Drafter, parents: Sequence[int], children: str
) -> Callable[..., list[int]]:
    n = len(parents)
    kids = [[i for i, par in enumerate(parents) if par + 1 == r] for r in range(n + 1)]
    order = np.argsort(-case.q_table, axis=1, kind="stable")
    par = np.array(parents, dtype=np.int64)

    def round_(last: int, rng: np.random.Generator) -> list[int]:
        tokens = np.zeros(n, dtype=np.int64)
        states = [case.state(last)] + [0] * n
        for r in range(n + 1):
            if r > 0:
                states[r] = case.state(int(tokens[r - 1]))
            s = states[r]
            if children == "fixed":
                tokens[kids[r]] = order[s, : len(kids[r])]
            elif children == "iid":
                for c in kids[r]:
                    tokens[c] = drafter.draw(s, rng)
            else:
                taken: list[int] = []
                for c in kids[r]:
                    taken.append(drafter.draw_without(s, taken, rng))
                    tokens[c] = taken[-1]
        p_rows = case.p_table[states]
        q_rows = case.q_table[states]
        out = _emitted(verify_fn(p_rows, q_rows, tokens, par, rng), "verify_fn", case.vocab)
        if len(out) > n + 1:
            raise AssertionError(f"verify_fn returned {len(out)} tokens for a tree of {n} nodes")
        return out

    return round_


def _case_result(
    round_: Callable[[int, np.random.Generator], list[int]],
    case: Case,
    runs: int,
    rng: np.random.Generator,
    significance: float,
) -> CaseResult:
    hist = np.zeros((case.cells(), case.cells()))
    exact = case.exact()
    for _ in range(runs):
        out: list[int] = []
        last = case.start
        while len(out) < 2:
            try:
                emitted = round_(last, rng)
            except AssertionError as e:
                threshold = tv_threshold(exact, runs, significance)
                return CaseResult(case.name, runs, 0.0, 1.0, threshold, False, str(e))
            out += emitted
            last = emitted[-1]
        hist[case.cell(out[0]), case.cell(out[1])] += 1
    pvalue = chi2_pvalue(hist, exact)
    distance = tv(hist, exact)
    threshold = tv_threshold(exact, runs, significance)
    passed = pvalue > significance and distance < threshold
    return CaseResult(case.name, runs, pvalue, distance, threshold, passed)


def check_cases(cases: Sequence[Case] | None) -> list[Case]:
    """The cases to audit: `default_cases()` for None, else a non-empty
    sequence of `Case` (an empty one would pass any verifier)."""
    if cases is None:
        return default_cases()
    if isinstance(cases, Case | str | bytes) or not isinstance(cases, Sequence):
        raise ValueError(
            f"cases = {cases!r} must be a list of testing.Case (or None for default_cases())"
        )
    chosen = list(cases)
    if not chosen:
        raise ValueError(
            "cases = [] audits nothing, so it would pass any verifier; pass None for "
            "default_cases() or one or more testing.Case"
        )
    for i, c in enumerate(chosen):
        if not isinstance(c, Case):
            raise ValueError(f"cases[{i}] = {c!r} ({type(c).__name__}) must be a testing.Case")
    return chosen


def check_significance(significance: Any) -> float:
    """The false-alarm rate of each test: a number in (0, 0.5]."""
    return _checks.real(
        significance,
        "significance",
        above=0.0,
        maximum=MAX_SIGNIFICANCE,
        hint=" (the chance an exact verifier fails one test, e.g. 1e-6)",
    )


def _audit(
    name: str,
    make_round: Callable[[Case, _Drafter], Callable[..., list[int]]],
    cases: Sequence[Case] | None,
    runs: int,
    seed: int,
    significance: float,
    usable: Callable[[Case], bool] = lambda case: True,
    fail_fast: bool = False,
) -> Audit:
    chosen = check_cases(cases)
    significance = check_significance(significance)
    runs = _checks.integer(runs, "runs", minimum=MIN_RUNS, maximum=MAX_RUNS)
    rng = np.random.default_rng(_checks.seed(seed))
    skipped = [c.name for c in chosen if not usable(c)]
    chosen = [c for c in chosen if usable(c)]
    if not chosen:
        raise ValueError(
            f"none of the cases {skipped} can be drawn for this verifier; pass cases with "
            "enough tokens of positive draft probability"
        )
    results = []
    for c in chosen:
        results.append(_case_result(make_round(c, _Drafter(c)), c, runs, rng, significance))
        if fail_fast and not results[-1].passed:
            break
    return Audit(name, significance, 2 * len(chosen) * significance, results, skipped)


def audit_chain(
    verify_fn: ChainVerifier,
    *,
    cases: Sequence[Case] | None = None,
    runs: int = RUNS,
    seed: int = 0,
    significance: float = SIGNIFICANCE,
    name: str | None = None,
    fail_fast: bool = False,
) -> Audit:
    """Run a chain verifier through the suite; returns the verdict (see the
    module docs). fail_fast: stop at the first failing case."""
    _checks.function(verify_fn, "verify_fn")
    return _audit(
        name or str(getattr(verify_fn, "__name__", "verify_fn")),
        lambda c, d: _chain_round(verify_fn, c, d),
        cases,
        runs,
        seed,
        significance,
        fail_fast=fail_fast,
    )


def audit_tree(
    verify_fn: TreeVerifier,
    *,
    children: str = "iid",
    parents: Sequence[int] = BINARY_TREE,
    cases: Sequence[Case] | None = None,
    runs: int = RUNS,
    seed: int = 0,
    significance: float = SIGNIFICANCE,
    name: str | None = None,
    fail_fast: bool = False,
) -> Audit:
    """Run a tree verifier through the suite: each round draws a tree of the
    shape `parents` from q (children "iid", "without_replacement" (Gumbel
    top-k) or "fixed" (q's top tokens)) and calls verify_fn(p_rows, q_rows,
    tokens, parents, rng) with rows as `specdec_rs.verify_tree` reads them."""
    _checks.function(verify_fn, "verify_fn")
    kind = _checks.choice(children, "children", ("iid", "without_replacement", "fixed"))
    shape = _checks.integers(parents, "parents", minimum=-1)
    widest = max((shape.count(r) for r in range(-1, len(shape))), default=0)

    def usable(case: Case) -> bool:  # enough distinct tokens to draw siblings from
        if kind == "without_replacement":
            return bool((case.q_table > 0).sum(1).min() >= widest)
        return kind != "fixed" or case.vocab >= widest

    return _audit(
        name or f"{getattr(verify_fn, '__name__', 'verify_fn')} ({kind})",
        lambda c, d: _tree_round(verify_fn, c, d, shape, kind),
        cases,
        runs,
        seed,
        significance,
        usable,
        fail_fast,
    )


def assert_exact(
    verify_fn: ChainVerifier,
    *,
    cases: Sequence[Case] | None = None,
    runs: int = RUNS,
    seed: int = 0,
    significance: float = SIGNIFICANCE,
) -> Audit:
    """`audit_chain`, raising AssertionError with the report at the first
    failing case. For pytest:

    >>> import specdec_rs as sd
    >>> from specdec_rs.testing import assert_exact
    >>> def rust(p, q, drafts, rng):
    ...     return sd.verify(p, q, drafts, seed=int(rng.integers(2**63)))
    >>> assert_exact(rust, runs=2_000).passed
    True
    """
    audit = audit_chain(
        verify_fn, cases=cases, runs=runs, seed=seed, significance=significance, fail_fast=True
    )
    if not audit.passed:
        raise AssertionError(audit.report())
    return audit


# ----------------------------------------------------------------- adapters


def project_verifiers() -> dict[str, ChainVerifier | TreeVerifier]:
    """The project's own verifiers in the harness's signatures."""
    import specdec_rs as sd

    def seed_of(rng: np.random.Generator) -> int:
        return int(rng.integers(2**63))

    def token(p: np.ndarray, q: np.ndarray, d: np.ndarray, rng: np.random.Generator) -> Any:
        return sd.verify(p, q, d, seed_of(rng))

    def block(p: np.ndarray, q: np.ndarray, d: np.ndarray, rng: np.random.Generator) -> Any:
        return sd.verify(p, q, d, seed_of(rng), method="block")

    def tree(kind: ChildrenKind) -> TreeVerifier:
        def verify(
            p: np.ndarray, q: np.ndarray, t: np.ndarray, par: np.ndarray, rng: np.random.Generator
        ) -> Any:
            return sd.verify_tree(p, q, t, par, seed_of(rng), children=kind)[0]

        return verify

    return {
        "chain": token,
        "block": block,
        "tree-iid": tree("iid"),
        "tree-without_replacement": tree("without_replacement"),
        "tree-fixed": tree("fixed"),
    }


def transformers_verifier() -> tuple[str, ChainVerifier]:
    """transformers' own speculative sampling step (assisted generation with
    do_sample=True) as a chain verifier, found by name and called with
    logits = log(probs) (softmax gives the rows back); torch's global RNG is
    seeded from `rng` per call. Returns (the function's qualified name, verifier)."""
    import inspect

    import torch
    from transformers.generation import utils

    fn = getattr(utils, "_speculative_sampling", None)
    if fn is None:
        names = [
            n for n in dir(utils) if "speculative" in n.lower() and callable(getattr(utils, n))
        ]
        if not names:
            raise ValueError(
                "this transformers version has no speculative sampling function in "
                "transformers.generation.utils; nothing to audit"
            )
        fn = getattr(utils, names[0])
    params = inspect.signature(fn).parameters
    extra = {"is_done_candidate": False} if "is_done_candidate" in params else {}

    def verify(p: np.ndarray, q: np.ndarray, d: np.ndarray, rng: np.random.Generator) -> Any:
        torch.default_generator.manual_seed(
            int(rng.integers(2**63))
        )  # the CPU stream it draws from
        k = len(d)
        with np.errstate(divide="ignore"):
            p_logits = torch.from_numpy(np.log(p))[None]
            q_logits = torch.from_numpy(np.log(q))[None]
        tokens, _ = fn(torch.from_numpy(d)[None], q_logits, k, p_logits, **extra)
        out: npt.NDArray[np.int64] = tokens[0].numpy().astype(np.int64)
        return out

    import transformers

    return f"{utils.__name__}.{fn.__name__} (transformers {transformers.__version__})", verify


# ------------------------------------------------------------------- audits

AUDITS = ("chain", "block", "tree", "transformers")


@dataclass(frozen=True)
class AuditReport:
    """The verdicts of `run_audits`."""

    audits: list[Audit]
    runs: int
    seed: int
    passed: bool = field(init=False)  # every audit passed

    def __post_init__(self) -> None:
        object.__setattr__(self, "passed", all(a.passed for a in self.audits))


def run_audits(names: Sequence[str] = AUDITS, *, runs: int = RUNS, seed: int = 0) -> AuditReport:
    """Audit verifiers by name: "chain" (`verify`), "block" (`verify`,
    method="block"), "tree" (`verify_tree`, each children kind on a binary
    tree of depth 2), "transformers" (transformers' own speculative sampling
    step; needs torch and transformers)."""
    if isinstance(names, str):
        names = [names]
    chosen = [_checks.choice(n, "verifier", AUDITS) for n in names]
    runs = _checks.integer(runs, "runs", minimum=MIN_RUNS, maximum=MAX_RUNS)
    seed = _checks.seed(seed)
    if not chosen:
        raise ValueError(f"no verifier to audit; name one or more of {', '.join(AUDITS)}")
    own = project_verifiers()
    audits = []
    for name in dict.fromkeys(chosen):
        if name in ("chain", "block"):
            fn = own[name]
            label = "specdec_rs.verify" + (' (method="block")' if name == "block" else "")
            audits.append(audit_chain(fn, runs=runs, seed=seed, name=label))  # type: ignore[arg-type]
        elif name == "tree":
            for kind in ("iid", "without_replacement", "fixed"):
                audits.append(
                    audit_tree(
                        own[f"tree-{kind}"],  # type: ignore[arg-type]
                        children=kind,
                        runs=runs,
                        seed=seed,
                        name=f'specdec_rs.verify_tree (children="{kind}")',
                    )
                )
        else:
            try:
                import torch

                label, fn = transformers_verifier()
            except ImportError as e:
                raise ValueError(
                    f"auditing transformers needs torch and transformers ({e}); "
                    "pip install torch transformers"
                ) from None
            threads = torch.get_num_threads()
            torch.set_num_threads(1)  # rows of a few entries: threads only add overhead
            try:
                audits.append(audit_chain(fn, runs=runs, seed=seed, name=label))
            finally:
                torch.set_num_threads(threads)
    return AuditReport(audits, runs, seed)
