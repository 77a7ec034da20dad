"""One measurement `Job`: its settings checked once, its drafters built once,
its costs measured once; `predict`, `run_bench` and `demo` take it.
p = target, q = draft, k = γ.

>>> from specdec_rs import models
>>> from specdec_rs.measure import Job
>>> target, tokenizer = models.load_smollm2()                  # doctest: +SKIP
>>> job = Job.build(target, tokenizer, drafter_specs=["prompt-lookup"], prompts=2)  # doctest: +SKIP
>>> predict(job); run_bench(job)                               # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specdec_rs import _checks, drafters
from specdec_rs.limits import MAX_NEW_TOKENS
from specdec_rs.measure.costs import Costs, measure_costs
from specdec_rs.processors import SamplingConfig
from specdec_rs.prompts import workloads as workloads_mod

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

# (description, total) -> advance(): how long jobs report progress (the CLI draws bars)
Progress = Callable[[str, int], Callable[[], None]]

DEFAULT_DRAFTERS = (
    "prompt-lookup",
    "suffix",
    "lookahead",
    "eagle",
    "medusa",
    "hybrid",
    "early-exit:24",
    "truncated:8",
)
MAX_K_MAX = 64  # the longest γ a job measures


def no_progress(description: str, total: int) -> Callable[[], None]:
    return lambda: None


def check_drafter_specs(specs: Sequence[str]) -> list[str]:
    """Drafter specs for measuring: well-formed, not 'none' (target-only is
    always measured as the baseline), at least one."""
    specs = list(specs)
    if not specs:
        raise ValueError("drafters: name at least one drafter")
    for spec in specs:
        if drafters.parse_spec(spec)[0].kind == "none":
            raise ValueError(
                "drafters: 'none' is target-only, which is always measured as the baseline; "
                "list only drafters"
            )
    return specs


@dataclass(frozen=True)
class Job:
    """What a measurement runs on: the target, the built drafters (spec ->
    drafter), the workloads' prompts, the temperatures, the budget, γ's upper
    bound, the seed, and the measured costs (None for a job built with
    measure=False, e.g. the demo's). `skipped`: drafters left out, and why."""

    target: Any = field(repr=False)
    tokenizer: Any = field(repr=False)
    drafters: dict[str, Any] = field(repr=False)
    workloads: tuple[str, ...]
    temperatures: tuple[float, ...]
    prompts: int
    prompt_sets: dict[str, list[torch.Tensor]] = field(repr=False)
    max_new_tokens: int
    k_max: int
    seed: int
    costs: Costs | None
    skipped: tuple[str, ...] = ()

    @classmethod
    def build(
        cls,
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
        measure: bool = True,
        skip_unusable: bool = False,
    ) -> Job:
        """Check every setting, build each drafter once and (with `measure`)
        measure the costs at the first workload's first prompt (`repeats`
        timed steps each). With `skip_unusable`, a drafter that cannot serve
        this target (e.g. a head trained for another model) is left out and
        listed in `skipped` instead of raising."""
        specs = check_drafter_specs(drafter_specs)
        names = tuple(workloads_mod.check_names(workloads))
        temps = tuple(SamplingConfig(t).temperature for t in temperatures)
        if not temps:
            raise ValueError("temperatures: give at least one, e.g. (0.0, 0.7)")
        prompt_sets = {w: workloads_mod.prompt_set(tokenizer, w, prompts) for w in names}
        max_new = _checks.integer(
            max_new_tokens, "max_new_tokens", minimum=1, maximum=MAX_NEW_TOKENS
        )
        k_max = _checks.integer(k_max, "k_max", minimum=1, maximum=MAX_K_MAX)
        seed = _checks.seed(seed)
        repeats = _checks.integer(repeats, "repeats", minimum=1)
        built, skipped = {}, []
        for spec in specs:
            try:
                built[spec] = drafters.from_spec(spec, target, tokenizer)
            except ValueError as e:
                if not skip_unusable:
                    raise
                skipped.append(f"{spec}: {e}")
        costs = None
        if measure:
            context = workloads_mod.encode(tokenizer, workloads_mod.prompts(names[0])[0])
            costs = measure_costs(target, context, built, k_max=k_max, repeats=repeats)
        return cls(
            target,
            tokenizer,
            built,
            names,
            temps,
            prompts,
            prompt_sets,
            max_new,
            k_max,
            seed,
            costs,
            tuple(skipped),
        )

    def measured_costs(self) -> Costs:
        """The costs (a ValueError for a job built without them)."""
        if self.costs is None:
            raise ValueError("this job was built with measure=False; build it with measure=True")
        return self.costs
