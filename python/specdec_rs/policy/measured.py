"""`MeasuredK`, the default γ policy: the cost model with costs measured as it runs.
p = target, q = draft, k = γ.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import TYPE_CHECKING, Any

from specdec_rs import _checks
from specdec_rs.policy.base import ChainPolicy, KPolicy, chain_counts
from specdec_rs.policy.chain import AdaptiveK, BySource

if TYPE_CHECKING:
    from specdec_rs.rounds import Round


class MeasuredK(ChainPolicy):
    """`AdaptiveK` whose costs are measured while it runs: no calibration
    before the first token, and speculation that does not pay at this
    host's step cost switches itself off (γ = 0, with a one-draft probe
    every `probe` rounds or rarer, so probing costs at most `probe_budget`
    of the time, and a change is still seen).

    A guard checks the model against the clock: the drafting rounds' seconds
    per token (the last `window` such rounds, the slowest left out, total
    seconds over total tokens) against the target-only rounds' (the median
    of the last `window`; one is run after `window` drafting rounds, then
    after twice as many each time up to every `refresh`, to keep it
    current). When drafting is slower by more than `margin`, speculation
    is held off for `hold` rounds (doubled each time it trips again, at most
    512), then tried again for `window // 2` rounds: a drafter that does not
    pay on this host stops drafting within a few rounds, whatever the model
    predicted, and a noisy host's slow rounds move a median, not the choice.

    generate() reports each round's wall-clock (`observe_time`): the target
    forward over n positions gives T(n) (decayed means), so v(n) = T(n)/T(1);
    the drafting time per drafted token over T(1) gives c. The first
    `warmup` rounds are target-only, to measure T(1), the next drafts one
    token, to measure c. The warm-up's rounds come straight after the
    prefill, while the host is still ramping up (SmolLM2's first decode
    steps take 1.3-1.7 times a settled one on a 2-core host), so the first
    target-only round after them starts T(1) and the guard's target-only
    figures afresh (the guard's drafting rounds too): otherwise a slow T(1)
    makes every forward over n positions look cheap, and a drafter that
    loses keeps drafting. A v(n) not yet measured is interpolated between
    measured sizes, or is the largest measured one below it plus `slope`
    per position (longer drafts are tried as the estimates allow, never
    assumed free). The cost model then picks γ as
    `AdaptiveK(prior="previous")` does: a draft position not yet reached is
    expected to be kept as often as the one before it. A drafter that must
    first run the prompt (`observe_start`) drafts only where its drafts
    could repay that.
    """

    def __init__(
        self,
        *,
        k_max: int = 8,
        decay: float = 0.97,
        probe: int = 8,
        smoothing: float = 0.25,
        warmup: int = 2,
        slope: float = 0.1,
        probe_budget: float = 0.03,
        window: int = 6,
        margin: float = 0.03,
        hold: int = 32,
        refresh: int = 48,
    ):
        self.inner = AdaptiveK(0.0, None, k_max=k_max, decay=decay, probe=probe, prior="previous")
        self.probe_budget = _checks.real(probe_budget, "probe_budget", above=0.0, maximum=1.0)
        self.k_max = self.inner.k_max
        self.smoothing = _checks.real(smoothing, "smoothing", above=0.0, maximum=1.0)
        self.warmup = _checks.integer(warmup, "warmup", minimum=1, maximum=1000)
        self.slope = _checks.real(slope, "slope", minimum=0.0)
        self.window = _checks.integer(window, "window", minimum=2, maximum=1000)
        self.margin = _checks.real(margin, "margin", minimum=0.0, maximum=1.0)
        self.hold_rounds = _checks.integer(hold, "hold", minimum=1, maximum=10**6)
        self.refresh = _checks.integer(refresh, "refresh", minimum=2, maximum=10**6)
        self.name = "measured"
        self.reset()

    def reset(self) -> None:
        self.inner.reset()
        self.forward_s: list[float | None] = [None] * (self.k_max + 2)  # T(n), n = 0..k_max+1
        self.draft_s: float | None = None  # seconds per drafted token
        self.rounds = 0
        self.off_rounds = 0
        self.emitted = 0
        self.start: tuple[float, float, int] | None = None  # see observe_start
        self.catching_up = False  # this round's draft time includes the catch-up
        self.never = False  # the catch-up cannot be repaid: no drafts this generation
        # the guard (see the class docs)
        self.on: deque[tuple[float, int]] = deque(maxlen=self.window)  # (seconds, tokens)
        self.off: deque[float] = deque(maxlen=self.window)  # seconds of target-only rounds
        self.held = 0  # rounds the guard still holds speculation off
        self.trips = 0
        self.since_off = 0
        self.refresh_after = min(self.window, self.refresh)  # drafting rounds to the next refresh
        self.cold = True  # T(1) and `off` hold only the warm-up's rounds

    def observe_start(
        self,
        prefill_s: float,
        prefill_positions: int,
        catch_up: int,
        draft_step_s: float,
        budget: int,
    ) -> None:
        """A drafter that must run `catch_up` positions of the prompt before
        its first draft (a separate model with its own cache), one of whose
        steps takes `draft_step_s`; the target prefilled `prefill_positions`
        in `prefill_s`; at most `budget` tokens are to come. Before the first
        draft the policy compares the catch-up's cost (≈ c times the
        target's prefill of as many positions, c = draft step / target
        step) with the most the drafts could save over the rest of the
        budget (every draft kept: max over γ of (γ + 1) / (γ·c + v(γ + 1))
        tokens per step instead of 1); where they cannot repay it, this
        generation never drafts."""
        prefill_s = _checks.real(prefill_s, "prefill_s", minimum=0.0, hint=" (seconds)")
        prefill_positions = _checks.integer(prefill_positions, "prefill_positions")
        catch_up = _checks.integer(catch_up, "catch_up")
        step_s = _checks.real(draft_step_s, "draft_step_s", minimum=0.0, hint=" (seconds)")
        budget = _checks.integer(budget, "budget")
        per_position = prefill_s / max(prefill_positions, 1)
        self.start = (per_position * catch_up, step_s, budget)

    def _repays_catch_up(self) -> bool:
        assert self.start is not None and self.forward_s[1]
        one = self.forward_s[1]
        cost_s, step_s, budget = self.start
        c = step_s / one
        _, v = self.costs()
        bound = max((g + 1) / (g * c + v[g]) for g in range(1, self.k_max + 1))
        saving = (budget - self.emitted) * one * (1.0 - 1.0 / bound)
        return saving > c * cost_s

    def _ema(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.smoothing * (new - old)

    def observe_time(self, draft_s: float, target_s: float, positions: int) -> None:
        """One round: `positions` = the drafts + 1 the target ran over
        (`Round.policy_positions`: asked + 1 when a window ran beside them)."""
        if positions == 1 and self.cold and self.rounds > self.warmup:
            self.cold = False  # the first settled T(1): the warm-up's figures go
            self.forward_s[1] = None
            self.off.clear()
            self.on.clear()  # drafting rounds of the ramp are not compared with settled ones
        if 1 <= positions <= self.k_max + 1:
            self.forward_s[positions] = self._ema(self.forward_s[positions], target_s)
        if positions > 1 and not self.catching_up:
            self.draft_s = self._ema(self.draft_s, draft_s / (positions - 1))
        self.catching_up = False  # the catch-up's round is not a draft cost

    def costs(self) -> tuple[float, list[float]]:
        """(c, v(1..k_max+1)) as measured so far: v(n) measured, else
        interpolated between the measured sizes around n, else the largest
        measured size below n plus `slope` per position."""
        one = self.forward_s[1]
        assert one is not None and one > 0
        seen = {n: t / one for n, t in enumerate(self.forward_s) if n >= 1 and t is not None}
        v = []
        for n in range(1, self.k_max + 2):
            if n in seen:
                v.append(seen[n])
                continue
            lo = max(m for m in seen if m < n)
            hi = min((m for m in seen if m > n), default=None)
            if hi is None:
                # past the largest measured size: at least `slope` per position, and
                # at least what each position cost up to there (v grows no slower)
                per = (seen[lo] - 1.0) / (lo - 1) if lo > 1 else 0.0
                v.append(seen[lo] + max(self.slope, per) * (n - lo))
            else:
                v.append(seen[lo] + (seen[hi] - seen[lo]) * (n - lo) / (hi - lo))
        c = (self.draft_s or 0.0) / one
        return c, v

    def next_k(self) -> int:
        k = self._model_k()
        return self._guard(k) if k > 0 else k

    def _guard(self, k: int) -> int:
        """k, or 0 where the clock says drafting loses (see the class docs)."""
        if self.held > 0:
            self.held -= 1
            if self.held == 0:
                self.on.clear()  # a fresh trial
            return 0
        trial = max(2, self.window // 2)
        if len(self.off) >= 2 and len(self.on) >= trial:
            rounds = sorted(self.on)[:-1]  # the slowest round left out (a noisy host's)
            on = sum(s for s, _ in rounds) / max(1, sum(t for _, t in rounds))
            off = statistics.median(self.off)
            if on > off * (1.0 + self.margin):
                self.trips += 1
                self.held = min(self.hold_rounds * 2 ** (self.trips - 1), 512)
                return 0
        self.since_off += 1
        if self.off and self.since_off >= self.refresh_after:
            self.since_off = 0
            self.refresh_after = min(2 * self.refresh_after, self.refresh)
            return 0  # a target-only round keeps the comparison current
        return k

    def _model_k(self) -> int:
        """γ by the cost model (what the guard checks)."""
        self.rounds += 1
        if self.never or self.rounds <= self.warmup or not self.forward_s[1]:
            return 0
        if self.start is not None:  # a catch-up to pay before the first draft
            if not self._repays_catch_up():
                self.never = True
                return 0
            self.start, self.catching_up = None, True
            return 1
        if self.draft_s is None:
            return 1  # one draft measures c before anything longer is tried
        c, v = self.costs()
        self.inner.c, self.inner.v = c, v
        rates = self.inner.rates()
        best = max(range(len(rates)), key=rates.__getitem__)
        if best > 0:
            return best
        # off: a probe (one draft) now and then, rarer the dearer it is, so
        # probing costs at most `probe_budget` of the time
        self.off_rounds += 1
        interval = max(self.inner.probe, math.ceil((c + v[1] - 1.0) / self.probe_budget))
        return 1 if self.off_rounds % interval == 0 else 0

    def observe(self, k: int, drafted: int, num_accepted: int) -> None:
        self.emitted += num_accepted + 1
        self.inner.observe(k, drafted, num_accepted)

    def observe_round(self, r: Round) -> None:
        """The round's counts, then its timings (`observe_time`), and its
        whole cost per token for the guard."""
        self.observe(*chain_counts(r))
        self.observe_time(r.draft_s, r.target_s, r.policy_positions)
        seconds = r.draft_s + r.target_s + r.verify_s
        if r.asked == 0:
            self.off.append(seconds)
        else:
            self.on.append((seconds, r.accepted + 1))


def measured_policy(drafter: Any, k_max: int = 8) -> KPolicy:
    """The default γ policy for `drafter`: `MeasuredK` (at most `k_max`
    drafts a round), one per source for a drafter that mixes sources (the
    hybrid: its prompt-lookup rounds may draft up to 8)."""
    parts = getattr(drafter, "parts", None)
    if isinstance(parts, dict) and parts:
        return BySource(
            {name: MeasuredK(k_max=max(k_max, 8) if name == "lookup" else k_max) for name in parts}
        )
    return MeasuredK(k_max=k_max)
