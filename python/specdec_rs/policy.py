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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from specdec_rs import _checks

MAX_K = 1024  # the most drafts a policy may ask for in one round


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
