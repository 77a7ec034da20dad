"""Predict before running: teacher-forced α, measured c and v(n), and the
speedup to expect per γ. p = target, q = draft, k = γ.

Three predictions per γ: the handout's formulas at the single α (v ≡ 1);
the refined ones (per-position acceptance, measured v(n)),
E[tokens | γ] / (γ·c + v(γ+1)); and the replay of rounds over the
teacher-forced a(t, i) (round starts placed as generation places them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specdec_rs import _checks, theory
from specdec_rs.generation import generate
from specdec_rs.measure.acceptance import Acceptance, acceptance_matrix, replay, summarize
from specdec_rs.measure.costs import Costs
from specdec_rs.measure.job import Job, Progress, no_progress
from specdec_rs.measure.methods import drafter_verify_cost
from specdec_rs.processors import SamplingConfig

# (workload, temperature, prompt index) -> the target's answer, when already generated
Answers = dict[tuple[str, float, int], list[int]]


@dataclass(frozen=True)
class ForecastPoint:
    """The three predictions at one γ."""

    tokens_handout: float
    speedup_handout: float
    tokens_refined: float
    speedup_refined: float
    tokens_replay: float
    speedup_replay: float


@dataclass(frozen=True)
class Forecast:
    """Predicted tokens per pass and speedup for γ = 1..k_max; best_k = 0:
    speculation does not pay."""

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

    def at(self, k: int) -> ForecastPoint | None:
        """The predictions at γ = k (None outside 1..k_max)."""
        if not 1 <= k <= len(self.k):
            return None
        i = k - 1
        return ForecastPoint(
            self.tokens_handout[i],
            self.speedup_handout[i],
            self.tokens_refined[i],
            self.speedup_refined[i],
            self.tokens_replay[i],
            self.speedup_replay[i],
        )


def forecast(acceptance: Acceptance, cost_ratio: float, verify_cost: Sequence[float]) -> Forecast:
    """The three predictions per γ = 1..k_max from teacher-forced acceptance,
    c and v(1..k_max+1)."""
    if not isinstance(acceptance, Acceptance):
        raise ValueError(f"acceptance is a {type(acceptance).__name__}; build it with summarize()")
    k_max = len(acceptance.survive)
    c = _checks.real(cost_ratio, "cost_ratio", minimum=0.0)
    v = _checks.reals(verify_cost, "verify_cost", above=0.0)
    if len(v) < k_max + 1:
        raise ValueError(f"verify_cost needs v(1..{k_max + 1}); got {len(v)} entries")
    ks = list(range(1, k_max + 1))
    a = min(acceptance.alpha, 1 - 1e-12)
    tokens_h = [theory.expected_tokens(a, k) for k in ks]
    speed_h = [theory.expected_speedup(a, k, c) for k in ks]
    tokens_r = [acceptance.expected_tokens(k) for k in ks]
    speed_r = [t / (k * c + v[k]) for k, t in zip(ks, tokens_r, strict=True)]
    best_h = theory.best_k(a, c, k_max)
    best_r = max(ks, key=lambda k: speed_r[k - 1]) if max(speed_r) > 1.0 else 0
    tokens_p, speed_p = [], []
    answer_tokens = sum(len(m) for m in acceptance.matrices)
    for k in ks:
        replays = [replay(m, k, c, v) for m in acceptance.matrices]
        tokens_p.append(answer_tokens / sum(r for r, _ in replays) if replays else float("nan"))
        speed_p.append(answer_tokens / sum(x for _, x in replays) if replays else float("nan"))
    best_p = max(ks, key=lambda k: speed_p[k - 1]) if max(speed_p, default=0) > 1.0 else 0
    be = theory.break_even_cost(a, max(best_h, 1))
    return Forecast(
        ks, tokens_h, speed_h, tokens_r, speed_r, tokens_p, speed_p, best_h, best_r, best_p, be
    )


@dataclass(frozen=True)
class DrafterForecast:
    """One drafter in one setting: its teacher-forced acceptance, c, and the forecast."""

    workload: str
    temperature: float
    drafter: str
    alpha: float
    position_alpha: list[float]
    positions: int
    cost_ratio: float
    break_even_cost: float
    near_break_even: bool
    forecast: Forecast


@dataclass(frozen=True)
class PredictReport:
    costs: Costs
    results: list[DrafterForecast]
    prompts: int
    max_new_tokens: int
    seed: int

    def find(self, workload: str, temperature: float, drafter: str) -> DrafterForecast | None:
        for r in self.results:
            if (r.workload, r.temperature, r.drafter) == (workload, temperature, drafter):
                return r
        return None


def predict(
    job: Job, *, answers: Answers | None = None, progress: Progress = no_progress
) -> PredictReport:
    """Teacher-forced acceptance and the forecast per (workload, temperature,
    drafter) of `job`: the target answers the job's prompts (or `answers`
    gives them), each drafter scores the answers."""
    import torch

    costs = job.measured_costs()
    answers = answers or {}
    results = []
    for workload in job.workloads:
        for temperature in job.temperatures:
            config = SamplingConfig(temperature)
            advance = progress(f"predict {workload} T={temperature:g}", len(job.drafters) + 1)
            texts = []
            for i, ids in enumerate(job.prompt_sets[workload]):
                tokens = answers.get((workload, temperature, i))
                if tokens is None:
                    tokens = generate(
                        job.target,
                        None,
                        ids,
                        max_new_tokens=job.max_new_tokens,
                        temperature=temperature,
                        seed=job.seed + i,
                    ).tokens
                texts.append((ids, torch.tensor(tokens, dtype=torch.long)))
            advance()
            for spec, drafter in job.drafters.items():
                mats = [
                    acceptance_matrix(job.target, drafter, ids, answer, config, job.k_max)
                    for ids, answer in texts
                    if len(answer) >= job.k_max
                ]
                acc = summarize(mats)
                c = costs.cost_ratio[spec]
                fc = forecast(acc, c, drafter_verify_cost(costs, drafter))
                results.append(
                    DrafterForecast(
                        workload,
                        temperature,
                        spec,
                        acc.alpha,
                        acc.position_alpha,
                        acc.positions,
                        c,
                        fc.break_even_cost,
                        c > 0.8 * fc.break_even_cost,
                        fc,
                    )
                )
                advance()
    return PredictReport(costs, results, job.prompts, job.max_new_tokens, job.seed)
