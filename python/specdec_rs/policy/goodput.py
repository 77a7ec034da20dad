"""`Goodput`, the load-aware γ of each row of a batch: the γ_i that
maximise the batch's predicted tokens per second at its current size.
p = target, q = draft, k = γ.

A batch round of B rows, row i asking for γ_i drafts, costs

    C(γ) = Σ_i [D(γ_i) + W_0 + W·E[n_i]] + E[T(B, n̄)] + R(B),   n̄ = mean_i n_i,

and emits Σ_i E_i(γ_i) tokens, E_i(γ) = 1 + Σ_{j≤γ} a_{i,j}, where a_{i,j}
is row i's rate of keeping at least j drafts in rounds that asked for j or
more (a draft the drafter did not propose counts as not kept; a_{i,j} ≤
a_{i,j-1} ≤ r_i, as keeping j drafts implies keeping j - 1).

- D(γ) = d_0 + d_1·γ for γ ≥ 1 (a line fitted to the rounds' drafting
  seconds, pooled over rows), D(0) = d_idle (measured apart: what the
  drafter costs in a round that asks for nothing).
- W_0 + W·n: a row's verification, cropping and drafter update after a
  block of n positions (a line fitted to the rounds). So a drafter's cost
  at γ = 0 (its update every round) is d_idle + W_0 + W, not nothing.
- Row i's block: the drafter proposes at all in a share r_i of the rounds
  that ask (its drafting rate) and then a share f_i of the drafts asked
  (its fill), so n_i = 1 + γ_i·f_i with probability r_i, else 1. A bursty
  drafter (prompt lookup: all or nothing) is priced by the rounds in which
  it drafts: E[T] is the expectation over which rows draft, exact for up
  to `EXACT_ROWS` rows that may or may not draft, at their mean beyond
  (where the ragged forward's positions average out).
- T(B, n̄): the target forward over B rows × n̄ positions (the forward is
  ragged: only the total counts), from a profile (`ForwardProfile`, at the
  rows' mean context), times the decayed mean of measured / profiled
  forward time (kept per positions per row).
- R(B): the round's own seconds outside its rows and its forward (the
  engine's glue; a line in B fitted to the rounds).

The policy maximises Σ_i E_i(γ_i) / C(γ) over the vector γ (each γ_i in
0..k_max) by Dinkelbach's iteration: at the current rate λ, each row in
turn takes the γ_i that maximises Σ E − λ·C, from the last round's
vector; the result is checked against every uniform γ. It optimises
when the batch's rows change and every `REPLAN` rounds (the rates move
slowly; a choice costs about a millisecond at B = 8 in Python). A row with little
history borrows the pooled rates of all rows (before any round, a_j =
2^-j). Acceptance alone never decides: at a large B, T(B, γ + 1) nears
(γ + 1)·T(B, 1) and the same acceptance stops paying, which is why γ
falls with the load; and a row whose drafts are rarely kept gets γ = 0
while a row beside it copying text gets many.

Where the batch has run `MEASURED` or more recent rounds of a kind
(drafting, or every row off) at its current size, the measured /
predicted tokens per second of those rounds rescales the model's rate of
every vector of that kind: a model that overrates drafting (its
acceptance comes in bursts the rates average away, its blocks cost more
than the profile says) is corrected by the rounds it chose. Hysteresis:
the vector changes only when the new one is predicted to beat the
current one by `hysteresis` (relative). A row at γ = 0 drafts `probe_k`
in one round after `probe` rounds off, so its rates stay current; each
probe that leaves it off doubles its wait, up to 16 · `probe` rounds.
`report()` says what the policy did (the server's /metrics reads it).
The policy sees only what past rounds did, so every round stays exact.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from specdec_rs import _checks
from specdec_rs.policy.base import MAX_K

MAX_PROBE_FACTOR = 16  # a row's probes back off to one in 16 · probe rounds


@dataclass(frozen=True)
class ForwardProfile:
    """T(B, n, L): seconds of the target forward over B rows × n positions
    after L cached positions each, measured on a grid at `context` L
    (`table[(B, n)]`) and, optionally, at a longer `long_context`
    (`long[(B, n)]`, the same grid); interpolated linearly in B, n and L
    between grid points (extrapolated by the last slope beyond). Attention
    over the cache grows with L, so at long contexts each extra position
    costs more than at short ones."""

    table: dict[tuple[int, int], float]
    context: int = 0
    long: dict[tuple[int, int], float] = field(default_factory=dict)
    long_context: int = 0

    def __post_init__(self) -> None:
        if not self.table:
            raise ValueError("a forward profile needs at least one measured (B, n)")
        for grid in (self.table, self.long):
            for (b, n), t in grid.items():
                if b < 1 or n < 1 or not t > 0:
                    raise ValueError(
                        f"forward profile entry T({b}, {n}) = {t}: expected B, n >= 1, T > 0"
                    )
        bs = sorted({b for b, _ in self.table})
        ns = sorted({n for _, n in self.table})
        if len(self.table) != len(bs) * len(ns):
            raise ValueError("a forward profile is a full grid of batch sizes × positions")
        if self.long and (set(self.long) != set(self.table) or self.long_context <= self.context):
            raise ValueError(
                "a forward profile's long-context grid has the same (B, n) as its table, "
                "at a longer context"
            )

    @property
    def batch_sizes(self) -> list[int]:
        return sorted({b for b, _ in self.table})

    @property
    def positions(self) -> list[int]:
        return sorted({n for _, n in self.table})

    def seconds(self, batch: float, n: float, context: float | None = None) -> float:
        """T(batch, n, context), interpolated (context None: the table's)."""
        short = self._at(self.table, batch, n)
        if not self.long or context is None:
            return short
        long = self._at(self.long, batch, n)
        share = (context - self.context) / (self.long_context - self.context)
        return max(short + (long - short) * share, 0.5 * min(short, long))

    def _at(self, grid: dict[tuple[int, int], float], batch: float, n: float) -> float:
        memo: dict[tuple[int, float], tuple[list[int], list[float]]] = self.__dict__.setdefault(
            "_memo", {}
        )  # per (grid, batch size): T at each n of the grid (the policy asks every round)
        key = (id(grid), batch)
        if key not in memo:
            bs, ns = self.batch_sizes, self.positions
            memo[key] = (ns, [_interp(bs, [grid[(b, m)] for b in bs], batch) for m in ns])
        ns, at_n = memo[key]
        return _interp(ns, at_n, n)

    def v(self, batch: int, n: float, context: float | None = None) -> float:
        """v(B, n) = T(B, n) / T(B, 1): a forward over n positions in steps."""
        return self.seconds(batch, n, context) / self.seconds(batch, 1, context)

    def to_json(self) -> dict[str, Any]:
        return {
            "context": self.context,
            "table": [[b, n, t] for (b, n), t in sorted(self.table.items())],
            "long_context": self.long_context,
            "long": [[b, n, t] for (b, n), t in sorted(self.long.items())],
        }

    @classmethod
    def from_json(cls, obj: Any) -> ForwardProfile:
        try:
            table = {(int(b), int(n)): float(t) for b, n, t in obj["table"]}
            long = {(int(b), int(n)): float(t) for b, n, t in obj.get("long", [])}
            return cls(table, int(obj.get("context", 0)), long, int(obj.get("long_context", 0)))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"not a forward profile ({e})") from None


def _interp(xs: list[int], ys: list[float], x: float) -> float:
    if len(xs) == 1:
        return ys[0] * (x / xs[0] if x > xs[0] else 1.0)
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    y = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return max(y, min(ys) * 0.5)


class _Line:
    """y ≈ a + b·x by decayed least squares, a, b ≥ 0 (through the origin
    when the free line's intercept would be negative)."""

    def __init__(self) -> None:
        self.w = self.x = self.y = self.xx = self.xy = 0.0

    def add(self, x: float, y: float, decay: float) -> None:
        self.w = decay * self.w + 1.0
        self.x = decay * self.x + x
        self.y = decay * self.y + y
        self.xx = decay * self.xx + x * x
        self.xy = decay * self.xy + x * y

    def at(self, x: float) -> float:
        """The fitted y at x (0 before any point)."""
        if self.w <= 0:
            return 0.0
        mx, my = self.x / self.w, self.y / self.w
        var = self.xx / self.w - mx * mx
        b = max(0.0, (self.xy / self.w - mx * my) / var) if var > 1e-9 * (1.0 + mx * mx) else 0.0
        a = my - b * mx
        if a < 0.0:
            a, b = 0.0, max(0.0, self.xy / self.xx) if self.xx > 0 else 0.0
        return a + b * x


class _Rates:
    """A row's (or the pool's) decayed counts: rounds that asked for j or
    more drafts (`asked[j]`, j = 1..k_max; asked[1] counts every round that
    asked), those that kept j or more (`kept[j]`), the rounds that asked in
    which the drafter proposed anything (`drafting`), and the sum of
    drafted / asked over those (`fill`); and the row's γ state (its last
    γ, its rounds off and the wait before its next probe)."""

    def __init__(self, k_max: int, probe: int):
        self.asked = [0.0] * (k_max + 1)
        self.kept = [0.0] * (k_max + 1)
        self.drafting = self.fill = 0.0
        self.k: int | None = None  # the γ chosen for it last round (None: new)
        self.off_rounds = 0
        self.interval = probe

    def add(self, asked: int, drafted: int, accepted: int, decay: float) -> None:
        self.drafting = decay * self.drafting + float(drafted > 0)
        self.fill = decay * self.fill + (drafted / asked if drafted > 0 else 0.0)
        for j in range(1, len(self.asked)):
            self.asked[j] *= decay
            self.kept[j] *= decay
            if j <= asked:
                self.asked[j] += 1.0
                self.kept[j] += float(j <= accepted)


@dataclass(frozen=True)
class _View:
    """What the cost model reads of one row: E(k) for k = 0..k_max, its
    drafting rate r and fill f."""

    expected: list[float]
    drafting: float
    fill: float


class BatchRow(NamedTuple):
    """A row the policy chooses a γ for: its request id, and the positions
    in its cache (its context length; None: not known)."""

    id: int
    length: int | None = None


@dataclass(frozen=True)
class Choice:
    """The policy's γ for one batch round: `ks[row id]` for the rows it
    chose for (a probe included), and the model's tokens and seconds of
    that round before any measured rescaling; `predicted`, its tokens per
    second as the policy rates it (rescaled)."""

    ks: dict[int, int]
    tokens: float
    seconds: float
    predicted: float | None

    @property
    def drafting(self) -> bool:
        """Some row asks for drafts (the key of the measured rounds' ratio)."""
        return any(self.ks.values())


@dataclass(frozen=True)
class GoodputReport:
    """What the policy did since its start: batch rounds it chose for,
    row rounds by the γ chosen (`rows_by_k[k]`, probes under their γ),
    probes, changes of the vector, and the last choice's predicted and
    the decayed measured tokens per second of its rounds."""

    rounds: int
    rows_by_k: tuple[int, ...]
    probes: int
    switches: int
    predicted: float | None
    measured: float | None


EXACT_ROWS = 4  # E[T] over which rows draft: exact up to 2^4 terms, by the mean beyond
SWEEPS = 3  # Dinkelbach sweeps over the rows per optimisation
REPLAN = 4  # rounds between optimisations while the batch keeps its rows
MEASURED = 16  # rounds of a kind at a B before their measured ratio rescales the model
STALE = 256  # rounds after which a kind not run again is predicted anew


class Goodput:
    """Each row's γ by the batch's predicted goodput (see the module docs).

    k_max: the largest γ considered; profile: T(B, n) (None: measured by the
    engine at start, or read from its cached table); hysteresis: the
    relative gain a new vector must promise; probe / probe_k: a row at
    γ = 0 drafts probe_k in one round of `probe`; prior: pseudo-rounds of
    the pooled rates in each row's estimate; decay: of the counts and
    cost fits.
    """

    name = "goodput"

    def __init__(
        self,
        *,
        k_max: int = 6,
        profile: ForwardProfile | None = None,
        hysteresis: float = 0.03,
        probe: int = 32,
        probe_k: int = 2,
        prior: float = 4.0,
        decay: float = 0.98,
    ):
        self.k_max = _checks.integer(k_max, "k_max", minimum=1, maximum=MAX_K)
        if profile is not None and not isinstance(profile, ForwardProfile):
            raise ValueError(
                f"profile is a {type(profile).__name__}; pass a ForwardProfile or None"
            )
        self.profile = profile
        self.hysteresis = _checks.real(hysteresis, "hysteresis", minimum=0.0, maximum=10.0)
        self.probe = _checks.integer(probe, "probe", minimum=1, maximum=10**6)
        self.probe_k = _checks.integer(probe_k, "probe_k", minimum=1, maximum=self.k_max)
        self.prior = _checks.real(prior, "prior", minimum=0.0, maximum=1e6)
        self.decay = _checks.real(decay, "decay", above=0.0, maximum=1.0)
        self.reset()

    def reset(self) -> None:
        self.rows: dict[int, _Rates] = {}
        self.pooled = _Rates(self.k_max, self.probe)
        self.k = 1  # the γ most rows took last round; a new row starts from it
        self.scales: dict[int, float] = {}  # measured T / profiled T, by positions per row
        self.runs: dict[tuple[int, int], _Run] = {}  # (B, mean γ) -> measured / predicted
        self.round = 0
        self.context: float | None = None  # the rows' mean length at the last choice
        self.drafting_s = _Line()  # a row's drafting seconds against γ (rounds that asked)
        self.idle_s: float | None = None  # a row's drafting seconds in rounds that asked none
        self.row_s = _Line()  # a row's verification seconds against its block's positions
        self.round_s = _Line()  # a round's seconds outside its rows and forward, against B
        self.chosen = 0  # batch rounds chosen since reset
        self.planned_ids: list[int] = []  # the rows of the last optimisation
        self.planned_at = 0  # and its round (chosen)
        self.rows_by_k = [0] * (self.k_max + 1)
        self.probes = self.switches = 0
        self.predicted_last: float | None = None
        self.measured: float | None = None

    # ---- the engine's calls
    def profiled_positions(self) -> range:
        """The positions per row n the forward profile must cover: 1..k_max + 1."""
        return range(1, self.k_max + 2)

    def start(self, profile: ForwardProfile) -> None:
        """At the engine's start: past rows forgotten; `profile` the engine's
        T(B, n, L) (measured on it, or its cached table; the given one)."""
        if not isinstance(profile, ForwardProfile):
            raise ValueError(f"profile is a {type(profile).__name__}; pass a ForwardProfile")
        self.reset()
        self.profile = profile

    def join(self, rid: int) -> None:
        self.rows[rid] = _Rates(self.k_max, self.probe)

    def leave(self, rid: int) -> None:
        self.rows.pop(rid, None)

    def choose(self, rows: Sequence[BatchRow]) -> Choice:
        """Each row's γ for this round (`Choice`) for the batch's rows that
        take the policy's γ (`BatchRow`: id and, where known, context length)."""
        ids = [r.id for r in rows]
        if not ids:
            return Choice({}, 0.0, 0.0, None)
        lengths = [r.length for r in rows if r.length is not None]
        self.context = sum(lengths) / len(lengths) if lengths else None
        states = [self.rows.setdefault(rid, _Rates(self.k_max, self.probe)) for rid in ids]
        views = [self.view(rid) for rid in ids]
        current = [s.k if s.k is not None else self.k for s in states]
        ks = current
        if ids != self.planned_ids or self.chosen - self.planned_at >= REPLAN:
            self.planned_ids, self.planned_at = ids, self.chosen
            candidates = [current, *([k] * len(ids) for k in range(self.k_max + 1))]
            candidates.append(self.per_row(views, current))
            rated = [(self.rate(ks, *self.evaluate(views, ks)), ks) for ks in candidates]
            best_rate, best = max(rated, key=lambda rk: (rk[0], -sum(rk[1])))
            if not self.chosen or best_rate > (1.0 + self.hysteresis) * rated[0][0]:
                if self.chosen and best != current:
                    self.switches += 1
                ks = best
        run = list(ks)
        for i, state in enumerate(states):
            state.k = ks[i]
            if ks[i] == 0:
                state.off_rounds += 1
                if state.off_rounds >= state.interval:
                    run[i], state.off_rounds = self.probe_k, 0
                    # a probe that does not turn the row on makes its next one rarer
                    state.interval = min(2 * state.interval, MAX_PROBE_FACTOR * self.probe)
                    self.probes += 1
            else:
                state.off_rounds, state.interval = 0, self.probe
        counts = [ks.count(k) for k in range(self.k_max + 1)]
        self.k = max(range(self.k_max + 1), key=lambda k: (counts[k], -k))
        for k in run:
            self.rows_by_k[k] += 1
        tokens, seconds = self.evaluate(views, run)
        predicted = self.rate(run, tokens, seconds)
        self.chosen += 1
        self.predicted_last = predicted
        return Choice(dict(zip(ids, run, strict=True)), tokens, seconds, predicted)

    def observe(
        self,
        rounds: Iterable[tuple[int, Any]],
        rows: int,
        target_s: float,
        *,
        choice: Choice | None = None,
        tokens: int = 0,
        seconds: float = 0.0,
    ) -> None:
        """A batch round: each row's (id, `Round`), the rows in its forward
        and its seconds; the cost fits (drafting, verification, the
        forward's measured / profiled time) and the rates (of the drafter's
        own drafts: a round a grammar forced, or its forced tail, teaches
        neither the acceptance nor the drafting cost); with `choice`
        (every row ran at the policy's γ), its measured tokens and seconds
        against the choice's prediction."""
        rounds = list(rounds)
        self.round += 1
        if choice is not None and seconds > 0 and choice.seconds > 0:
            run = self.runs.setdefault((rows, choice.drafting), _Run())
            run.add(tokens, seconds, choice.tokens, choice.seconds, self.round, self.decay)
            self.measured = _mean(self.measured, tokens / seconds, self.decay)
        if seconds > 0 and target_s > 0:
            rows_s = sum(r.draft_s + r.verify_s for _, r in rounds)
            self.round_s.add(rows, max(0.0, seconds - target_s - rows_s), self.decay)
        if self.profile is not None and rounds and target_s > 0:
            n = sum(r.positions for _, r in rounds) / len(rounds)
            ratio = target_s / self.profile.seconds(rows, n, self.context)
            key = round(n)
            self.scales[key] = _mean(self.scales.get(key), ratio, 0.9)
        for rid, r in rounds:
            if r.tree:
                continue
            self.row_s.add(r.positions, r.verify_s, self.decay)  # forced rows are verified too
            if r.forced:
                continue  # a grammar's drafts, no drafter's: nothing of the drafter to learn
            own = r.drafters_part()  # a forced tail dropped
            if own.asked > 0:
                rates = self.rows.get(rid)
                if rates is not None:
                    rates.add(own.asked, own.drafted, own.accepted, self.decay)
                self.pooled.add(own.asked, own.drafted, own.accepted, self.decay)
                self.drafting_s.add(own.asked, r.draft_s, self.decay)
            else:
                self.idle_s = _mean(self.idle_s, r.draft_s, self.decay)

    def report(self) -> GoodputReport:
        return GoodputReport(
            self.chosen,
            tuple(self.rows_by_k),
            self.probes,
            self.switches,
            self.predicted_last,
            self.measured,
        )

    # ---- the model
    def view(self, rid: int) -> _View:
        """Row `rid`'s E(k), drafting rate r and fill f: its counts plus
        `prior` rounds at the pool's (r = drafting rounds / asking rounds,
        f = Σ drafted / asked over drafting rounds; the pool's own with one
        more round at r = f = 1), so that r ≥ a_1 as the data has it."""
        row = self.rows.get(rid) or _Rates(self.k_max, self.probe)
        pooled, prior = self.pooled, self.prior
        pool_r = (pooled.drafting + 1.0) / (pooled.asked[1] + 1.0)
        pool_f = (pooled.fill + 1.0) / (pooled.drafting + 1.0)
        asking = row.asked[1] + prior
        drafting = (row.drafting + prior * pool_r) / asking if asking > 0 else pool_r
        drafts = row.drafting + prior
        fill = (row.fill + prior * pool_f) / drafts if drafts > 0 else pool_f
        return _View(self.expected_all(rid, drafting), drafting, fill)

    def expected_all(self, rid: int, drafting: float = 1.0) -> list[float]:
        """E_i(k) = 1 + Σ_{j<=k} a_{i,j} for k = 0..k_max: the row's counts
        plus `prior` rounds at the pooled rate of all rows (itself 2^-j
        before any round), each a_j at most a_{j-1} (a_0: the row's
        drafting rate), as keeping j drafts implies keeping j - 1."""
        row = self.rows.get(rid) or _Rates(self.k_max, self.probe)
        pooled = self.pooled
        out = [1.0]
        for j in range(1, self.k_max + 1):
            pool_rate = (pooled.kept[j] + 0.5**j) / (pooled.asked[j] + 1.0)
            a = (row.kept[j] + self.prior * pool_rate) / (row.asked[j] + self.prior)
            a = min(a, out[-1] - out[-2] if j > 1 else drafting)
            out.append(out[-1] + a)
        return out

    def fill(self, rid: int) -> float:
        """The share of asked drafts row `rid` gets in the rounds it drafts."""
        return self.view(rid).fill

    def evaluate(self, views: Sequence[_View], ks: Sequence[int]) -> tuple[float, float]:
        """(Σ_i E_i(γ_i), C(γ)): the model's tokens and seconds of a round
        in which row i asks for ks[i] drafts (see the module docs)."""
        b = len(ks)
        tokens = seconds = 0.0
        certain, uncertain = 0.0, []
        for v, k in zip(views, ks, strict=True):
            tokens += v.expected[k]
            extra = k * v.fill
            seconds += self._row_seconds(v, k)
            if k == 0 or v.drafting <= 0.0:
                continue
            if v.drafting >= 1.0:
                certain += extra
            else:
                uncertain.append((v.drafting, extra))
        if len(uncertain) > EXACT_ROWS:  # many rows: their positions average out
            certain += sum(r * m for r, m in uncertain)
            uncertain = []
        forward = 0.0
        for mask in range(1 << len(uncertain)):
            chance, total = 1.0, certain
            for j, (r, m) in enumerate(uncertain):
                if mask >> j & 1:
                    chance *= r
                    total += m
                else:
                    chance *= 1.0 - r
            forward += chance * self.forward_seconds(b, 1.0 + total / b)
        return tokens, seconds + forward + self.round_s.at(b)

    def per_row(self, views: Sequence[_View], start: Sequence[int]) -> list[int]:
        """Dinkelbach's iteration from `start`: at λ = the vector's rate,
        each row in turn takes argmax_k E_i(k) − λ·C_i(k) (ties: the smaller
        k), C_i(k) its own seconds and the forward's, priced with row i
        drafting or not (r_i) and the other rows at their mean positions."""
        b, ks_all = len(start), range(self.k_max + 1)
        own = [v.expected for v in views]
        cost = [[self._row_seconds(v, k) for k in ks_all] for v in views]
        extra = [[k * v.fill for k in ks_all] for v in views]
        ks = list(start)
        for _ in range(SWEEPS):
            before = list(ks)
            tokens, seconds = self.evaluate(views, ks)
            lam = tokens / seconds
            total = sum(v.drafting * extra[i][ks[i]] for i, v in enumerate(views))
            for i, v in enumerate(views):
                r = v.drafting
                rest = total - r * extra[i][ks[i]]
                off = self.forward_seconds(b, 1.0 + rest / b)

                scores = []
                for k in ks_all:
                    forward = off
                    if k and r > 0.0:
                        at = self.forward_seconds(b, 1.0 + (rest + extra[i][k]) / b)
                        forward = r * at + (1.0 - r) * off
                    scores.append(own[i][k] - lam * (cost[i][k] + forward))
                ks[i] = max(ks_all, key=lambda k: (scores[k], -k))
                total = rest + r * extra[i][ks[i]]
            if ks == before:  # a fixed point: λ is the vector's own rate
                break
        return ks

    def _row_seconds(self, v: _View, k: int) -> float:
        """A row's own seconds at γ = k: drafting, and verification at its
        expected positions."""
        draft = self.drafting_s.at(k) if k > 0 else (self.idle_s or 0.0)
        return draft + self.row_s.at(1.0 + v.drafting * k * v.fill)

    def rate(self, ks: Sequence[int], tokens: float, seconds: float) -> float:
        """The vector's tokens per second as the policy rates it: the
        model's (`evaluate`'s tokens / seconds), times the measured /
        predicted ratio of the recent rounds of its kind (drafting, or all
        rows off) at its batch size."""
        ratio = self._ratio(len(ks), any(ks))
        return tokens / seconds * (1.0 if ratio is None else ratio)

    def _ratio(self, b: int, drafting: bool) -> float | None:
        run = self.runs.get((b, drafting))
        if run is None or run.count < MEASURED or self.round - run.last > STALE:
            return None
        return run.ratio

    def predicted(self, ids: Sequence[int], k: int) -> float:
        """Σ_i E_i(k) / C(k): the model's tokens per second of a round at γ = k for every row."""
        tokens, seconds = self.evaluate([self.view(rid) for rid in ids], [k] * len(ids))
        return tokens / seconds

    def forward_seconds(self, b: int, n: float) -> float:
        """T(b, n, the rows' mean context) from the profile, times the
        measured over profiled ratio of the rounds nearest n positions per
        row (the rows' contexts are longer than the profile's, and
        attention grows with both)."""
        assert self.profile is not None, "start() first"
        t = self.profile.seconds(b, n, self.context)
        if not self.scales:
            return t
        near = math.ceil(n - 0.5)  # the nearest whole n (ties: the smaller), the keys' kind
        if near not in self.scales:
            near = min(self.scales, key=lambda m: (abs(m - n), m))
        return t * self.scales[near]


class _Run:
    """Decayed measured and predicted tokens and seconds of the batch
    rounds at one (B, mean γ)."""

    def __init__(self) -> None:
        self.tokens = self.seconds = self.model_tokens = self.model_seconds = 0.0
        self.count, self.last = 0, 0

    def add(
        self,
        tokens: int,
        seconds: float,
        model_tokens: float,
        model_seconds: float,
        now: int,
        decay: float,
    ) -> None:
        self.tokens = decay * self.tokens + tokens
        self.seconds = decay * self.seconds + seconds
        self.model_tokens = decay * self.model_tokens + model_tokens
        self.model_seconds = decay * self.model_seconds + model_seconds
        self.count += 1
        self.last = now

    @property
    def ratio(self) -> float:
        """Measured over predicted tokens per second."""
        return (self.tokens / self.seconds) / (self.model_tokens / self.model_seconds)


def _mean(old: float | None, new: float, decay: float) -> float:
    return new if old is None else decay * old + (1.0 - decay) * new
