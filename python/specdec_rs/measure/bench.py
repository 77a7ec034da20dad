"""Measured generation next to the prediction, and the demo. p = target,
q = draft, k = γ.

A job runs each (workload, temperature, drafter, method) over the same
prompts, prompt by prompt (so machine drift hits every method alike), and
reports totals: tokens/s over all new tokens and all wall time (prefill
included), the speedup against target-only through the same loop in the same
setting, and the decode-only speedup (prefill excluded, what the predictions
describe).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specdec_rs import _checks, drafters
from specdec_rs.generation import GenerationResult, generate
from specdec_rs.generation.inputs import eos_set
from specdec_rs.limits import MAX_NEW_TOKENS
from specdec_rs.measure import workloads as workloads_mod
from specdec_rs.measure.costs import Costs
from specdec_rs.measure.hf import hf_generate, strategy
from specdec_rs.measure.predict import (
    DEFAULT_DRAFTERS,
    Answers,
    ForecastPoint,
    PredictReport,
    Progress,
    check_drafter_specs,
    measure_job_costs,
    no_progress,
    predict,
)
from specdec_rs.policy import (
    MAX_K,
    AdaptiveK,
    AdaptiveTree,
    BySource,
    HeuristicK,
    KPolicy,
    measured_policy,
)
from specdec_rs.processors import SamplingConfig

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass(frozen=True)
class Method:
    """How a run drafts. engine: "specdec" (this loop) or "transformers"
    (its generate()). policy: "none" (target only), "fixed" (k drafts a round),
    "adaptive" (AdaptiveK from the measured costs), "measured" (MeasuredK,
    its costs measured as it runs, at most k drafts), "heuristic" (HeuristicK),
    "tree" (draft trees of k nodes a round), "adaptive-tree" (AdaptiveTree
    over tree sizes up to k, from the measured v(n) and c), or "default"
    (transformers' own schedule)."""

    engine: str
    policy: str
    k: int | None = None

    @property
    def label(self) -> str:
        name = {
            "none": "target-only",
            "fixed": f"k={self.k}",
            "tree": f"tree={self.k}",
            "measured": f"measured (k <= {self.k})",
        }.get(self.policy, self.policy)
        if self.policy == "adaptive-tree":
            name = f"adaptive tree (<= {self.k} nodes)"
        return name if self.engine == "specdec" else f"transformers {name}".replace(" default", "")


TARGET_ONLY = Method("specdec", "none")


@dataclass(frozen=True)
class Run:
    """One generation: new tokens, wall seconds (prefill included), prefill
    seconds (None for transformers), target passes, drafts kept and checked
    (in all, and by draft position: kept_at[i] / checked_at[i] is
    P(draft i + 1 kept | checked))."""

    workload: str
    temperature: float
    drafter: str
    method: Method
    prompt: int
    tokens: int
    seconds: float
    prefill: float | None
    passes: int
    kept: int
    checked: int
    kept_at: tuple[int, ...] = ()
    checked_at: tuple[int, ...] = ()

    @classmethod
    def of(
        cls, out: GenerationResult, workload: str, drafter: str, method: Method, prompt: int
    ) -> Run:
        """The numbers of one `generate` result."""
        return cls(
            workload,
            out.temperature,
            drafter,
            method,
            prompt,
            out.new_tokens,
            out.time_total,
            out.time_prefill,
            out.rounds,
            sum(out.accepted),
            sum(out.reached),
            tuple(out.accepted),
            tuple(out.reached),
        )


def _add(rows: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """Element-wise sum of tuples of different lengths."""
    width = max((len(r) for r in rows), default=0)
    return tuple(sum(r[i] for r in rows if i < len(r)) for i in range(width))


@dataclass(frozen=True)
class Totals:
    """Runs of one (workload, temperature, drafter, method) summed over prompts."""

    workload: str
    temperature: float
    drafter: str
    method: Method
    tokens: int
    seconds: float
    prefill: float | None
    passes: int
    kept: int
    checked: int
    kept_at: tuple[int, ...] = ()
    checked_at: tuple[int, ...] = ()

    @classmethod
    def of(cls, runs: Sequence[Run]) -> Totals:
        first = runs[0]
        prefill = (
            None if any(r.prefill is None for r in runs) else sum(r.prefill or 0.0 for r in runs)
        )
        return cls(
            first.workload,
            first.temperature,
            first.drafter,
            first.method,
            sum(r.tokens for r in runs),
            sum(r.seconds for r in runs),
            prefill,
            sum(r.passes for r in runs),
            sum(r.kept for r in runs),
            sum(r.checked for r in runs),
            _add([r.kept_at for r in runs]),
            _add([r.checked_at for r in runs]),
        )

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
        return [
            k / c if c else float("nan") for k, c in zip(self.kept_at, self.checked_at, strict=True)
        ]

    def speedup_vs(self, baseline: Totals) -> float:
        """tokens/s over the baseline's tokens/s."""
        return self.tokens_per_second / baseline.tokens_per_second

    def decode_speedup_vs(self, baseline: Totals) -> float | None:
        """The same with each side's prefill time removed (None without prefill times)."""
        if self.prefill is None or baseline.prefill is None:
            return None
        mine = self.tokens / (self.seconds - self.prefill)
        return mine / (baseline.tokens / (baseline.seconds - baseline.prefill))


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


def _policy(method: Method, costs: Costs, spec: str, drafter: Any, k_max: int) -> int | KPolicy:
    if method.policy == "adaptive-pooled":
        return AdaptiveK(costs.cost_ratio[spec], costs.verify_cost, k_max=k_max)
    if method.policy == "adaptive":
        parts = getattr(drafter, "parts", None)
        if parts:  # one cost model per source, each with its own c
            return BySource(
                {
                    name: AdaptiveK(
                        costs.cost_ratio[f"{spec}/{name}"], costs.verify_cost, k_max=k_max
                    )
                    for name in parts
                }
            )
        return AdaptiveK(costs.cost_ratio[spec], costs.verify_cost, k_max=k_max)
    if method.policy == "heuristic":
        return HeuristicK()
    return method.k or 1


def run_once(
    target: PreTrainedModel,
    drafter: Any,
    spec: str,
    method: Method,
    ids: Any,
    config: SamplingConfig,
    *,
    max_new_tokens: int,
    seed: int,
    costs: Costs,
    k_max: int,
    eos: list[int],
) -> tuple[Run, list[int]]:
    """One generation with `method`; (the run's numbers, its tokens)."""
    if method.engine == "transformers":
        r = hf_generate(
            target,
            ids,
            max_new_tokens=max_new_tokens,
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
            "", config.temperature, spec, method, 0, r.new_tokens, r.time_total, None, passes, 0, 0
        )
        return run, r.tokens
    tree: int | AdaptiveTree | None = method.k if method.policy == "tree" else None
    if method.policy == "adaptive-tree":
        sizes = [b for b in (2, 4, 6, 8, 12, 16) if b <= (method.k or 8)]
        usable = [b for b in sizes if b + 1 <= len(costs.verify_cost)] or [1]
        tree = AdaptiveTree(costs.cost_ratio[spec], costs.verify_cost, budgets=usable)
    out = generate(
        target,
        drafter,
        ids,
        max_new_tokens=max_new_tokens,
        k=1 if tree else _policy(method, costs, spec, drafter, k_max),
        temperature=config.temperature,
        seed=seed,
        tree=tree,
    )
    return Run.of(out, "", spec, method, 0), out.tokens


# "adaptive-pooled": one cost model for every source of a drafter made of parts
# (the ablation of "adaptive", which keeps one per source); run only for such drafters.
POLICIES = ("adaptive", "heuristic", "adaptive-pooled")
DEFAULT_POLICIES = ("adaptive", "heuristic")


def bench_methods(
    built: dict[str, Any],
    costs: Costs,
    k_max: int,
    transformers: bool,
    transformers_ks: Sequence[int],
    ks: Sequence[int] | None = None,
    policies: Sequence[str] = DEFAULT_POLICIES,
    trees: Sequence[int] = (),
) -> list[tuple[str, Method]]:
    """(drafter spec, method) pairs of a job, target-only first. Fixed γ:
    `ks`, or `ks_for` the drafter's cost; then each of `policies`; then a
    tree of each size in `trees` for drafters that draft trees."""
    jobs = [("none", TARGET_ONLY)]
    if transformers:
        jobs.append(("none", Method("transformers", "none")))
    for spec, drafter in built.items():
        c = costs.cost_ratio[spec]
        fixed = ks_for(c, k_max) if ks is None else [k for k in ks if k <= k_max]
        jobs += [(spec, Method("specdec", "fixed", k)) for k in fixed]
        jobs += [
            (spec, Method("specdec", p))
            for p in policies
            if p != "adaptive-pooled" or getattr(drafter, "parts", None)
        ]
        if callable(getattr(drafter, "propose_tree", None)) and trees:
            jobs += [(spec, Method("specdec", "tree", n)) for n in trees]
            jobs.append((spec, Method("specdec", "adaptive-tree", max(trees))))
        if transformers and strategy(drafter) is not None:
            jobs.append((spec, Method("transformers", "default")))
            jobs += [(spec, Method("transformers", "fixed", k)) for k in transformers_ks]
    return jobs


def run_bench(
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    drafter_specs: Sequence[str] = DEFAULT_DRAFTERS,
    workloads: Sequence[str] = workloads_mod.WORKLOADS,
    temperatures: Sequence[float] = (0.0, 0.7),
    prompts: int = 3,
    max_new_tokens: int = 96,
    k_max: int = 8,
    seed: int = 0,
    repeats: int = 100,
    transformers: bool = True,
    transformers_ks: Sequence[int] = (),
    ks: Sequence[int] | None = None,
    policies: Sequence[str] = DEFAULT_POLICIES,
    trees: Sequence[int] = (),
    progress: Progress = no_progress,
) -> BenchReport:
    """Real generation per drafter and method, with the forecast for the same
    prompts (teacher forcing over the target-only runs' own answers). Fixed γ
    values: `ks` (default: chosen by each drafter's cost); γ policies:
    `policies` (a subset of "adaptive", "heuristic", "adaptive-pooled"); tree sizes: `trees`
    (nodes per round, for drafters that draft trees)."""
    specs = check_drafter_specs(drafter_specs)
    configs = [SamplingConfig(t) for t in temperatures]
    workloads = workloads_mod.check_names(workloads)
    prompt_sets = {w: workloads_mod.prompt_set(tokenizer, w, prompts) for w in workloads}
    max_new_tokens = _checks.integer(
        max_new_tokens, "max_new_tokens", minimum=1, maximum=MAX_NEW_TOKENS
    )
    k_max = _checks.integer(k_max, "k_max", minimum=1, maximum=64)
    ks_hf = [
        _checks.integer(k, "transformers_ks", minimum=1, maximum=MAX_K) for k in transformers_ks
    ]
    fixed = None if ks is None else [_checks.integer(k, "ks", minimum=1, maximum=MAX_K) for k in ks]
    policies = [_checks.choice(p, "policies", POLICIES) for p in policies]
    trees = [_checks.integer(n, "trees", minimum=1, maximum=256) for n in trees]
    seed = _checks.seed(seed)
    built = {spec: drafters.from_spec(spec, target, tokenizer) for spec in specs}
    costs = measure_job_costs(target, tokenizer, built, k_max, repeats, workloads[0])
    jobs = bench_methods(built, costs, k_max, transformers, ks_hf, fixed, policies, trees)
    built["none"] = None
    eos = sorted(eos_set(None, target))
    runs: list[Run] = []
    answers: Answers = {}
    for workload in workloads:
        for config in configs:
            ids_list = prompt_sets[workload]
            advance = progress(
                f"bench {workload} T={config.temperature:g}", len(ids_list) * len(jobs)
            )
            for i, ids in enumerate(ids_list):
                for spec, method in jobs:
                    run, tokens = run_once(
                        target,
                        built[spec],
                        spec,
                        method,
                        ids,
                        config,
                        max_new_tokens=max_new_tokens,
                        seed=seed + i,
                        costs=costs,
                        k_max=k_max,
                        eos=eos,
                    )
                    runs.append(_placed(run, workload, i))
                    if method == TARGET_ONLY:
                        answers[(workload, config.temperature, i)] = tokens
                    advance()
    predictions = predict(
        target,
        tokenizer,
        drafter_specs=specs,
        workloads=workloads,
        temperatures=[c.temperature for c in configs],
        prompts=prompts,
        max_new_tokens=max_new_tokens,
        k_max=k_max,
        seed=seed,
        costs=costs,
        answers=answers,
        progress=progress,
    )
    rows = totals_rows(runs, predictions)
    return BenchReport(costs, rows, runs, predictions, prompts, max_new_tokens, seed)


def _placed(run: Run, workload: str, prompt: int) -> Run:
    from dataclasses import replace

    return replace(run, workload=workload, prompt=prompt)


# ---- the demo ---------------------------------------------------------------------------

DEMO_DRAFTERS = (
    ("none", 1),
    ("prompt-lookup", 8),
    ("eagle", 3),
    ("medusa", 3),
    ("hybrid", 4),
    ("early-exit:24", 2),
    ("truncated:24", 2),
)


@dataclass(frozen=True)
class DemoReport:
    """Each drafter over the same interleaved chat and code prompts."""

    temperature: float
    prompts: int
    max_new_tokens: int
    rows: list[BenchRow]
    skipped: list[str] = field(
        default_factory=list
    )  # default drafters this target cannot use, and why


def demo(
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    drafter_ks: Sequence[tuple[str, int]] = DEMO_DRAFTERS,
    prompts: int = 4,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    seed: int = 0,
    progress: Progress = no_progress,
) -> DemoReport:
    """Target-only and each (drafter, k) on `prompts` built-in prompts
    (alternately chat and code editing), each drafter with its default γ
    policy (`policy.measured_policy`, at most k drafts a round: speculation
    that does not pay switches itself off); speedups against target-only. With
    the default list, drafters that cannot serve this target (e.g. heads
    trained for another model) are left out and listed in `skipped`."""
    if all(spec != "none" for spec, _ in drafter_ks):
        drafter_ks = [("none", 1), *drafter_ks]  # the baseline every speedup is against
    code, chat = workloads_mod.prompts("code"), workloads_mod.prompts("chat")
    interleaved = [m for pair in zip(chat, code, strict=False) for m in pair]
    count = _checks.integer(prompts, "prompts", minimum=1, maximum=len(interleaved))
    config = SamplingConfig(temperature)
    max_new_tokens = _checks.integer(
        max_new_tokens, "max_new_tokens", minimum=1, maximum=MAX_NEW_TOKENS
    )
    seed = _checks.seed(seed)
    built, skipped = {}, []
    for spec, _ in drafter_ks:
        try:
            built[spec] = drafters.from_spec(spec, target, tokenizer)
        except ValueError as e:
            if drafter_ks is not DEMO_DRAFTERS:
                raise
            skipped.append(f"{spec}: {e}")
    drafter_ks = [(spec, k) for spec, k in drafter_ks if spec in built]
    encoded = [workloads_mod.encode(tokenizer, m) for m in interleaved[:count]]
    advance = progress("demo", len(encoded) * len(drafter_ks))
    runs = []
    # prompt by prompt, every drafter on it in turn: a host whose speed
    # drifts (shared cores, frequency) shifts every method alike
    for i, ids in enumerate(encoded):
        for spec, k in drafter_ks:
            method = TARGET_ONLY if spec == "none" else Method("specdec", "measured", k)
            out = generate(
                target,
                built[spec],
                ids,
                max_new_tokens=max_new_tokens,
                k=1 if spec == "none" else measured_policy(built[spec], k),
                temperature=config.temperature,
                seed=seed + i,
            )
            runs.append(Run.of(out, "demo", spec, method, i))
            advance()
    return DemoReport(config.temperature, count, max_new_tokens, totals_rows(runs), skipped)
