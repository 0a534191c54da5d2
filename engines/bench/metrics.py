"""Benchmark figures, defined as `vllm bench serve` (vLLM 0.32) defines them.

Per request (times from ``time.perf_counter``):
- TTFT = first streamed content chunk − request start;
- E2EL = last content chunk − request start;
- TPOT = (E2EL − TTFT) / (output tokens − 1), only for requests with more than one output token;
- ITL = every gap between consecutive content chunks, pooled over all requests.
Per level: request, output and total (input + output) throughput over the measured duration.
Percentiles interpolate linearly on the raw lists (numpy's default method), without numpy.

One difference from vLLM 0.32's client: a chunk counts only when it carries text (content or
reasoning); vLLM also starts its TTFT clock on the role-only first chunk.
"""

from __future__ import annotations

import collections
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from engines.events.bench import BenchLevel, BenchRequest, BenchTelemetry, LatencyStats

DEFINITIONS = (
    "vLLM `bench serve` definitions: TTFT = first content chunk − request start; "
    "E2EL = last content chunk − request start; TPOT = (E2EL − TTFT) / (output tokens − 1) per "
    "request with more than one output token; ITL = every gap between consecutive content "
    "chunks, pooled over requests. NVIDIA AIPerf calls this TPOT 'ITL'."
)
DEFAULT_PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0)
MAX_ERROR_KINDS = 10


@dataclass(frozen=True)
class RequestTiming:
    """What the load generator measured for one request (perf_counter seconds)."""

    start_s: float
    end_s: float
    chunk_times_s: tuple[float, ...] = ()  # arrival of each chunk that carried text
    usage_output_tokens: int | None = None  # usage.completion_tokens, when the engine sent it
    usage_input_tokens: int | None = None  # usage.prompt_tokens
    input_tokens: int | None = None  # the workload's own count (tokenize) or estimate
    input_source: str = "approx"  # "tokenize" | "approx"
    error: str = ""
    request_id: str = ""  # the gateway's x-request-id ("" when no answer came)

    @property
    def ok(self) -> bool:
        return not self.error and bool(self.chunk_times_s)

    @property
    def output_tokens(self) -> int:
        if self.usage_output_tokens is not None:
            return self.usage_output_tokens
        return len(self.chunk_times_s)

    @property
    def ttft_s(self) -> float | None:
        return self.chunk_times_s[0] - self.start_s if self.chunk_times_s else None

    @property
    def e2el_s(self) -> float | None:
        return self.chunk_times_s[-1] - self.start_s if self.chunk_times_s else None

    @property
    def tpot_s(self) -> float | None:
        ttft, e2el, out = self.ttft_s, self.e2el_s, self.output_tokens
        if ttft is None or e2el is None or out <= 1:
            return None
        return (e2el - ttft) / (out - 1)

    @property
    def itl_s(self) -> list[float]:
        times = self.chunk_times_s
        return [b - a for a, b in itertools.pairwise(times)]

    @property
    def measured_input_tokens(self) -> int | None:
        if self.usage_input_tokens is not None:
            return self.usage_input_tokens
        return self.input_tokens


def percentile(values: Sequence[float], pct: float) -> float:
    """numpy.percentile(values, pct) with the default 'linear' method."""
    if not values:
        raise ValueError("percentile of an empty list")
    if not 0.0 <= pct <= 100.0:
        raise ValueError(f"percentile {pct} is outside 0..100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (rank - low) * (ordered[high] - ordered[low])


def pct_key(pct: float) -> str:
    """The key of a percentile in LatencyStats.percentiles_s: "50", "99", "99.9"."""
    return f"{pct:g}"


def latency_stats(
    values: Sequence[float], percentiles: Iterable[float] = DEFAULT_PERCENTILES
) -> LatencyStats:
    """Mean, population standard deviation (numpy's default), min, max and percentiles."""
    if not values:
        return LatencyStats()
    mean = math.fsum(values) / len(values)
    variance = math.fsum((v - mean) ** 2 for v in values) / len(values)
    return LatencyStats(
        count=len(values),
        mean_s=mean,
        std_s=math.sqrt(variance),
        min_s=min(values),
        max_s=max(values),
        percentiles_s={pct_key(p): percentile(values, p) for p in percentiles},
    )


def _source(flags: Sequence[str]) -> str:
    kinds = set(flags)
    if not kinds:
        return ""
    return kinds.pop() if len(kinds) == 1 else "mixed"


def level_result(
    timings: Sequence[RequestTiming],
    *,
    concurrency: int,
    rate_rps: float,
    requests: int,
    level_start_s: float,
    duration_s: float,
    max_concurrency_seen: int,
    telemetry: BenchTelemetry,
    percentiles: Iterable[float] = DEFAULT_PERCENTILES,
    cancelled: bool = False,
) -> BenchLevel:
    """The figures of one level from its measured requests (warm-up already left out)."""
    pcts = tuple(percentiles)
    good = [t for t in timings if t.ok]
    ttfts = [t.ttft_s for t in good if t.ttft_s is not None]
    e2els = [t.e2el_s for t in good if t.e2el_s is not None]
    tpots = [t.tpot_s for t in good if t.tpot_s is not None]
    itls = [gap for t in good for gap in t.itl_s]
    out_tokens = sum(t.output_tokens for t in good)
    in_tokens = sum(t.measured_input_tokens or 0 for t in good)
    in_source = _source(
        ["usage" if t.usage_input_tokens is not None else t.input_source for t in good]
    )
    out_source = _source(["usage" if t.usage_output_tokens is not None else "chunks" for t in good])
    errors = collections.Counter(failure_reason(t)[:200] for t in timings if not t.ok)
    per_s = (lambda n: n / duration_s) if duration_s > 0 else (lambda n: 0.0)
    return BenchLevel(
        concurrency=concurrency,
        rate_rps=rate_rps,
        requests=requests,
        completed=len(good),
        failed=len(timings) - len(good),
        duration_s=duration_s,
        input_tokens=in_tokens,
        output_tokens=out_tokens,
        input_tokens_source=in_source,
        output_tokens_source=out_source,
        request_throughput_rps=per_s(len(good)),
        output_throughput_tps=per_s(out_tokens),
        total_throughput_tps=per_s(in_tokens + out_tokens),
        max_concurrency_seen=max_concurrency_seen,
        ttft=latency_stats(ttfts, pcts),
        tpot=latency_stats(tpots, pcts),
        itl=latency_stats(itls, pcts),
        e2el=latency_stats(e2els, pcts),
        telemetry=telemetry,
        errors=dict(errors.most_common(MAX_ERROR_KINDS)),
        requests_detail=tuple(_request_row(t, level_start_s) for t in timings),
        cancelled=cancelled,
    )


def _request_row(t: RequestTiming, level_start_s: float) -> BenchRequest:
    return BenchRequest(
        start_s=t.start_s - level_start_s,
        ttft_s=t.ttft_s,
        e2el_s=t.e2el_s,
        tpot_s=t.tpot_s,
        input_tokens=t.measured_input_tokens,
        output_tokens=t.output_tokens if t.ok else 0,
        error="" if t.ok else failure_reason(t),
        request_id=t.request_id,
    )


def failure_reason(t: RequestTiming) -> str:
    """Why a request that is not ``ok`` failed, in words."""
    return t.error or "the reply carried no text"
