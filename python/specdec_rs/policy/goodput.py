"""`Goodput`, the load-aware γ of a batch: the γ that maximises the batch's
predicted tokens per second at its current size. p = target, q = draft, k = γ.

A batch round of B rows with γ drafts each costs

    C(γ) = Σ_i D_i(γ) + T(B, n̄(γ)) + Σ_i W_i(1 + γ·f_i)

(D_i: row i's drafting, T(B, n): the target forward over B rows × n
positions, with n̄(γ) = 1 + γ·mean_i f_i since the batch forward is ragged
and row i's drafter proposes a share f_i of the drafts asked for, W_i: its
verification, cropping and drafter update) and emits
Σ_i E_i(γ) tokens, E_i(γ) = 1 + Σ_{j=1}^{γ} a_{i,j}, where a_{i,j} is row
i's rate of keeping at least j drafts in rounds that asked for j or more (a
draft the drafter did not propose counts as not kept). The policy picks
γ* = argmax_γ Σ_i E_i(γ) / C(γ), γ = 0 (speculation off) included.

T comes from a profile (`ForwardProfile`: measured by the engine at start,
or read from the table cached on disk for this model, host and thread
count); D and W are measured as the rounds run (decayed means per drafted
token and per verified position). A row with little history borrows the
pooled rates of all rows (before any round, a_j = 2^-j). Acceptance alone never
decides: at a large B, T(B, γ + 1) nears (γ + 1)·T(B, 1) and the same
acceptance stops paying, which is why γ falls with the load.

T is corrected by what the rounds measure: the decayed mean of measured /
profiled forward time, kept per positions-per-row (the rows' contexts
differ from the profile's). And where the batch has run a γ at its current
size for a few recent rounds, that γ's measured tokens per second stands
in for the model (whose other values are rescaled by measured / predicted
at the current γ): a model that overrates long drafts is corrected by the
rounds it chose, so the policy settles on the γ the machine rewards.
Hysteresis: γ changes only when the new choice is predicted to beat the
current one by `hysteresis` (relative). While γ = 0, one round drafts
`probe_k` after `probe` rounds, so the acceptance estimates stay current;
each probe that leaves speculation off doubles the wait, up to 16 · `probe`
rounds.
The policy sees only what past rounds did, so every round stays exact.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from specdec_rs import _checks
from specdec_rs.policy.base import MAX_K

MAX_PROBE_FACTOR = 16  # probes back off to one in 16 · probe rounds


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


class _Rates:
    """Counts behind a_j: rounds that asked for j or more drafts, and those
    that kept j or more (j = 1..k_max), decayed; `fill`, the decayed mean
    of drafted / asked (a lookup drafter often proposes fewer than asked)."""

    def __init__(self, k_max: int):
        self.asked = [0.0] * (k_max + 1)
        self.kept = [0.0] * (k_max + 1)
        self.fill: float | None = None

    def add(self, asked: int, drafted: int, accepted: int, decay: float) -> None:
        self.fill = _mean(self.fill, drafted / asked, decay)
        for j in range(1, len(self.asked)):
            self.asked[j] *= decay
            self.kept[j] *= decay
            if j <= asked:
                self.asked[j] += 1.0
                self.kept[j] += float(j <= accepted)


class Goodput:
    """The batch's γ by predicted goodput (see the module docs).

    k_max: the largest γ considered; profile: T(B, n) (None: measured by the
    engine at start, or read from its cached table); hysteresis: the
    relative gain a new γ must promise; probe / probe_k: while γ = 0, one
    round in `probe` drafts probe_k; prior: pseudo-rounds of the pooled
    rates in each row's estimate; decay: of the counts and cost means.
    """

    name = "goodput"

    def __init__(
        self,
        *,
        k_max: int = 6,
        profile: ForwardProfile | None = None,
        hysteresis: float = 0.1,
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
        self.pooled = _Rates(self.k_max)
        self.k = 1  # the current γ (one draft until the rates say more)
        self.off_rounds = 0
        self.interval = self.probe  # rounds at γ = 0 before the next probe
        self.scales: dict[int, float] = {}  # measured T / profiled T, by positions per row
        self.runs: dict[tuple[int, int], _Run] = {}  # (B, γ) -> what rounds at γ measured
        self.round = 0
        self.context: float | None = None  # the rows' mean length at the last choice
        self.draft_per_token: float | None = None  # seconds per drafted token, per row
        self.verify_per_position: float | None = None  # seconds per verified position, per row
        self.chosen = 0  # rounds chosen since reset

    # ---- the engine's calls
    def start(self, engine: Any) -> None:
        """At the engine's start: past rows forgotten, the forward profile
        (measured on the engine, or its cached table) unless given."""
        self.reset()
        if self.profile is None:
            self.profile = engine.profile(ks=range(1, self.k_max + 2))

    def join(self, rid: int) -> None:
        self.rows[rid] = _Rates(self.k_max)

    def leave(self, rid: int) -> None:
        self.rows.pop(rid, None)

    def choose(self, rows: Sequence[Any]) -> tuple[int, float | None]:
        """(γ for this round, its predicted tokens per second) for the
        batch's rows that take the batch's γ (`rows[i].id`; their contexts
        from `rows[i].decoder.seq` where they have one)."""
        ids = [r.id for r in rows]
        if not ids:
            return self.k, None
        lengths = [len(r.decoder.seq) for r in rows if hasattr(r, "decoder")]
        self.context = sum(lengths) / len(lengths) if lengths else None
        predicted = self.model(ids)
        best, rates = self.best(ids, predicted)
        if not self.chosen:
            self.k = best  # the first round takes the model's choice as it is
        current = rates[self.k]
        if best != self.k and rates[best] > (1.0 + self.hysteresis) * current:
            self.k = best
        k = self.k
        if k == 0:
            self.off_rounds += 1
            if self.off_rounds >= self.interval:
                k, self.off_rounds = self.probe_k, 0
                # a probe that does not turn speculation on makes the next one rarer
                self.interval = min(2 * self.interval, MAX_PROBE_FACTOR * self.probe)
        else:
            self.off_rounds, self.interval = 0, self.probe
        self.chosen += 1
        return k, predicted[k]

    def best(self, ids: Sequence[int], model: list[float] | None = None) -> tuple[int, list[float]]:
        """(argmax γ, the goodput of each γ = 0..k_max) for these rows: the
        measured tokens per second of recent rounds at that γ and batch
        size where there are `MEASURED` or more, else the model's prediction
        (`model`, computed when not given) on the measured scale (times
        measured / predicted at the current γ; γ = 0 as predicted)."""
        b = len(ids)
        model = self.model(ids) if model is None else model
        here = self._measured(b, self.k)
        scale = here / model[self.k] if here is not None and model[self.k] > 0 else 1.0
        rates = []
        for k, m in enumerate(model):
            seen = self._measured(b, k)
            # γ = 0 is not rescaled: one token a row in T(B, 1) (the profile
            # corrected by measured forwards) is the model's surest figure,
            # and a scale learnt from drafting rounds would carry their error to it
            rates.append(seen if seen is not None else m if k == 0 else m * scale)
        return max(range(len(rates)), key=lambda k: (rates[k], -k)), rates

    def _measured(self, b: int, k: int) -> float | None:
        """Tokens per second of the recent batch rounds of b rows at γ = k."""
        run = self.runs.get((b, k))
        if run is None or run.count < MEASURED or self.round - run.last > STALE:
            return None
        return run.tokens / run.seconds

    def predicted(self, ids: Sequence[int], k: int) -> float:
        """Σ_i E_i(k) / C(k): tokens per second of a round at γ = k."""
        return self.model(ids)[k]

    def model(self, ids: Sequence[int]) -> list[float]:
        """Σ_i E_i(k) / C(k) for k = 0..k_max: the cost model's tokens per
        second of a round at each γ. The batch forward is ragged (no
        padding), so its positions per row are the mean 1 + k·fill_i over
        the rows, fill_i the share of asked drafts row i's drafter proposes."""
        assert self.profile is not None, "start() first"
        b = len(ids)
        tokens = [0.0] * (self.k_max + 1)
        for rid in ids:
            for k, e in enumerate(self.expected_all(rid)):
                tokens[k] += e
        fill = sum(self.fill(rid) for rid in ids) / b
        out = []
        for k in range(self.k_max + 1):
            draft = (self.draft_per_token or 0.0) * k * b
            verify = (self.verify_per_position or 0.0) * b * (1 + k * fill)
            out.append(tokens[k] / (draft + self.forward_seconds(b, 1 + k * fill) + verify))
        return out

    def forward_seconds(self, b: int, n: float) -> float:
        """T(b, n, the rows' mean context) from the profile, times the measured over profiled ratio
        of the rounds nearest n positions per row (the rows' contexts are
        longer than the profile's, and attention grows with both)."""
        assert self.profile is not None, "start() first"
        t = self.profile.seconds(b, n, self.context)
        if not self.scales:
            return t
        near = min(self.scales, key=lambda m: (abs(m - n), m))
        return t * self.scales[near]

    def fill(self, rid: int) -> float:
        """The share of asked drafts row `rid` gets (its mean, else the pool's, else 1)."""
        row = self.rows.get(rid)
        if row is not None and row.fill is not None:
            return row.fill
        return 1.0 if self.pooled.fill is None else self.pooled.fill

    def expected_all(self, rid: int) -> list[float]:
        """E_i(k) = 1 + Σ_{j<=k} a_{i,j} for k = 0..k_max: the row's counts
        plus `prior` rounds at the pooled rate of all rows (itself 2^-j
        before any round)."""
        row = self.rows.get(rid) or _Rates(self.k_max)
        pooled = self.pooled
        out = [1.0]
        for j in range(1, self.k_max + 1):
            pool_rate = (pooled.kept[j] + 0.5**j) / (pooled.asked[j] + 1.0)
            a = (row.kept[j] + self.prior * pool_rate) / (row.asked[j] + self.prior)
            out.append(out[-1] + a)
        return out

    def observe(
        self,
        rounds: Iterable[tuple[int, Any]],
        rows: int,
        target_s: float,
        *,
        k: int | None = None,
        tokens: int = 0,
        seconds: float = 0.0,
    ) -> None:
        """A batch round: each row's (id, `Round`), the rows in its forward
        and its seconds; decayed means of the drafting and verification
        seconds and of the forward's measured / profiled time; with `k` (the
        round ran every row at the batch's γ = k), its tokens and seconds."""
        rounds = list(rounds)
        self.round += 1
        if k is not None and seconds > 0:
            run = self.runs.setdefault((rows, k), _Run())
            run.add(tokens, seconds, self.round, self.decay)
        if self.profile is not None and rounds and target_s > 0:
            n = sum(r.positions for _, r in rounds) / len(rounds)
            ratio = target_s / self.profile.seconds(rows, n, self.context)
            key = round(n)
            self.scales[key] = _mean(self.scales.get(key), ratio, 0.9)
        for rid, r in rounds:
            if r.tree:
                continue
            rates = self.rows.get(rid)
            if rates is not None and r.asked > 0:
                rates.add(r.asked, r.drafted, r.accepted, self.decay)
            if r.asked > 0:
                self.pooled.add(r.asked, r.drafted, r.accepted, self.decay)
                self.draft_per_token = _mean(self.draft_per_token, r.draft_s / r.asked, self.decay)
            self.verify_per_position = _mean(
                self.verify_per_position, r.verify_s / r.positions, self.decay
            )


MEASURED = 32  # rounds at a (B, γ) before their measured rate replaces the model's
STALE = 256  # rounds after which a (B, γ) not run again is predicted anew


class _Run:
    """Decayed tokens and seconds of the batch rounds at one (B, γ)."""

    def __init__(self) -> None:
        self.tokens = self.seconds = 0.0
        self.count, self.last = 0, 0

    def add(self, tokens: int, seconds: float, now: int, decay: float) -> None:
        self.tokens = decay * self.tokens + tokens
        self.seconds = decay * self.seconds + seconds
        self.count += 1
        self.last = now


def _mean(old: float | None, new: float, decay: float) -> float:
    return new if old is None else decay * old + (1.0 - decay) * new
