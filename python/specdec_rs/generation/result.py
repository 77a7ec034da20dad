"""The result of one generation: its tokens and the statistics that explain its speed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specdec_rs.rounds import Tally
from specdec_rs.timing import Throughput


@dataclass(frozen=True)
class GenerationResult(Throughput):
    """New tokens and the statistics that explain the speed.

    k: the most drafts any round asked for (a tree: its node budget); policy:
    how k was chosen (its name); tree: the rounds drafted trees.
    accepted_histogram[m]: rounds that kept m drafts (m = 0..k).
    reached[i], accepted[i]: rounds whose draft i (0-based) was checked / kept;
    position_alpha[i] = accepted[i] / reached[i] is P(accept i | reached i).
    alpha = sum(accepted) / sum(reached): the i.i.d. estimate of α.
    k_per_round, kept_per_round: drafts asked for and kept, round by round.
    margins: with generate(margins=True) (temperature 0), the target's logit
    margin, top-1 minus top-2, at each new token; empty otherwise.
    forced, forced_accepted: with a grammar, the drafts it forced (counted in
    drafted and the histograms too) and those kept. grammar_accepting: with
    a grammar, whether the output is a complete match (always when
    stop_reason is "eos"; a budget may end it before); None without one.
    cached_tokens: prompt positions whose keys and values came from a
    prefix cache (not computed). drafting: rounds that proposed a draft.
    `tally`: the acceptance fields as one `rounds.Tally`.
    Times in seconds; total includes the prefill.
    """

    tokens: list[int]
    prompt_length: int
    drafter: str
    k: int
    policy: str
    tree: bool
    temperature: float
    seed: int
    stop_reason: str
    rounds: int
    drafted: int
    accepted_histogram: list[int]
    reached: list[int]
    accepted: list[int]
    time_prefill: float
    time_draft: float
    time_target: float
    time_verify: float
    time_total: float
    k_per_round: list[int] = field(repr=False)
    kept_per_round: list[int] = field(repr=False)
    margins: list[float] = field(default_factory=list, repr=False)
    forced: int = 0
    forced_accepted: int = 0
    grammar_accepting: bool | None = None
    cached_tokens: int = 0
    drafting: int = 0  # rounds that proposed at least one draft

    @property
    def tally(self) -> Tally:
        """The acceptance of its rounds as one value (`rounds.Tally`)."""
        return Tally(
            self.rounds,
            self.drafting,
            self.drafted,
            tuple(self.accepted_histogram),
            tuple(self.reached),
            tuple(self.accepted),
            tuple(self.k_per_round.count(k) for k in range(max(self.k_per_round, default=0) + 1)),
        )

    @property
    def tokens_per_pass(self) -> float:
        """New tokens per target forward (the prefill not counted)."""
        return self.new_tokens / self.rounds if self.rounds else 0.0

    @property
    def alpha(self) -> float:
        """Accepted drafts / drafts checked (nan when nothing was drafted)."""
        alpha = self.tally.alpha
        return float("nan") if alpha is None else alpha

    @property
    def position_alpha(self) -> list[float]:
        return self.tally.position_alpha

    def summary(self) -> dict[str, Any]:
        """The statistics as a flat dict (NaN where undefined; `to_json` writes null)."""
        return {
            "drafter": self.drafter,
            "k": self.k,
            "policy": self.policy,
            "tree": self.tree,
            "temperature": self.temperature,
            "seed": self.seed,
            "new_tokens": self.new_tokens,
            "stop_reason": self.stop_reason,
            "rounds": self.rounds,
            "drafted": self.drafted,
            "tokens_per_pass": self.tokens_per_pass,
            "alpha": self.alpha,
            "position_alpha": self.position_alpha,
            "accepted_histogram": self.accepted_histogram,
            "tokens_per_second": self.tokens_per_second,
            "time_prefill": self.time_prefill,
            "time_draft": self.time_draft,
            "time_target": self.time_target,
            "time_verify": self.time_verify,
            "time_total": self.time_total,
            "forced": self.forced,
            "forced_accepted": self.forced_accepted,
            "grammar_accepting": self.grammar_accepting,
            "cached_tokens": self.cached_tokens,
        }


@dataclass(frozen=True)
class Divergence:
    """Where two greedy generations of one prompt part: the first index at
    which their tokens differ, each run's token there, and each run's logit
    margin (top-1 minus top-2) there, when recorded (NaN otherwise). Two exact
    greedy runs can part only where the target's top two logits are within
    the rounding of the forward (bfloat16: a few 2^-8 of the logits' size)."""

    index: int
    tokens: tuple[int, int]
    margins: tuple[float, float]


def divergence(a: GenerationResult, b: GenerationResult) -> Divergence | None:
    """The first difference of `a` and `b` (None when one's tokens are a
    prefix of the other's: the same text up to the shorter budget or EOS)."""
    for i, (x, y) in enumerate(zip(a.tokens, b.tokens, strict=False)):
        if x != y:
            return Divergence(i, (x, y), (_margin(a, i), _margin(b, i)))
    return None


def _margin(r: GenerationResult, i: int) -> float:
    return r.margins[i] if i < len(r.margins) else float("nan")
