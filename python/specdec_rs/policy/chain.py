"""The chain γ policies: how many drafts each round asks for. p = target, q = draft, k = γ.

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

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from specdec_rs import _checks
from specdec_rs.policy.base import MAX_K, ChainPolicy, Foreign, KPolicy, is_policy

if TYPE_CHECKING:
    from specdec_rs.rounds import Round


class FixedK(ChainPolicy):
    def __init__(self, k: int):
        self.k = _checks.integer(k, "k", maximum=MAX_K)
        self.name = f"fixed:{self.k}"

    def reset(self) -> None:
        pass

    def next_k(self) -> int:
        return self.k

    def observe(self, k: int, drafted: int, num_accepted: int) -> None:
        pass


class HeuristicK(ChainPolicy):
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


class AdaptiveK(ChainPolicy):
    """γ from the cost model and running per-position acceptance estimates.

    cost_ratio: c, one draft step / one target step.  verify_cost: v(n) for
    n = 1..k_max+1, a target forward over n new tokens / over one (v(1) = 1;
    None means v ≡ 1, the handout's model).  Acceptance counts decay by
    `decay` per round (recent rounds weigh more) and start from a Beta(1, 1)
    prior, so a position never seen is estimated at 1/2; with
    `prior="previous"` only the first position's is, and position i's prior
    (weight 2) has the mean of position i - 1's estimate, so a position never
    reached is taken to keep what the one before it keeps (drafts that are
    kept in runs, like a copied passage's, are then tried longer). Every
    `probe` rounds with γ = 0 it drafts one token anyway, so the estimates
    can recover.
    """

    def __init__(
        self,
        cost_ratio: float,
        verify_cost: Sequence[float] | None = None,
        *,
        k_max: int = 8,
        decay: float = 0.97,
        probe: int = 8,
        prior: str = "uniform",
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
        self.prior = _checks.choice(prior, "prior", ("uniform", "previous"))
        self.name = "adaptive"
        self.reset()

    def reset(self) -> None:
        self.kept = [0.0] * self.k_max
        self.reached = [0.0] * self.k_max
        self.off_rounds = 0

    def alphas(self) -> list[float]:
        """Current α_i estimates, i = 1..k_max (posterior means)."""
        out, prior = [], 0.5  # each position's prior mean, weight 2
        for a, r in zip(self.kept, self.reached, strict=True):
            out.append((a + 2 * prior) / (r + 2))
            if self.prior == "previous":
                prior = out[-1]
        return out

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


class BySource(ChainPolicy):
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

    def observe_round(self, r: Round) -> None:
        self.policies[self.current].observe_round(r)


def as_policy(k: Any) -> KPolicy:
    """An integer k >= 1 is FixedK(k); a policy object is checked for the
    methods generate() calls."""
    if is_policy(k, ("next_k", "observe", "reset"), "γ policy"):
        if callable(getattr(k, "observe_round", None)):
            return k  # type: ignore[no-any-return]
        return Foreign(k, tree=False)
    try:
        return FixedK(_checks.integer(k, "k", minimum=1, maximum=MAX_K))
    except ValueError as e:
        raise ValueError(
            f"{e} (k is drafts per round, or a policy with next_k(), observe() and reset(), "
            "e.g. AdaptiveK)"
        ) from None
