"""Predict before running, explain after: acceptance by teacher forcing, the
cost ratio c, the verification cost curve v(n), and predicted speedups.
p = target, q = draft, k = γ.

Teacher forcing: the target writes an answer; target and drafter then score
every position of it in one forward each. For a round starting at answer
position t, draft i is kept (given drafts 1..i-1 were) with probability
a(t, i):
  model drafters  a(t, i) = Σ min(p, q) at position t+i-1 (greedy: argmax agreement)
  prompt lookup   x = lookup(text[:t]); a(t, i) = p_{t+i-1}(x_i) (greedy: x_i = text_{t+i-1})
Contexts are the target's own text (exact at greedy, where kept drafts are the
text; an approximation under sampling). Averaging over t gives
  E[tokens | γ] = 1 + Σ_{i<=γ} mean_t Π_{j<=i} a(t, j)    (the refined prediction)
  α_i = mean_t Π_{j<=i} a(t, j) / mean_t Π_{j<i} a(t, j)   (per-position acceptance)
  α   = mean_t a(t, 1)                                     (the handout's single α)
and speedup(γ) = E[tokens | γ] / (γ·c + v(γ+1)); v ≡ 1 gives the handout's formula.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from specdec_rs import _checks, models, theory
from specdec_rs import drafters as drafters_mod
from specdec_rs.processors import SamplingConfig, logits_to_probs
from specdec_rs.timing import median_seconds

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel


# ---- costs ------------------------------------------------------------------------------


def decode_step_time(model: PreTrainedModel, context: torch.Tensor, repeats: int = 100) -> float:
    """Median seconds of one cached single-token decode step after `context` (n,)."""
    import torch

    repeats = _checks.integer(repeats, "repeats", minimum=1)
    with torch.inference_mode():
        cache = models.new_cache(model)
        models.forward(model, context[:-1], cache, keep=1)
        n = len(context) - 1

        def step() -> None:
            models.forward(model, context[-1:], cache, keep=1)
            models.crop(cache, n)

        return median_seconds(step, repeats)


def verify_cost_curve(
    model: PreTrainedModel, context: torch.Tensor, max_n: int = 9, repeats: int = 15
) -> list[float]:
    """v(n) for n = 1..max_n: a cached forward over n new tokens after `context`,
    relative to one token (medians; sizes interleaved so drift hits all alike)."""
    import torch

    max_n = _checks.integer(max_n, "max_n", minimum=1, maximum=1024)
    repeats = _checks.integer(repeats, "repeats", minimum=1)
    times: dict[int, list[float]] = {n: [] for n in range(1, max_n + 1)}
    with torch.inference_mode():
        cache = models.new_cache(model)
        models.forward(model, context, cache, keep=1)
        base = len(context)
        g = torch.Generator().manual_seed(0)
        for rep in range(repeats + 2):
            for n in times:
                tokens = torch.randint(0, models.vocab_of(model), (n,), generator=g)
                t = time.perf_counter()
                models.forward(model, tokens, cache, keep=n)
                elapsed = time.perf_counter() - t
                models.crop(cache, base)
                if rep >= 2:  # warm-up
                    times[n].append(elapsed)
    one = statistics.median(times[1])
    return [statistics.median(times[n]) / one for n in times]


def drafter_step_time(
    drafter: Any, target: PreTrainedModel, context: torch.Tensor, repeats: int = 100
) -> float:
    """Median seconds for the drafter to propose one token after `context`."""
    import torch

    repeats = _checks.integer(repeats, "repeats", minimum=1)
    from specdec_rs.processors import Sampler

    sampler = Sampler(
        SamplingConfig(0.0), models.vocab_of(target), torch.Generator().manual_seed(0)
    )
    with torch.inference_mode():
        cache = models.new_cache(target)
        models.forward(target, context[:-1], cache, keep=1)
        drafter.start(context, cache)

        def step() -> None:
            drafter.propose(context, 1, sampler)
            drafter.update(context[:-1], 0)  # back to the cache it started from

        return median_seconds(step, repeats)


# ---- acceptance by teacher forcing ------------------------------------------------------


def _probs(
    model: PreTrainedModel, seq: torch.Tensor, start: int, config: SamplingConfig, vocab: int
) -> torch.Tensor:
    """Processed rows predicting seq[start:], shape (len(seq) - start, vocab)."""
    import torch

    with torch.inference_mode():
        logits = models.forward(model, seq[:-1], models.new_cache(model), keep=len(seq) - start)
    return logits_to_probs(logits[:, :vocab], config)


def acceptance_matrix(
    target: PreTrainedModel,
    drafter: Any,
    prompt: torch.Tensor,
    answer: torch.Tensor,
    config: SamplingConfig,
    k_max: int = 8,
) -> np.ndarray:
    """a(t, i): (len(answer), k_max) probability that draft i+1 of a round
    starting at answer position t is kept, given the drafts before it were;
    NaN where no such draft exists (past the lookup's proposal or the answer)."""
    import torch

    seq = torch.cat([prompt, answer])
    n, start = len(answer), len(prompt)
    vocab = models.vocab_of(target)
    p = _probs(target, seq, start, config, vocab)  # row t predicts answer[t]
    a = np.full((n, k_max), np.nan)
    if isinstance(drafter, drafters_mod.PromptLookup):
        seq_np = seq.numpy()
        answer_np = answer.numpy()
        p_np = p.double().numpy()
        for t in range(n):
            x = drafters_mod.lookup(
                seq_np[: start + t],
                k_max,
                drafter.min_ngram,
                drafter.max_ngram,
                drafter.occurrence == "first",
            )
            for i, token in enumerate(x[: n - t]):
                a[t, i] = float(token == answer_np[t + i]) if config.greedy else p_np[t + i, token]
        return a
    if isinstance(drafter, drafters_mod.EarlyExit):
        model = drafter.view
    elif isinstance(drafter, drafters_mod.DraftModel):
        model = drafter.model
    else:
        raise ValueError(f"teacher forcing does not know drafter {type(drafter).__name__}")
    q = _probs(model, seq, start, config, vocab)
    if config.greedy:
        agree = (p.argmax(-1) == q.argmax(-1)).double().numpy()
    else:
        agree = torch.minimum(p, q).sum(-1).double().numpy()
    for i in range(k_max):  # depth i+1 of a round at t reads position t+i
        a[: n - i, i] = agree[i:]
    return a


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
    matrices: list[np.ndarray] = field(repr=False, default_factory=list)

    @property
    def position_alpha(self) -> list[float]:
        prev = [1.0, *self.survive[:-1]]
        return [s / p if p > 0 else 0.0 for s, p in zip(self.survive, prev, strict=True)]

    def expected_tokens(self, k: int) -> float:
        """Refined E[tokens per pass] = 1 + Σ_{i<=k} survive_i."""
        return 1.0 + sum(self.survive[:k])


def _matrix(a: Any, name: str) -> np.ndarray:
    """An acceptance matrix a(t, i): 2-D float64, entries in [0, 1] or NaN (missing)."""
    out = _checks.as_numpy(a, name)
    if out.ndim != 2 or out.shape[1] < 1 or out.dtype.kind not in "fiu":
        raise ValueError(
            f"{name} has shape {out.shape} and dtype {out.dtype}; expected a float "
            "matrix a(t, i) of shape (answer length, k_max >= 1)"
        )
    out = out.astype(np.float64)
    seen = out[~np.isnan(out)]
    if ((seen < 0) | (seen > 1)).any():
        raise ValueError(f"{name} holds values outside [0, 1]; a(t, i) are probabilities")
    return out


def _costs(verify_cost: Any, needed: int) -> list[float]:
    v = _checks.reals(verify_cost, "verify_cost", above=0.0)
    if len(v) < needed:
        raise ValueError(f"verify_cost needs v(1..{needed}) ({needed} entries); got {len(v)}")
    return v


def summarize(matrices: Sequence[np.ndarray]) -> Acceptance:
    """Pool a(t, i) over answers into survival products."""
    if isinstance(matrices, np.ndarray) or not isinstance(matrices, Sequence):
        raise ValueError("matrices must be a list of a(t, i) matrices, one per answer")
    matrices = [_matrix(a, f"matrices[{i}]") for i, a in enumerate(matrices)]
    if len({a.shape[1] for a in matrices}) > 1:
        raise ValueError("the matrices have different k_max (columns); build them alike")
    rows = []
    for a in matrices:
        k_max = a.shape[1]
        usable = np.nan_to_num(a[: max(0, len(a) - k_max + 1)])
        rows.append(np.cumprod(usable, axis=1))
    stacked = np.concatenate(rows) if rows else np.zeros((0, 1))
    if len(stacked) == 0:
        raise ValueError(
            "the answers are too short for teacher forcing; generate more tokens than k_max"
        )
    first = np.concatenate([a[:, 0] for a in matrices])
    alpha = float(np.nanmean(first)) if np.isfinite(first).any() else 0.0
    return Acceptance(alpha, stacked.mean(axis=0).tolist(), len(stacked), list(matrices))


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
    k = _checks.integer(k, "k", maximum=a.shape[1])
    cost_ratio = _checks.real(cost_ratio, "cost_ratio", minimum=0.0)
    verify_cost = _costs(verify_cost, k + 1)
    n = len(a)
    rounds = np.zeros(n + 2)
    cost = np.zeros(n + 2)
    for t in range(n - 1, -1, -1):
        row = a[t, : max(0, min(k, n - t - 1))]
        drafted = int(np.isfinite(row).sum())  # missing drafts are trailing NaNs
        row = np.nan_to_num(row[:drafted])
        r, c, survive = 1.0, drafted * cost_ratio + verify_cost[drafted], 1.0
        for m in range(drafted + 1):
            p_m = survive * (1.0 - row[m]) if m < drafted else survive
            r += p_m * rounds[t + m + 1]
            c += p_m * cost[t + m + 1]
            if m < drafted:
                survive *= row[m]
        rounds[t], cost[t] = r, c
    return float(rounds[0]), float(cost[0])


# ---- predictions --------------------------------------------------------------------------


@dataclass(frozen=True)
class Prediction:
    """Predicted tokens per pass and speedup for γ = 1..k_max."""

    k: list[int]
    tokens_handout: list[float]
    speedup_handout: list[float]
    tokens_refined: list[float]
    speedup_refined: list[float]
    tokens_replay: list[float]
    speedup_replay: list[float]
    best_k_handout: int
    best_k_refined: int
    best_k_replay: int
    break_even_cost: float


def predict(acceptance: Acceptance, cost_ratio: float, verify_cost: Sequence[float]) -> Prediction:
    """Three predictions per γ: the handout's formulas at the single α (v ≡ 1);
    the refined ones (per-position acceptance, measured v(n)); and the replay of
    rounds over the teacher-forced a(t, i) (round starts placed as generation
    places them, real proposal lengths). best_k = 0: speculation does not pay."""
    if not isinstance(acceptance, Acceptance):
        raise ValueError(f"acceptance is a {type(acceptance).__name__}; build it with summarize()")
    k_max = len(acceptance.survive)
    cost_ratio = _checks.real(cost_ratio, "cost_ratio", minimum=0.0)
    verify_cost = _costs(verify_cost, k_max + 1)
    ks = list(range(1, k_max + 1))
    a = min(acceptance.alpha, 1 - 1e-12)
    tokens_h = [theory.expected_tokens(a, k) for k in ks]
    speed_h = [theory.expected_speedup(a, k, cost_ratio) for k in ks]
    tokens_r = [acceptance.expected_tokens(k) for k in ks]
    speed_r = [t / (k * cost_ratio + verify_cost[k]) for k, t in zip(ks, tokens_r, strict=True)]
    best_h = theory.best_k(a, cost_ratio, k_max)
    best_r = max(ks, key=lambda k: speed_r[k - 1]) if max(speed_r) > 1.0 else 0
    tokens_p, speed_p = [], []
    answer_tokens = sum(len(m) for m in acceptance.matrices)
    for k in ks:
        replays = [replay(m, k, cost_ratio, verify_cost) for m in acceptance.matrices]
        tokens_p.append(answer_tokens / sum(r for r, _ in replays) if replays else float("nan"))
        speed_p.append(answer_tokens / sum(c for _, c in replays) if replays else float("nan"))
    best_p = max(ks, key=lambda k: speed_p[k - 1]) if max(speed_p, default=0) > 1.0 else 0
    be = theory.break_even_cost(a, max(best_h, 1))
    return Prediction(
        ks, tokens_h, speed_h, tokens_r, speed_r, tokens_p, speed_p, best_h, best_r, best_p, be
    )
