"""`Goodput`, the load-aware γ of a batch: the γ that maximises the batch's
predicted tokens per second at its current size. p = target, q = draft, k = γ.

A batch round of B rows with γ drafts each costs

    C(γ) = Σ_i D_i(γ) + T(B, γ + 1) + Σ_i W_i(γ + 1)

(D_i: row i's drafting, T(B, n): the target forward over B rows × n
positions, W_i: its verification, cropping and drafter update) and emits
Σ_i E_i(γ) tokens, E_i(γ) = 1 + Σ_{j=1}^{γ} a_{i,j}, where a_{i,j} is row
i's rate of keeping at least j drafts in rounds that asked for j or more (a
draft the drafter did not propose counts as not kept). The policy picks
γ* = argmax_γ Σ_i E_i(γ) / C(γ), γ = 0 (speculation off) included.

T comes from a profile (`ForwardProfile`: measured by the engine at start,
or read from the table cached on disk for this model, host and thread
count); D and W are measured as the rounds run (decayed means per drafted
token and per verified position). A row with little history borrows the
pooled rates of all rows (a weak prior before any). Acceptance alone never
decides: at a large B, T(B, γ + 1) nears (γ + 1)·T(B, 1) and the same
acceptance stops paying, which is why γ falls with the load.

Hysteresis: γ changes only when the new choice is predicted to beat the
current one by `hysteresis` (relative). While γ = 0, every `probe` rounds
one round drafts `probe_k`, so acceptance estimates stay current.
The policy sees only what past rounds did, so every round stays exact.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from specdec_rs import _checks
from specdec_rs.policy.base import MAX_K


@dataclass(frozen=True)
class ForwardProfile:
    """T(B, n): seconds of the target forward over B rows × n positions,
    measured on a grid (`table[(B, n)]`) and interpolated linearly in B
    and n between grid points (extrapolated by the last slope beyond)."""

    table: dict[tuple[int, int], float]
    context: int = 0

    def __post_init__(self) -> None:
        if not self.table:
            raise ValueError("a forward profile needs at least one measured (B, n)")
        for (b, n), t in self.table.items():
            if b < 1 or n < 1 or not t > 0:
                raise ValueError(
                    f"forward profile entry T({b}, {n}) = {t}: expected B, n >= 1, T > 0"
                )
        bs = sorted({b for b, _ in self.table})
        ns = sorted({n for _, n in self.table})
        if len(self.table) != len(bs) * len(ns):
            raise ValueError("a forward profile is a full grid of batch sizes × positions")

    @property
    def batch_sizes(self) -> list[int]:
        return sorted({b for b, _ in self.table})

    @property
    def positions(self) -> list[int]:
        return sorted({n for _, n in self.table})

    def seconds(self, batch: int, n: int) -> float:
        """T(batch, n), interpolated."""
        ns = self.positions
        return _interp(ns, [self._at_n(batch, m) for m in ns], n)

    def _at_n(self, batch: int, n: int) -> float:
        bs = self.batch_sizes
        return _interp(bs, [self.table[(b, n)] for b in bs], batch)

    def v(self, batch: int, n: int) -> float:
        """v(B, n) = T(B, n) / T(B, 1): a forward over n positions in steps."""
        return self.seconds(batch, n) / self.seconds(batch, 1)

    def to_json(self) -> dict[str, Any]:
        return {
            "context": self.context,
            "table": [[b, n, t] for (b, n), t in sorted(self.table.items())],
        }

    @classmethod
    def from_json(cls, obj: Any) -> ForwardProfile:
        try:
            table = {(int(b), int(n)): float(t) for b, n, t in obj["table"]}
            return cls(table, int(obj.get("context", 0)))
        except (KeyError, TypeError, ValueError) as e:
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
    that kept j or more (j = 1..k_max), decayed."""

    def __init__(self, k_max: int):
        self.asked = [0.0] * (k_max + 1)
        self.kept = [0.0] * (k_max + 1)

    def add(self, asked: int, accepted: int, decay: float) -> None:
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
        hysteresis: float = 0.05,
        probe: int = 16,
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
        self.draft_per_token: float | None = None  # seconds per drafted token, per row
        self.verify_per_position: float | None = None  # seconds per verified position, per row
        self.choices: list[int] = []

    # ---- the engine's calls
    def start(self, engine: Any) -> None:
        """At the engine's start: the forward profile (measured, or cached)."""
        if self.profile is None:
            self.profile = engine.profile(ks=range(1, self.k_max + 2))

    def join(self, rid: int) -> None:
        self.rows[rid] = _Rates(self.k_max)

    def leave(self, rid: int) -> None:
        self.rows.pop(rid, None)

    def choose(self, rows: Sequence[Any]) -> tuple[int, float | None]:
        """(γ for this round, its predicted tokens per second) for the
        batch's rows that take the batch's γ (`rows[i].id`)."""
        ids = [r.id for r in rows]
        if not ids:
            return self.k, None
        best, rates = self.best(ids)
        current = rates[self.k]
        if best != self.k and rates[best] > (1.0 + self.hysteresis) * current:
            self.k = best
        k = self.k
        if k == 0:
            self.off_rounds += 1
            if self.off_rounds % self.probe == 0:
                k = self.probe_k
        else:
            self.off_rounds = 0
        self.choices.append(k)
        return k, rates[k]

    def best(self, ids: Sequence[int]) -> tuple[int, list[float]]:
        """(argmax γ, predicted goodput of each γ = 0..k_max) for these rows."""
        rates = [self.predicted(ids, k) for k in range(self.k_max + 1)]
        return max(range(len(rates)), key=lambda k: (rates[k], -k)), rates

    def predicted(self, ids: Sequence[int], k: int) -> float:
        """Σ_i E_i(k) / C(k): tokens per second of a round at γ = k."""
        assert self.profile is not None, "start() first"
        b = len(ids)
        tokens = sum(self.expected(rid, k) for rid in ids)
        draft = (self.draft_per_token or 0.0) * k * b
        verify = (self.verify_per_position or 0.0) * (k + 1) * b
        return tokens / (draft + self.profile.seconds(b, k + 1) + verify)

    def expected(self, rid: int, k: int) -> float:
        """E_i(k) = 1 + Σ_{j<=k} a_{i,j} (row counts plus `prior` pooled rounds)."""
        row = self.rows.get(rid) or _Rates(self.k_max)
        pooled = self.pooled
        total = 1.0
        for j in range(1, k + 1):
            pool_rate = (pooled.kept[j] + 0.5) / (pooled.asked[j] + 1.0)  # 1/2 before any round
            a = (row.kept[j] + self.prior * pool_rate) / (row.asked[j] + self.prior)
            total += a
        return total

    def observe(self, rounds: Iterable[tuple[int, Any]], rows: int, target_s: float) -> None:
        """A batch round: each row's (id, `Round`); decayed means of the
        drafting and verification seconds."""
        for rid, r in rounds:
            if r.tree:
                continue
            rates = self.rows.get(rid)
            if rates is not None and r.asked > 0:
                rates.add(r.asked, r.accepted, self.decay)
            if r.asked > 0:
                self.pooled.add(r.asked, r.accepted, self.decay)
                self.draft_per_token = _mean(self.draft_per_token, r.draft_s / r.asked, self.decay)
            self.verify_per_position = _mean(
                self.verify_per_position, r.verify_s / r.positions, self.decay
            )


def _mean(old: float | None, new: float, decay: float) -> float:
    return new if old is None else decay * old + (1.0 - decay) * new
