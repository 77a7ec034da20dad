"""Measurement as a library: costs, teacher-forced acceptance, predictions,
benchmarks and the demo. A `Job` (checked once: drafters built, costs
measured) goes to `predict`, `run_bench` and `demo`, which return
dataclasses; the CLI and `benchmarks/` only call these and print.
p = target, q = draft, k = γ."""

from specdec_rs.measure.acceptance import (
    Acceptance,
    acceptance_matrix,
    replay,
    summarize,
    teacher_force,
)
from specdec_rs.measure.bench import BenchReport, BenchRow, Counts, Run, Totals, run_bench
from specdec_rs.measure.costs import (
    Costs,
    decode_step_time,
    drafter_step_time,
    measure_costs,
    verify_cost_curve,
)
from specdec_rs.measure.demo import DemoReport, demo, demo_job
from specdec_rs.measure.job import Job
from specdec_rs.measure.methods import Method, Policy
from specdec_rs.measure.predict import Forecast, PredictReport, forecast, predict

__all__ = [
    "Acceptance",
    "BenchReport",
    "BenchRow",
    "Costs",
    "Counts",
    "DemoReport",
    "Forecast",
    "Job",
    "Method",
    "Policy",
    "PredictReport",
    "Run",
    "Totals",
    "acceptance_matrix",
    "decode_step_time",
    "demo",
    "demo_job",
    "drafter_step_time",
    "forecast",
    "measure_costs",
    "predict",
    "replay",
    "run_bench",
    "summarize",
    "teacher_force",
    "verify_cost_curve",
]
