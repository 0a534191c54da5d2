"""The gateway's own metrics (requests, errors, TTFT, latency, tokens) on the daemon's registry
(engines/core/metrics.py)."""

from __future__ import annotations

from engines.core.metrics import MetricsRegistry


class GatewayMetrics:
    """The gateway's own metrics (names prefixed traylm_)."""

    def __init__(self, registry: MetricsRegistry) -> None:
        self.requests = registry.counter(
            "traylm_requests_total", "Requests handled, by route, model and status."
        )
        self.errors = registry.counter("traylm_errors_total", "Error responses, by status.")
        self.ttft = registry.histogram(
            "traylm_time_to_first_token_seconds", "First upstream byte of a streamed reply."
        )
        self.latency = registry.histogram(
            "traylm_request_duration_seconds", "Whole request, gateway in to last byte out."
        )
        self.tokens_in = registry.counter("traylm_prompt_tokens_total", "Prompt tokens (usage).")
        self.tokens_out = registry.counter(
            "traylm_generation_tokens_total",
            "Generated tokens (usage when the engine reports it, else streamed content chunks).",
        )
