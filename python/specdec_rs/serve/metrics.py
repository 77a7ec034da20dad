"""`/metrics`: Prometheus series of the server (prometheus_client, one
registry per server). p = target, q = draft, k = γ.

The series vLLM also has carry vLLM's names, so its dashboards read this
server unchanged: `vllm:num_requests_running`, `vllm:num_requests_waiting`,
`vllm:prompt_tokens_total`, `vllm:generation_tokens_total`,
`vllm:request_success_total{finished_reason}`,
`vllm:spec_decode_num_drafts_total` (rounds that proposed drafts),
`vllm:spec_decode_num_draft_tokens_total`,
`vllm:spec_decode_num_accepted_tokens_total`,
`vllm:spec_decode_num_accepted_tokens_per_pos_total{position}` (rounds that
kept draft `position`, 0-based), and the latency histograms
`vllm:time_to_first_token_seconds`, `vllm:time_per_output_token_seconds`,
`vllm:e2e_request_latency_seconds`; every series has the label
`model_name`; with a prefix cache, `vllm:prefix_cache_queries_total` and
`vllm:prefix_cache_hits_total` (prompt tokens looked up and found, counted
as each request ends, so they add up to the responses'
`usage.prompt_tokens_details.cached_tokens`). What vLLM lacks is under
`specdec:`: rounds by the γ they asked for
(`specdec:spec_decode_rounds_total{k}`), the mean acceptance length
1 + accepted / drafts (`specdec:spec_decode_mean_acceptance_length`), and
refused requests by reason (`specdec:requests_rejected_total{reason}`),
and, under the goodput policy, what it did: row rounds by the γ it chose
(`specdec:goodput_row_rounds_total{k}`, probes under their γ), its probes
(`specdec:goodput_probes_total`), the times it changed the rows' γ
(`specdec:goodput_switches_total`), and its last predicted and its
measured (decayed) tokens per second
(`specdec:goodput_predicted_tokens_per_second`,
`specdec:goodput_measured_tokens_per_second`).
A request's rounds are counted as its handler receives them, so the
counters add up to the `usage` of the responses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specdec_rs.policy.goodput import GoodputReport

LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0)


class ServerMetrics:
    """The series above; `running` and `waiting` are read at each scrape."""

    def __init__(
        self,
        model_name: str,
        running: Callable[[], int],
        waiting: Callable[[], int],
        policy: Callable[[], GoodputReport | None] | None = None,
    ):
        import prometheus_client
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]  # no *_created series (as vLLM)
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        self.model_name = model_name
        self.n_drafts = self.n_accepted = 0  # for the mean acceptance length
        self.n_finished = 0
        self.by_reason: dict[str, int] = {}  # finished requests by finish reason
        r = self.registry

        def gauge(name: str, doc: str, read: Callable[[], float]) -> None:
            Gauge(name, doc, labels, registry=r).labels(model_name).set_function(read)

        gauge("vllm:num_requests_running", "Requests decoding in the batch now", running)
        gauge("vllm:num_requests_waiting", "Requests queued for a batch row", waiting)

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, labels, registry=r).labels(model_name)

        def counter_by(name: str, doc: str, label: str) -> Any:
            return Counter(name, doc, [*labels, label], registry=r)

        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens prefilled")
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache"
        )
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache (not computed)"
        )
        self.generation_tokens = counter("vllm:generation_tokens", "Tokens generated (returned)")
        self.success = counter_by(
            "vllm:request_success",
            "Requests finished, by finish reason (stop, length, abort, error)",
            "finished_reason",
        )
        self.drafts = counter("vllm:spec_decode_num_drafts", "Rounds that proposed drafts")
        self.draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Draft tokens proposed")
        self.accepted = counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted")
        self.per_position = counter_by(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Rounds that accepted the draft at this position (0-based)",
            "position",
        )
        self.rounds_by_k = counter_by(
            "specdec:spec_decode_rounds",
            "Row rounds by the drafts they asked for (k = γ; 0: not speculating)",
            "k",
        )
        self.rejected = counter_by(
            "specdec:requests_rejected",
            "Requests refused (bad_request, queue_full, draining, not_found)",
            "reason",
        )
        gauge(
            "specdec:spec_decode_mean_acceptance_length",
            "1 + accepted draft tokens / rounds that proposed drafts",
            self.mean_acceptance_length,
        )

        def histogram(name: str, doc: str) -> Any:
            return Histogram(name, doc, labels, buckets=LATENCY_BUCKETS, registry=r).labels(
                model_name
            )

        if policy is not None:
            r.register(_PolicyCollector(model_name, policy))
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Time to first token")
        self.tpot = histogram("vllm:time_per_output_token_seconds", "Time per output token")
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Request latency, end to end")

    def mean_acceptance_length(self) -> float:
        return 1.0 + self.n_accepted / self.n_drafts if self.n_drafts else 0.0

    def round(self, asked: int, drafted: int, accepted: int) -> None:
        """One row round as its handler received it."""
        self.rounds_by_k.labels(self.model_name, str(asked)).inc()
        if drafted > 0:
            self.drafts.inc()
            self.draft_tokens.inc(drafted)
            self.accepted.inc(accepted)
            self.n_drafts += 1
            self.n_accepted += accepted
            for j in range(accepted):
                self.per_position.labels(self.model_name, str(j)).inc()

    def finished(
        self, reason: str, prompt: int, generated: int, ttft: float | None, total: float
    ) -> None:
        """A request's end: its finish reason, token counts and latencies."""
        self.success.labels(self.model_name, reason).inc()
        self.n_finished += 1
        self.by_reason[reason] = self.by_reason.get(reason, 0) + 1
        self.prompt_tokens.inc(prompt)
        self.generation_tokens.inc(generated)
        self.e2e.observe(total)
        if ttft is not None:
            self.ttft.observe(ttft)
            if generated > 1:
                self.tpot.observe((total - ttft) / (generated - 1))

    @property
    def n_answered(self) -> int:
        """Requests that ended whole (a stop, EOS or their budget)."""
        return self.by_reason.get("stop", 0) + self.by_reason.get("length", 0)

    def prefix(self, queried: int, hits: int) -> None:
        """A finished request's prefix-cache lookup (tokens)."""
        self.prefix_queries.inc(queried)
        self.prefix_hits.inc(hits)

    def reject(self, reason: str) -> None:
        self.rejected.labels(self.model_name, reason).inc()

    def text(self) -> bytes:
        from prometheus_client import generate_latest

        return bytes(generate_latest(self.registry))


class _PolicyCollector:
    """The goodput policy's series, read from its `report()` at each scrape."""

    def __init__(self, model_name: str, read: Callable[[], GoodputReport | None]):
        self.model_name, self.read = model_name, read

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        report = self.read()
        if report is None:
            return
        name = [self.model_name]
        rows = CounterMetricFamily(
            "specdec:goodput_row_rounds",
            "Row rounds by the γ the goodput policy gave them (probes included)",
            labels=["model_name", "k"],
        )
        for k, n in enumerate(report.rows_by_k):
            rows.add_metric([self.model_name, str(k)], n)
        yield rows
        for series, doc, value in (
            ("probes", "Row rounds the policy drafted to probe", report.probes),
            ("switches", "Rounds the policy changed the rows' γ", report.switches),
        ):
            counter = CounterMetricFamily(f"specdec:goodput_{series}", doc, labels=["model_name"])
            counter.add_metric(name, value)
            yield counter
        for series, doc, rate in (
            ("predicted", "The last round's predicted tokens per second", report.predicted),
            ("measured", "Tokens per second of the policy's rounds (decayed)", report.measured),
        ):
            gauge = GaugeMetricFamily(
                f"specdec:goodput_{series}_tokens_per_second", doc, labels=["model_name"]
            )
            gauge.add_metric(name, 0.0 if rate is None else rate)
            yield gauge
