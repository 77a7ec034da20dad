"""What one draft-verify round did (`Round`), the acceptance of many rounds
as one value (`Tally`, added with +), and the running sums of a
generation's rounds (`Stats`). p = target, q = draft, k = γ.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from specdec_rs.structured.constraint import FORCED_SOURCE


@dataclass(frozen=True)
class Round:
    """One round, as the decoder returns it and the policies and `on_round` see it.

    index: the round's number (0-based; its verifier stream is row_seed(seed, index)).
    asked: drafts the round asked for (k, capped by the budget), or a tree's node budget.
    drafted: proposals the drafter returned (chain tokens, or tree nodes).
    depth: drafts on the longest path the verifier could keep (a chain: drafted).
    accepted: drafts kept; emitted: the round's tokens (accepted + 1), before any
    EOS or budget cut. source: the part that drafted (a hybrid's "lookup" or
    "eagle"; "grammar" for tokens a grammar forced), else None. tree: the drafts formed a tree.
    draft_s, target_s, verify_s: seconds drafting, in the target forward, and
    verifying (with the cache and drafter updates); positions: the target
    forward's positions (drafted + 1 + window); window: the nodes of a
    `Window` that ran beside the drafts (lookahead's), else 0.
    p, q, tokens: what the verifier read: the target's processed rows, the
    drafter's rows (None for a fixed tree) and the drafts (on the models' device).
    p_argmax: at temperature 0 on the CPU, each target row's argmax (k+1,),
    all that the greedy verifier (`verify_greedy`) reads of the one-hot rows,
    which are then not built (p is None); else None.
    margins: with generate(margins=True), the target's logit margin (top-1
    minus top-2) at each emitted token's position, else None.
    forced_drafts: the chain's last drafts that a grammar forced (all of a
    forced round's; the tail after a drafter's drafts), counted in drafted
    and asked.
    """

    index: int
    asked: int
    drafted: int
    depth: int
    accepted: int
    emitted: tuple[int, ...]
    source: str | None
    tree: bool
    draft_s: float
    target_s: float
    verify_s: float
    positions: int
    p: Any = field(default=None, repr=False, compare=False)
    q: Any = field(default=None, repr=False, compare=False)
    tokens: Any = field(default=None, repr=False, compare=False)
    p_argmax: Any = field(default=None, repr=False, compare=False)
    margins: tuple[float, ...] | None = field(default=None, repr=False)
    window: int = 0
    forced_drafts: int = 0

    @property
    def forced(self) -> bool:
        """The drafts were forced by a grammar (no drafter ran; a γ policy
        does not learn from this round)."""
        return self.source == FORCED_SOURCE

    def drafters_part(self) -> Round:
        """The round as the drafter made it, a grammar's forced tail
        dropped (what a γ policy learns from: the drafts it asked for, and
        how many of those were kept)."""
        if not self.forced_drafts or self.forced:
            return self
        own = self.drafted - self.forced_drafts
        return replace(
            self,
            asked=self.asked - self.forced_drafts,
            drafted=own,
            depth=own,
            accepted=min(self.accepted, own),
            positions=self.positions - self.forced_drafts,
            forced_drafts=0,
        )

    @property
    def forced_accepted(self) -> int:
        """The grammar-forced drafts kept."""
        return max(0, self.accepted - (self.drafted - self.forced_drafts))

    @property
    def policy_drafted(self) -> int:
        """The drafts a γ policy counts this round: drafted, or asked when a
        window ran (the window's cost came with asking for γ drafts, so a
        draft the drafter did not return counts as one rejected)."""
        return self.asked if self.window else self.drafted

    @property
    def policy_positions(self) -> int:
        """The positions a γ policy prices this round at (policy_drafted + 1:
        with a window, the measured T(γ + 1) carries its cost)."""
        return self.policy_drafted + 1

    @property
    def checked(self) -> int:
        """Drafts the verifier reached: those kept and the first rejected, if any."""
        return min(self.accepted + 1, self.depth)


def _add(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """Element-wise sum of tuples of different lengths."""
    if len(a) < len(b):
        a, b = b, a
    return tuple(x + (b[i] if i < len(b) else 0) for i, x in enumerate(a))


@dataclass(frozen=True)
class Tally:
    """The acceptance of some rounds, one value (`+` adds two; `Tally.of`
    one round). A chain round counts under k = asked, a tree round under
    its depth.

    rounds; drafting: rounds that proposed a draft; drafted: drafts proposed
    (tree nodes included); histogram[m]: rounds that kept m drafts;
    reached[i], accepted[i]: rounds whose draft i (0-based) was checked /
    kept, so position_alpha[i] = accepted[i] / reached[i] is P(keep i |
    reached i) and alpha = Σ accepted / Σ reached the i.i.d. estimate of α;
    by_k[k]: rounds at k."""

    rounds: int = 0
    drafting: int = 0
    drafted: int = 0
    histogram: tuple[int, ...] = (0,)
    reached: tuple[int, ...] = ()
    accepted: tuple[int, ...] = ()
    by_k: tuple[int, ...] = ()

    @classmethod
    def of(cls, r: Round) -> Tally:
        k = r.depth if r.tree else r.asked
        histogram = [0] * (k + 1)
        histogram[r.accepted] += 1
        checked = r.checked  # drafts 0..m-1 kept, draft m (if any) rejected
        by_k = [0] * (k + 1)
        by_k[k] = 1
        return cls(
            1,
            int(r.drafted > 0),
            r.drafted,
            tuple(histogram),
            (1,) * checked + (0,) * (k - checked),
            (1,) * r.accepted + (0,) * (k - r.accepted),
            tuple(by_k),
        )

    def __add__(self, other: Tally) -> Tally:
        return Tally(
            self.rounds + other.rounds,
            self.drafting + other.drafting,
            self.drafted + other.drafted,
            _add(self.histogram, other.histogram),
            _add(self.reached, other.reached),
            _add(self.accepted, other.accepted),
            _add(self.by_k, other.by_k),
        )

    @property
    def kept(self) -> int:
        """Drafts kept."""
        return sum(self.accepted)

    @property
    def checked(self) -> int:
        """Drafts the verifier reached."""
        return sum(self.reached)

    @property
    def alpha(self) -> float | None:
        """Drafts kept / drafts checked (None when none was checked)."""
        return self.kept / self.checked if self.checked else None

    @property
    def position_alpha(self) -> list[float]:
        """P(keep draft i | reached i), i = 0.. (NaN where none reached i)."""
        return [
            a / r if r else float("nan") for a, r in zip(self.accepted, self.reached, strict=True)
        ]

    @property
    def acceptance_rate(self) -> float | None:
        """Drafts kept / drafts proposed (None without drafts)."""
        return self.kept / self.drafted if self.drafted else None

    @property
    def mean_acceptance_length(self) -> float | None:
        """1 + drafts kept per drafting round (None without one)."""
        return 1 + self.kept / self.drafting if self.drafting else None

    @property
    def kept_positions(self) -> list[int]:
        """accepted, cut after the last position any round kept."""
        last = max((i + 1 for i, a in enumerate(self.accepted) if a), default=0)
        return list(self.accepted[:last])


class Stats:
    """The running sums of a generation's rounds: their `Tally`, k and kept
    per round, the grammar's forced drafts, and the seconds by part."""

    def __init__(self) -> None:
        self.tally = Tally()
        self.k_per_round: list[int] = []
        self.kept_per_round: list[int] = []
        self.forced = self.forced_accepted = 0
        self.prefill = self.draft = self.target = self.verify = 0.0

    def add(self, r: Round) -> None:
        self.tally += Tally.of(r)
        self.k_per_round.append(r.depth if r.tree else r.asked)
        self.kept_per_round.append(r.accepted)
        self.forced += r.forced_drafts
        self.forced_accepted += r.forced_accepted
        self.draft += r.draft_s
        self.target += r.target_s
        self.verify += r.verify_s

    @property
    def rounds(self) -> int:
        return self.tally.rounds
