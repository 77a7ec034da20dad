"""Measured generation next to the prediction. p = target, q = draft, k = γ.

A bench runs each (workload, temperature, drafter, method) of a `Job` over
the same prompts, prompt by prompt (so machine drift hits every method
alike), and reports totals: tokens/s over all new tokens and all wall time
(prefill included), the speedup against target-only through the same loop in
the same setting, and the decode-only speedup (prefill excluded, what the
predictions describe).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from functools import reduce
from typing import Any

from specdec_rs import _checks
from specdec_rs.generation import GenerationResult, generate
from specdec_rs.generation.inputs import eos_set
from specdec_rs.measure.costs import Costs
from specdec_rs.measure.hf import hf_generate, strategy
from specdec_rs.measure.job import Job, Progress, no_progress
from specdec_rs.measure.methods import DEFAULT_POLICIES, POLICIES, TARGET_ONLY, Method, Policy
from specdec_rs.measure.predict import Answers, ForecastPoint, PredictReport, predict
from specdec_rs.policy import MAX_K
from specdec_rs.processors import SamplingConfig
from specdec_rs.rounds import Tally

MAX_TREE_SIZE = 256  # the largest tree a bench runs (nodes per round)


@dataclass(frozen=True, kw_only=True)
class Counts:
    """What runs add up to: new tokens, wall seconds (prefill included),
    prefill seconds (None for transformers), target passes, drafts kept and
    checked (in all, and by draft position: kept_at[i] / checked_at[i] is
    P(draft i + 1 kept | checked))."""

    tokens: int
    seconds: float
    prefill: float | None
    passes: int
    kept: int
    checked: int
    kept_at: tuple[int, ...] = ()
    checked_at: tuple[int, ...] = ()

    def counts(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(Counts)}

    def plus(self, other: Counts) -> Counts:
        """The sums of both counts (prefill None when either has none)."""
        prefill = (
            None if self.prefill is None or other.prefill is None else self.prefill + other.prefill
        )
        positions = self.tally + other.tally
        return Counts(
            tokens=self.tokens + other.tokens,
            seconds=self.seconds + other.seconds,
            prefill=prefill,
            passes=self.passes + other.passes,
            kept=self.kept + other.kept,
            checked=self.checked + other.checked,
            kept_at=positions.accepted,
            checked_at=positions.reached,
        )

    @property
    def tally(self) -> Tally:
        """The per-position counts as a `rounds.Tally` (its α part)."""
        return Tally(reached=self.checked_at, accepted=self.kept_at)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_pass(self) -> float | None:
        return self.tokens / self.passes if self.passes else None

    @property
    def alpha(self) -> float | None:
        """Drafts kept / drafts checked (None when nothing was drafted)."""
        return self.kept / self.checked if self.checked else None

    @property
    def alpha_by_position(self) -> list[float]:
        """P(draft i + 1 kept | checked), i = 0.. (NaN where none was checked)."""
        return self.tally.position_alpha

    def speedup_vs(self, baseline: Counts) -> float:
        """tokens/s over the baseline's tokens/s."""
        return self.tokens_per_second / baseline.tokens_per_second

    def decode_speedup_vs(self, baseline: Counts) -> float | None:
        """The same with each side's prefill time removed (None without prefill times)."""
        if self.prefill is None or baseline.prefill is None:
            return None
        mine = self.tokens / (self.seconds - self.prefill)
        return mine / (baseline.tokens / (baseline.seconds - baseline.prefill))


@dataclass(frozen=True, kw_only=True)
class Run(Counts):
    """One generation of `drafter` with `method` on prompt `prompt` of `workload`."""

    workload: str
    temperature: float
    drafter: str
    method: Method
    prompt: int

    @classmethod
    def of(
        cls, out: GenerationResult, workload: str, drafter: str, method: Method, prompt: int
    ) -> Run:
        """The numbers of one `generate` result."""
        return cls(
            workload=workload,
            temperature=out.temperature,
            drafter=drafter,
            method=method,
            prompt=prompt,
            tokens=out.new_tokens,
            seconds=out.time_total,
            prefill=out.time_prefill,
            passes=out.rounds,
            kept=sum(out.accepted),
            checked=sum(out.reached),
            kept_at=tuple(out.accepted),
            checked_at=tuple(out.reached),
        )


@dataclass(frozen=True, kw_only=True)
class Totals(Counts):
    """The sum of the runs of one (workload, temperature, drafter, method) over prompts."""

    workload: str
    temperature: float
    drafter: str
    method: Method

    @classmethod
    def of(cls, runs: Sequence[Run]) -> Totals:
        first = runs[0]
        summed = reduce(Counts.plus, runs[1:], Counts(**first.counts()))
        return cls(
            workload=first.workload,
            temperature=first.temperature,
            drafter=first.drafter,
            method=first.method,
            **summed.counts(),
        )


@dataclass(frozen=True)
class BenchRow:
    """Totals with their rates, their speedups against target-only (same
    setting, same loop) and, for a fixed γ, the prediction at that γ."""

    totals: Totals
    tokens_per_second: float
    tokens_per_pass: float | None
    alpha: float | None
    speedup: float
    decode_speedup: float | None
    predicted: ForecastPoint | None

    @classmethod
    def against(cls, t: Totals, base: Totals, predicted: ForecastPoint | None) -> BenchRow:
        return cls(
            t,
            t.tokens_per_second,
            t.tokens_per_pass,
            t.alpha,
            t.speedup_vs(base),
            t.decode_speedup_vs(base),
            predicted,
        )


@dataclass(frozen=True)
class BenchReport:
    costs: Costs
    rows: list[BenchRow]
    runs: list[Run] = field(repr=False)
    predictions: PredictReport = field(repr=False)
    prompts: int = 0
    max_new_tokens: int = 0
    seed: int = 0

    def settings(self) -> list[tuple[str, float]]:
        return list(dict.fromkeys((r.totals.workload, r.totals.temperature) for r in self.rows))


def ks_for(cost_ratio: float, k_max: int) -> list[int]:
    """Fixed γ values worth measuring: long lists for nearly free drafters
    (c < 0.05, e.g. lookup), short ones when each draft costs."""
    ks = (1, 2, 4, 6, 8) if cost_ratio < 0.05 else (1, 2, 3)
    return [k for k in ks if k <= k_max]


def totals_rows(runs: Sequence[Run], predictions: PredictReport | None = None) -> list[BenchRow]:
    """Rows of totals per (workload, temperature, drafter, method) in run
    order, each against the same setting's target-only totals."""
    groups: dict[tuple[str, float, str, Method], list[Run]] = {}
    for r in runs:
        groups.setdefault((r.workload, r.temperature, r.drafter, r.method), []).append(r)
    totals = {key: Totals.of(rs) for key, rs in groups.items()}
    rows = []
    for (workload, temperature, spec, method), t in totals.items():
        base = totals[(workload, temperature, "none", TARGET_ONLY)]
        point = None
        if predictions is not None and method.policy == "fixed" and method.engine == "specdec":
            found = predictions.find(workload, temperature, spec)
            point = found.forecast.at(method.k or 0) if found is not None else None
        rows.append(BenchRow.against(t, base, point))
    return rows


def run_once(
    job: Job,
    spec: str,
    method: Method,
    ids: Any,
    config: SamplingConfig,
    *,
    seed: int,
    eos: list[int],
) -> tuple[Run, list[int]]:
    """One generation with `method`; (the run's numbers, its tokens)."""
    drafter = job.drafters.get(spec)
    if method.engine == "transformers":
        r = hf_generate(
            job.target,
            ids,
            max_new_tokens=job.max_new_tokens,
            config=config,
            seed=seed,
            eos_token_id=eos,
            **(strategy(drafter, method.k) or {}),
        )
        passes = (
            r.target_passes - 1
            if drafter is None or "prompt_lookup_num_tokens" in (drafter.hf_kwargs() or {})
            else 0
        )  # an assistant model's passes are not the target's
        run = Run(
            workload="",
            temperature=config.temperature,
            drafter=spec,
            method=method,
            prompt=0,
            tokens=r.new_tokens,
            seconds=r.time_total,
            prefill=None,
            passes=passes,
            kept=0,
            checked=0,
        )
        return run, r.tokens
    tree = method.tree_policy(job.costs, spec, drafter)
    out = generate(
        job.target,
        drafter,
        ids,
        max_new_tokens=job.max_new_tokens,
        k=1 if tree else method.k_policy(job.costs, spec, drafter, job.k_max),
        temperature=config.temperature,
        seed=seed,
        tree=tree,
    )
    return Run.of(out, "", spec, method, 0), out.tokens


def bench_methods(
    job: Job,
    transformers: bool,
    transformers_ks: Sequence[int],
    ks: Sequence[int] | None = None,
    policies: Sequence[Policy] = DEFAULT_POLICIES,
    trees: Sequence[int] = (),
) -> list[tuple[str, Method]]:
    """(drafter spec, method) pairs of a job, target-only first. Fixed γ:
    `ks`, or `ks_for` the drafter's cost; then each of `policies`; then a
    tree of each size in `trees` for drafters that draft trees."""
    costs = job.measured_costs()
    jobs = [("none", TARGET_ONLY)]
    if transformers:
        jobs.append(("none", Method("transformers", Policy.NONE)))
    for spec, drafter in job.drafters.items():
        c = costs.cost_ratio[spec]
        fixed = ks_for(c, job.k_max) if ks is None else [k for k in ks if k <= job.k_max]
        jobs += [(spec, Method("specdec", Policy.FIXED, k)) for k in fixed]
        for p in policies:
            if p == Policy.ADAPTIVE_POOLED and not getattr(drafter, "parts", None):
                continue  # the ablation of one cost model per part: for drafters with parts
            jobs.append((spec, Method("specdec", p, job.k_max if p == Policy.MEASURED else None)))
        if callable(getattr(drafter, "propose_tree", None)) and trees:
            jobs += [(spec, Method("specdec", Policy.TREE, n)) for n in trees]
            jobs.append((spec, Method("specdec", Policy.ADAPTIVE_TREE, max(trees))))
        if transformers and strategy(drafter) is not None:
            jobs.append((spec, Method("transformers", Policy.DEFAULT)))
            jobs += [(spec, Method("transformers", Policy.FIXED, k)) for k in transformers_ks]
    return jobs


def run_bench(
    job: Job,
    *,
    transformers: bool = True,
    transformers_ks: Sequence[int] = (),
    ks: Sequence[int] | None = None,
    policies: Sequence[str | Policy] = DEFAULT_POLICIES,
    trees: Sequence[int] = (),
    progress: Progress = no_progress,
) -> BenchReport:
    """Real generation per drafter and method of `job`, with the forecast for
    the same prompts (teacher forcing over the target-only runs' own
    answers). Fixed γ values: `ks` (default: chosen by each drafter's cost);
    γ policies: `policies` (of "adaptive", "heuristic", "adaptive-pooled",
    "measured"); tree sizes: `trees` (nodes per round, for drafters that
    draft trees)."""
    ks_hf = [
        _checks.integer(k, "transformers_ks", minimum=1, maximum=MAX_K) for k in transformers_ks
    ]
    fixed = None if ks is None else [_checks.integer(k, "ks", minimum=1, maximum=MAX_K) for k in ks]
    chosen = [Policy(_checks.choice(p, "policies", [x.value for x in POLICIES])) for p in policies]
    sizes = [_checks.integer(n, "trees", minimum=1, maximum=MAX_TREE_SIZE) for n in trees]
    methods = bench_methods(job, transformers, ks_hf, fixed, chosen, sizes)
    eos = sorted(eos_set(None, job.target))
    runs: list[Run] = []
    answers: Answers = {}
    for workload in job.workloads:
        for temperature in job.temperatures:
            config = SamplingConfig(temperature)
            ids_list = job.prompt_sets[workload]
            advance = progress(f"bench {workload} T={temperature:g}", len(ids_list) * len(methods))
            for i, ids in enumerate(ids_list):
                for spec, method in methods:
                    run, tokens = run_once(
                        job, spec, method, ids, config, seed=job.seed + i, eos=eos
                    )
                    runs.append(replace(run, workload=workload, prompt=i))
                    if method == TARGET_ONLY:
                        answers[(workload, temperature, i)] = tokens
                    advance()
    predictions = predict(job, answers=answers, progress=progress)
    rows = totals_rows(runs, predictions)
    return BenchReport(
        job.measured_costs(), rows, runs, predictions, job.prompts, job.max_new_tokens, job.seed
    )
