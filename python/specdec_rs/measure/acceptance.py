"""Acceptance by teacher forcing, and replaying rounds over it.
p = target, q = draft, k = γ.

The target writes an answer; one target forward scores every position of it
(`teacher_force`), and the drafter says how often its drafts would pass there
(`Drafter.acceptance`: a[t, i], the probability that draft i + 1 of a round
starting at answer position t is kept given the drafts before it were).
Contexts are the target's own text (exact at greedy, where kept drafts are
the text; an approximation under sampling). Averaging over t gives
  E[tokens | γ] = 1 + Σ_{i<=γ} mean_t Π_{j<=i} a(t, j)    (the refined prediction)
  α_i = mean_t Π_{j<=i} a(t, j) / mean_t Π_{j<i} a(t, j)   (per-position acceptance)
  α   = mean_t a(t, 1)                                     (the handout's single α)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from specdec_rs import _checks, models, runner
from specdec_rs.drafters import TeacherForced
from specdec_rs.processors import Sampler, SamplingConfig

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel


def teacher_force(
    target: PreTrainedModel, prompt: torch.Tensor, answer: torch.Tensor, config: SamplingConfig
) -> TeacherForced:
    """One target forward over prompt + answer: the processed rows predicting
    each answer token, and the last hidden states (for feature drafters)."""
    import torch

    seq = torch.cat([prompt, answer]).cpu()
    device = models.device_of(target)
    sampler = Sampler(config, models.vocab_of(target), torch.Generator(device).manual_seed(0))
    with torch.inference_mode():
        logits, hidden = runner.forward_with_hidden(
            target, seq[:-1], runner.new_cache(target), keep=len(answer), hidden=True
        )
        p = sampler.probs(logits, name="the target's logits")
    return TeacherForced(seq, len(prompt), p, sampler, target, hidden)


def acceptance_matrix(
    target: PreTrainedModel,
    drafter: Any,
    prompt: torch.Tensor,
    answer: torch.Tensor,
    config: SamplingConfig,
    k_max: int = 8,
) -> np.ndarray:
    """a(t, i): (len(answer), k_max); NaN where no such draft exists (past the
    drafter's proposal or the answer). Any drafter: it scores itself."""
    k_max = _checks.integer(k_max, "k_max", minimum=1, maximum=1024)
    import torch

    with torch.inference_mode():
        a: np.ndarray = drafter.acceptance(teacher_force(target, prompt, answer, config), k_max)
    return a


def _matrix(a: Any, name: str) -> np.ndarray:
    """An acceptance matrix a(t, i): 2-D float64, entries in [0, 1] or NaN (missing)."""
    out = _checks.as_numpy(a, name)
    if out.ndim != 2 or out.shape[1] < 1 or out.dtype.kind not in "fiub":
        raise ValueError(
            f"{name} has shape {out.shape} and dtype {out.dtype}; expected a float "
            "matrix a(t, i) of shape (answer length, k_max >= 1)"
        )
    out = out.astype(np.float64)
    seen = out[~np.isnan(out)]
    if ((seen < 0) | (seen > 1)).any():
        raise ValueError(f"{name} holds values outside [0, 1]; a(t, i) are probabilities")
    return out


@dataclass(frozen=True)
class Acceptance:
    """Teacher-forced acceptance over a set of answers.

    survive[i] = mean_t Π_{j<=i} a(t, j), i = 0..k_max-1 (rounds starting at t
    with t + k_max <= len(answer); a missing draft counts as rejected);
    alpha = mean over drafted positions of a(t, 1). `matrices` are kept for replay.
    """

    alpha: float
    survive: list[float]
    positions: int
    matrices: list[np.ndarray] = field(repr=False, default_factory=list, compare=False)

    @property
    def position_alpha(self) -> list[float]:
        prev = [1.0, *self.survive[:-1]]
        return [s / p if p > 0 else 0.0 for s, p in zip(self.survive, prev, strict=True)]

    def expected_tokens(self, k: int) -> float:
        """Refined E[tokens per pass] = 1 + Σ_{i<=k} survive_i."""
        return 1.0 + sum(self.survive[:k])


def summarize(matrices: Sequence[np.ndarray]) -> Acceptance:
    """Pool a(t, i) over answers into survival products."""
    if isinstance(matrices, np.ndarray) or not isinstance(matrices, Sequence):
        raise ValueError("matrices must be a list of a(t, i) matrices, one per answer")
    checked = [_matrix(a, f"matrices[{i}]") for i, a in enumerate(matrices)]
    if len({a.shape[1] for a in checked}) > 1:
        raise ValueError("the matrices have different k_max (columns); build them alike")
    rows = []
    for a in checked:
        k_max = a.shape[1]
        usable = np.nan_to_num(a[: max(0, len(a) - k_max + 1)])
        rows.append(np.cumprod(usable, axis=1))
    stacked = np.concatenate(rows) if rows else np.zeros((0, 1))
    if len(stacked) == 0:
        raise ValueError(
            "the answers are too short for teacher forcing; generate more tokens than k_max"
        )
    first = np.concatenate([a[:, 0] for a in checked])
    alpha = float(np.nanmean(first)) if np.isfinite(first).any() else 0.0
    return Acceptance(alpha, stacked.mean(axis=0).tolist(), len(stacked), checked)


def replay(
    a: np.ndarray, k: int, cost_ratio: float, verify_cost: Sequence[float]
) -> tuple[float, float]:
    """Expected (rounds, cost) to write one answer with γ = k, rounds placed as
    generate() places them: each starts where the last ended, so positions
    after a long accepted run are skipped (round starts are not uniform over t).

    A round at t drafts d = the drafts that exist among a(t, 1..min(k, n-t-1)),
    costs d·c + v(d+1) target steps, and keeps m drafts with probability
    Π_{j<=m} a(t, j) · (1 − a(t, m+1)). Backward recursion over t; target-only
    costs n. At greedy (a in {0, 1}) this is the run itself.
    """
    a = _matrix(a, "a")
    if len(a) == 0:
        raise ValueError("a has no rows; replay needs a(t, i) for an answer of at least one token")
    k = _checks.integer(k, "k", maximum=a.shape[1])
    cost_ratio = _checks.real(cost_ratio, "cost_ratio", minimum=0.0)
    v = _verify_costs(verify_cost, k + 1)
    n = len(a)
    rounds = np.zeros(n + 2)
    cost = np.zeros(n + 2)
    for t in range(n - 1, -1, -1):
        row = a[t, : max(0, min(k, n - t - 1))]
        drafted = int(np.isfinite(row).sum())  # missing drafts are trailing NaNs
        row = np.nan_to_num(row[:drafted])
        r, c, survive = 1.0, drafted * cost_ratio + v[drafted], 1.0
        for m in range(drafted + 1):
            p_m = survive * (1.0 - row[m]) if m < drafted else survive
            r += p_m * rounds[t + m + 1]
            c += p_m * cost[t + m + 1]
            if m < drafted:
                survive *= row[m]
        rounds[t], cost[t] = r, c
    return float(rounds[0]), float(cost[0])


def _verify_costs(verify_cost: Any, needed: int) -> list[float]:
    v = _checks.reals(verify_cost, "verify_cost", above=0.0)
    if len(v) < needed:
        raise ValueError(f"verify_cost needs v(1..{needed}) ({needed} entries); got {len(v)}")
    return v
