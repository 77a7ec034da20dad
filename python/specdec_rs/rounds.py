"""What one draft-verify round did (`Round`) and the running sums of a
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


class Stats:
    """The running sums of a generation's rounds (lists grow with the longest
    round seen). A chain round counts under k = asked, a tree round under its
    depth; drafted counts every proposal (tree nodes included)."""

    def __init__(self) -> None:
        self.rounds = 0
        self.drafted = 0
        self.histogram = [0]
        self.reached: list[int] = []
        self.accepted: list[int] = []
        self.k_per_round: list[int] = []
        self.kept_per_round: list[int] = []
        self.forced = self.forced_accepted = 0
        self.prefill = self.draft = self.target = self.verify = 0.0

    def add(self, r: Round) -> None:
        k = r.depth if r.tree else r.asked
        grow = k - len(self.reached)
        if grow > 0:
            self.histogram += [0] * grow
            self.reached += [0] * grow
            self.accepted += [0] * grow
        self.rounds += 1
        self.drafted += r.drafted
        self.k_per_round.append(k)
        self.kept_per_round.append(r.accepted)
        self.histogram[r.accepted] += 1
        for i in range(r.checked):  # drafts 0..m-1 kept, draft m (if any) rejected
            self.reached[i] += 1
            self.accepted[i] += i < r.accepted
        self.forced += r.forced_drafts
        self.forced_accepted += r.forced_accepted
        self.draft += r.draft_s
        self.target += r.target_s
        self.verify += r.verify_s
