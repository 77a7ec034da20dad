"""How many drafts to propose each round (γ = k). p = target, q = draft.

A policy sees only what past rounds did, so changing γ between rounds keeps the
output exact: each round is an exact speculative step whatever k it uses.

- `FixedK(k)`: the same k every round.
- `HeuristicK(k)`: transformers' schedule: +2 after a round that kept every
  draft, −1 otherwise (never below 1).
- `AdaptiveK(cost_ratio, verify_cost)`: the cost model. With per-position
  acceptance α_i (P(draft i kept | drafts before it kept), running estimates),
  a round with γ drafts yields E[tokens] = 1 + Σ_{i<=γ} Π_{j<=i} α_j and costs
  γ·c + v(γ+1) target-step units; pick the γ in 0..k_max with the most tokens
  per unit time (γ = 0 switches speculation off: 1 token for v(1) = 1).
- `BySource({source: policy})`: one policy per source of drafts, for drafters
  whose rounds come from different parts (the hybrid: prompt lookup or the
  head), so each part's γ follows its own acceptance and cost.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from specdec_rs import _checks

MAX_K = 1024  # the most drafts a policy may ask for in one round
MAX_TREE = 4096  # the most nodes of a draft tree


class KPolicy(Protocol):
    name: str

    def reset(self) -> None:
        """Forget past rounds: generate() calls it first, so one policy object
        reused across calls gives the same output for the same seed."""
        ...

    def next_k(self) -> int:
        """Drafts to request this round (the decoder caps it by the budget)."""
        ...

    def observe(self, k: int, drafted: int, num_accepted: int) -> None:
        """The round asked for k, got `drafted` proposals, kept `num_accepted`."""
        ...


class FixedK:
    def __init__(self, k: int):
        self.k = _checks.integer(k, "k", maximum=MAX_K)
        self.name = f"fixed:{self.k}"

    def reset(self) -> None:
        pass

    def next_k(self) -> int:
        return self.k

    def observe(self, k: int, drafted: int, num_accepted: int) -> None:
        pass


class HeuristicK:
    """transformers' "heuristic" num_assistant_tokens schedule."""

    def __init__(self, k: int = 4, k_max: int = 16):
        self.k_max = _checks.integer(k_max, "k_max", minimum=1, maximum=MAX_K)
        self.k_start = _checks.integer(k, "k", minimum=1, maximum=self.k_max)
        self.k = self.k_start
        self.name = "heuristic"

    def reset(self) -> None:
        self.k = self.k_start

    def next_k(self) -> int:
        return self.k

    def observe(self, k: int, drafted: int, num_accepted: int) -> None:
        if drafted == 0:
            return
        self.k = min(self.k + 2, self.k_max) if num_accepted == drafted else max(1, self.k - 1)


class AdaptiveK:
    """γ from the cost model and running per-position acceptance estimates.

    cost_ratio: c, one draft step / one target step.  verify_cost: v(n) for
    n = 1..k_max+1, a target forward over n new tokens / over one (v(1) = 1;
    None means v ≡ 1, the handout's model).  Acceptance counts decay by
    `decay` per round (recent rounds weigh more) and start from a Beta(1, 1)
    prior, so a position never seen is estimated at 1/2. Every `probe` rounds
    with γ = 0 it drafts one token anyway, so the estimates can recover.
    """

    def __init__(
        self,
        cost_ratio: float,
        verify_cost: Sequence[float] | None = None,
        *,
        k_max: int = 8,
        decay: float = 0.97,
        probe: int = 8,
    ):
        self.c = _checks.real(
            cost_ratio, "cost_ratio", minimum=0.0, hint=" (draft step / target step)"
        )
        self.k_max = _checks.integer(k_max, "k_max", minimum=1, maximum=MAX_K)
        v = (
            _checks.reals(verify_cost, "verify_cost", above=0.0)
            if verify_cost is not None
            else [1.0] * (self.k_max + 1)
        )
        if len(v) < self.k_max + 1:
            raise ValueError(
                f"verify_cost needs k_max + 1 = {self.k_max + 1} positive entries "
                f"v(1..{self.k_max + 1}); got {len(v)}"
            )
        self.v = v
        self.decay = _checks.real(decay, "decay", above=0.0, maximum=1.0)
        self.probe = _checks.integer(probe, "probe", minimum=1)
        self.name = "adaptive"
        self.reset()

    def reset(self) -> None:
        self.kept = [0.0] * self.k_max
        self.reached = [0.0] * self.k_max
        self.off_rounds = 0

    def alphas(self) -> list[float]:
        """Current α_i estimates, i = 1..k_max (posterior means)."""
        return [(a + 1) / (r + 2) for a, r in zip(self.kept, self.reached, strict=True)]

    def rates(self) -> list[float]:
        """Expected tokens per unit time for γ = 0..k_max."""
        out, tokens, survive = [1.0 / self.v[0]], 1.0, 1.0
        for g, a in enumerate(self.alphas(), start=1):
            survive *= a
            tokens += survive
            out.append(tokens / (g * self.c + self.v[g]))
        return out

    def next_k(self) -> int:
        rates = self.rates()
        best = max(range(len(rates)), key=rates.__getitem__)
        if best == 0:
            self.off_rounds += 1
            if self.off_rounds % self.probe == 0:
                return 1
        return best

    def observe(self, k: int, drafted: int, num_accepted: int) -> None:
        self.kept = [x * self.decay for x in self.kept]
        self.reached = [x * self.decay for x in self.reached]
        for i in range(min(num_accepted + 1, drafted, self.k_max)):
            self.reached[i] += 1
            self.kept[i] += i < num_accepted


class BySource:
    """One γ policy per source of drafts. A drafter that mixes sources (the
    hybrid) names the source of each round with ``source(seq)``; generate()
    calls ``use(source)`` before the round, and next_k / observe go to that
    source's policy, so each learns its own acceptance (and, for
    `AdaptiveK`, uses its own cost c). The first source is used until
    ``use`` names another.

    >>> pol = BySource({"lookup": FixedK(6), "eagle": FixedK(1)})
    >>> pol.use("eagle"); pol.next_k()
    1
    """

    def __init__(self, policies: Mapping[str, KPolicy]):
        if not isinstance(policies, Mapping) or not policies:
            raise ValueError(
                f"policies is {policies!r}; expected a non-empty mapping source name -> "
                'policy, e.g. {"lookup": AdaptiveK(...), "eagle": AdaptiveK(...)}'
            )
        self.policies = {str(s): as_policy(p) for s, p in policies.items()}
        self.name = (
            "by-source(" + ", ".join(f"{s}: {p.name}" for s, p in self.policies.items()) + ")"
        )
        self.reset()

    def use(self, source: str) -> None:
        """The next round's drafts come from `source`."""
        if source not in self.policies:
            raise ValueError(
                f"the drafter named source {source!r}; this policy has one for "
                f"{', '.join(map(repr, self.policies))} (give BySource a policy per source "
                "the drafter names)"
            )
        self.current = source

    def reset(self) -> None:
        for p in self.policies.values():
            p.reset()
        self.current = next(iter(self.policies))

    def next_k(self) -> int:
        return self.policies[self.current].next_k()

    def observe(self, k: int, drafted: int, num_accepted: int) -> None:
        self.policies[self.current].observe(k, drafted, num_accepted)

    def observe_time(self, draft_s: float, target_s: float, positions: int) -> None:
        """A round's timings, for a source policy that measures its costs."""
        timed = getattr(self.policies[self.current], "observe_time", None)
        if callable(timed):
            timed(draft_s, target_s, positions)


class MeasuredK:
    """`AdaptiveK` whose costs are measured while it runs: no calibration
    before the first token, and speculation that does not pay at this
    host's step cost switches itself off (γ = 0, with a one-draft probe
    every `probe` rounds or rarer, so probing costs at most `probe_budget`
    of the time, and a change is still seen).

    generate() reports each round's wall-clock (`observe_time`): the target
    forward over n positions gives T(n) (decayed means), so v(n) = T(n)/T(1);
    the drafting time per drafted token over T(1) gives c. The first
    `warmup` rounds are target-only, to measure T(1), the next drafts one
    token, to measure c. A v(n) not yet
    measured is interpolated between measured sizes, or is the largest
    measured one below it plus `slope` per position (longer drafts are
    tried as the estimates allow, never assumed free). The cost model then
    picks γ as `AdaptiveK` does. A drafter that must first run the prompt
    (`observe_start`) drafts only where its drafts could repay that.
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
    ):
        self.inner = AdaptiveK(0.0, None, k_max=k_max, decay=decay, probe=probe)
        self.probe_budget = _checks.real(probe_budget, "probe_budget", above=0.0, maximum=1.0)
        self.k_max = self.inner.k_max
        self.smoothing = _checks.real(smoothing, "smoothing", above=0.0, maximum=1.0)
        self.warmup = _checks.integer(warmup, "warmup", minimum=1, maximum=1000)
        self.slope = _checks.real(slope, "slope", minimum=0.0)
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
        """One round: `positions` = the drafts + 1 the target ran over."""
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
                v.append(seen[lo] + self.slope * (n - lo))
            else:
                v.append(seen[lo] + (seen[hi] - seen[lo]) * (n - lo) / (hi - lo))
        c = (self.draft_s or 0.0) / one
        return c, v

    def next_k(self) -> int:
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


def as_policy(k: Any) -> KPolicy:
    """An integer k >= 1 is FixedK(k); a policy object is checked for the
    methods generate() calls."""
    if all(callable(getattr(k, m, None)) for m in ("next_k", "observe", "reset")):
        if not isinstance(getattr(k, "name", None), str):
            raise ValueError(f"the γ policy {k!r} needs a `name` string attribute")
        return k  # type: ignore[no-any-return]
    try:
        return FixedK(_checks.integer(k, "k", minimum=1, maximum=MAX_K))
    except ValueError as e:
        raise ValueError(
            f"{e} (k is drafts per round, or a policy with next_k(), observe() and reset(), "
            "e.g. AdaptiveK)"
        ) from None


class AdaptiveTree:
    """Nodes per round for tree decoding (`generate(..., tree=AdaptiveTree(...))`),
    from the cost model and what the trees have been yielding.

    A round with a tree of b nodes, drafted in d head steps, costs
    d·c + v(b + 1) target-step units (`verify_cost` = v(1), v(2), ...: the
    measured cost of a target forward over n positions relative to one).
    Its tokens are measured: a decayed mean of the tokens emitted by rounds
    with b nodes. Each budget in `budgets` is tried once first; then the
    budget with the most tokens per unit time is used, and every `probe`
    rounds the budget tried least recently runs once so its estimate can
    recover. Like the γ policies it sees only past rounds, so the output
    stays exact.
    """

    def __init__(
        self,
        cost_ratio: float,
        verify_cost: Sequence[float],
        *,
        budgets: Sequence[int] = (2, 4, 6, 8),
        decay: float = 0.95,
        probe: int = 16,
    ):
        self.c = _checks.real(
            cost_ratio, "cost_ratio", minimum=0.0, hint=" (draft step / target step)"
        )
        self.budgets = sorted(set(_checks.integers(budgets, "budgets", minimum=1)))
        if not self.budgets:
            raise ValueError("budgets is empty; give tree sizes (nodes per round), e.g. (2, 4, 8)")
        self.v = _checks.reals(verify_cost, "verify_cost", above=0.0)
        if len(self.v) < self.budgets[-1] + 1:
            raise ValueError(
                f"verify_cost has {len(self.v)} entries v(1..{len(self.v)}); a tree of "
                f"{self.budgets[-1]} nodes needs v(1..{self.budgets[-1] + 1})"
            )
        self.decay = _checks.real(decay, "decay", above=0.0, maximum=1.0)
        self.probe = _checks.integer(probe, "probe", minimum=1)
        self.name = "adaptive-tree"
        self.reset()

    @property
    def k(self) -> int:
        return self.budgets[-1]

    def reset(self) -> None:
        self.tokens = {b: 0.0 for b in self.budgets}
        self.rounds = {b: 0.0 for b in self.budgets}
        self.depth = {b: 0.0 for b in self.budgets}
        self.last_tried = {b: -1 for b in self.budgets}
        self.round = 0

    def rate(self, b: int) -> float:
        """Estimated tokens per target-step unit with b nodes (inf before any round)."""
        if self.rounds[b] == 0:
            return float("inf")
        tokens = self.tokens[b] / self.rounds[b]
        depth = self.depth[b] / self.rounds[b]
        return tokens / (depth * self.c + self.v[b])

    def next_budget(self) -> int:
        self.round += 1
        if self.round % self.probe == 0:
            return min(self.budgets, key=lambda b: self.last_tried[b])
        return max(self.budgets, key=lambda b: (self.rate(b), -b))

    def observe(self, budget: int, depth: int, emitted: int) -> None:
        for b in self.budgets:
            self.tokens[b] *= self.decay
            self.rounds[b] *= self.decay
            self.depth[b] *= self.decay
        if budget in self.tokens:
            self.tokens[budget] += emitted
            self.rounds[budget] += 1
            self.depth[budget] += depth
            self.last_tried[budget] = self.round


def as_tree_policy(tree: Any) -> Any:
    """An integer budget stays one (a fixed tree size); a tree policy is
    checked for the methods generate() calls."""
    if all(callable(getattr(tree, m, None)) for m in ("next_budget", "observe", "reset")):
        if not isinstance(getattr(tree, "name", None), str):
            raise ValueError(f"the tree policy {tree!r} needs a `name` string attribute")
        return tree
    return _checks.integer(tree, "tree", minimum=1, maximum=MAX_TREE)
