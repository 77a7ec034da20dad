"""`specdec demo`: target-only and each drafter on the same built-in prompts,
alternately chat and code editing, each with its default γ policy.
p = target, q = draft, k = γ.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from specdec_rs import _checks
from specdec_rs.generation import generate
from specdec_rs.measure.bench import BenchRow, Run, totals_rows
from specdec_rs.measure.job import Job, Progress, no_progress
from specdec_rs.measure.methods import TARGET_ONLY, Method, Policy
from specdec_rs.prompts import workloads as workloads_mod

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


# the demo's drafters and the most drafts each may ask for in a round
DEMO_KS = {
    "prompt-lookup": 8,
    "suffix": 8,
    "lookahead": 1,  # its default n-grams are bigrams: one draft a round
    "eagle": 3,
    "medusa": 3,
    "hybrid": 4,
    "early-exit:24": 2,
    "truncated:24": 2,
}


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


def demo_job(
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    drafter_specs: Sequence[str] = tuple(DEMO_KS),
    prompts: int = 4,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    seed: int = 0,
) -> Job:
    """The demo's job: the drafters (those that cannot serve this target, e.g.
    heads trained for another model, left out when the list is the default
    one), both workloads, one temperature, no cost measurement (each drafter
    runs its measured default policy)."""
    most = min(len(workloads_mod.prompts(w)) for w in workloads_mod.WORKLOADS)
    count = _checks.integer(prompts, "prompts", minimum=1, maximum=2 * most)
    return Job.build(
        target,
        tokenizer,
        drafter_specs=drafter_specs,
        workloads=("chat", "code"),
        temperatures=(temperature,),
        prompts=(count + 1) // 2,
        max_new_tokens=max_new_tokens,
        seed=seed,
        measure=False,
        skip_unusable=tuple(drafter_specs) == tuple(DEMO_KS),
    )


def demo(
    job: Job,
    *,
    prompts: int | None = None,
    ks: Mapping[str, int] = DEMO_KS,
    progress: Progress = no_progress,
) -> DemoReport:
    """Target-only and each drafter of `job` on the first `prompts` of its
    prompts taken alternately from chat and code editing (default: all
    2 · job.prompts), each drafter with its default γ policy
    (`policy.measured_policy`, at most ks[spec] drafts a round, default 4:
    speculation that does not pay switches itself off); speedups against
    target-only, after one untimed target-only warm-up generation."""
    chat, code = job.prompt_sets.get("chat", []), job.prompt_sets.get("code", [])
    interleaved = [m for pair in zip(chat, code, strict=False) for m in pair]
    count = len(interleaved) if prompts is None else prompts
    encoded = interleaved[: _checks.integer(count, "prompts", minimum=1, maximum=len(interleaved))]
    temperature = job.temperatures[0]
    specs = ["none", *job.drafters]
    advance = progress("demo", len(encoded) * len(specs))
    runs = []
    # one untimed target-only generation first: the process's first forward
    # builds the target's native stack and touches its weights, a cost that
    # would otherwise land on the first timed run (target-only's), making
    # every drafter look faster (the drafters' own first calls stay timed)
    generate(
        job.target,
        None,
        encoded[0],
        max_new_tokens=min(8, job.max_new_tokens),
        temperature=temperature,
        seed=job.seed,
    )
    # prompt by prompt, every drafter on it in turn: a host whose speed
    # drifts (shared cores, frequency) shifts every method alike
    for i, ids in enumerate(encoded):
        for spec in specs:
            method = (
                TARGET_ONLY
                if spec == "none"
                else Method("specdec", Policy.MEASURED, ks.get(spec, 4))
            )
            out = generate(
                job.target,
                job.drafters.get(spec),
                ids,
                max_new_tokens=job.max_new_tokens,
                k=method.k_policy(None, spec, job.drafters.get(spec), job.k_max),
                temperature=temperature,
                seed=job.seed + i,
            )
            runs.append(Run.of(out, "demo", spec, method, i))
            advance()
    rows = totals_rows(runs)
    return DemoReport(temperature, len(encoded), job.max_new_tokens, rows, list(job.skipped))
