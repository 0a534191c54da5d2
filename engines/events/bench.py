"""Benchmark configs, results and progress (engines/bench/, `traylm bench`, /api/bench).

Times are seconds in the data (milliseconds only where they are printed). Latency definitions
follow `vllm bench serve` (engines/bench/metrics.py): TTFT = first content chunk − request start;
E2EL = last content chunk − start; TPOT per request = (E2EL − TTFT) / (output tokens − 1), only
when output tokens > 1; ITL = every gap between consecutive content chunks, pooled. NVIDIA's
AIPerf calls vLLM's TPOT "ITL": a UI must say which one it shows (BenchRun.definitions).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import ClassVar

from engines.events.codec import Event


class BenchState(enum.StrEnum):
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"  # the daemon stopped while the run was going


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """What to run. One run measures each concurrency level in turn, with the same workload."""

    model: str
    url: str = ""  # OpenAI base URL of an engine (http://127.0.0.1:PORT/v1); "": the gateway
    workload: str = "random"  # "random" (fixed lengths, ignore_eos) | "chat" (varied prompts)
    # | "file": workload_file, a flight-recorder export (engines/bench/replay.py)
    workload_file: str = ""
    as_fast_as_possible: bool = False  # file: ignore the recorded pace
    input_len: int = 128  # prompt tokens per request (random)
    output_len: int = 128  # generated tokens per request (random); the max_tokens cap (chat)
    concurrency: tuple[int, ...] = (1,)  # most requests in flight, one level after the other
    requests: int = 0  # measured requests per level; 0: max(32, 4 × concurrency)
    warmup: int = 1  # requests sent before each level and left out of its figures
    rate_rps: float = 0.0  # Poisson arrivals at this mean rate; 0: all at once
    seed: int = 0
    name: str = ""
    request_timeout_s: float = 600.0
    made_by: str = ""  # "": the user; "tune": a tuner's measurement (lists may leave them out)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LatencyStats:
    """One latency list, in seconds. Percentiles use linear interpolation on the raw values
    (numpy's default); keys are the percentile as text ("50", "99", "99.9")."""

    count: int = 0
    mean_s: float | None = None
    std_s: float | None = None
    min_s: float | None = None
    max_s: float | None = None
    percentiles_s: Mapping[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchRequest:
    """One measured request (for charts). ``start_s`` is from the level's start."""

    start_s: float
    ttft_s: float | None = None
    e2el_s: float | None = None
    tpot_s: float | None = None
    input_tokens: int | None = None
    output_tokens: int = 0
    error: str = ""
    request_id: str = ""  # the gateway's x-request-id: the request in `traylm requests`


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPUBenchTelemetry:
    """One GPU over one level's measured window."""

    uuid: str
    index: int
    name: str = ""
    temperature_peak_c: float | None = None
    temperature_mean_c: float | None = None
    power_mean_w: float | None = None
    energy_j: float | None = None  # Δ NVML total-energy counter over the window
    memory_used_peak_bytes: int | None = None
    memory_used_mean_bytes: float | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchTelemetry:
    """GPU telemetry over one level's measured window, all GPUs the daemon sees summed (power,
    energy, memory) or at their worst (peak temperature). ``simulated``: numbers from
    `traylm serve --simulate-gpus N` or a replayed trace, not from hardware."""

    available: bool
    simulated: bool = False
    backend: str = ""
    detail: str = ""  # why there is none, or how a figure was obtained
    samples: int = 0
    window_s: float = 0.0
    temperature_peak_c: float | None = None
    temperature_mean_c: float | None = None  # mean over samples of the hottest GPU
    power_mean_w: float | None = None  # energy / window when the counter works
    energy_j: float | None = None
    joules_per_token: float | None = None  # energy_j / output tokens of the level
    energy_source: str = ""  # "counter" (NVML total energy) | "power" (readings × time) | ""
    memory_used_peak_bytes: int | None = None
    fan_speed_peak_pct: float | None = None  # the fastest fan of any GPU (NVML's intended %)
    gpus: tuple[GPUBenchTelemetry, ...] = ()
    ts_s: tuple[float, ...] = ()  # timeline: seconds from the level's start
    temperature_c: tuple[float | None, ...] = ()  # hottest GPU per sample
    power_w: tuple[float | None, ...] = ()  # summed per sample


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchLevel:
    """The figures of one concurrency level (warm-up excluded)."""

    concurrency: int
    rate_rps: float
    requests: int  # asked
    completed: int
    failed: int
    duration_s: float  # first measured request sent → last one finished
    input_tokens: int
    output_tokens: int
    input_tokens_source: str  # "usage" (the engine said) | "tokenize" | "approx" | "mixed"
    output_tokens_source: str  # "usage" | "chunks" (content chunks counted) | "mixed"
    request_throughput_rps: float
    output_throughput_tps: float
    total_throughput_tps: float  # (input + output tokens) / duration
    max_concurrency_seen: int
    ttft: LatencyStats
    tpot: LatencyStats
    itl: LatencyStats
    e2el: LatencyStats
    telemetry: BenchTelemetry
    errors: Mapping[str, int] = dataclasses.field(default_factory=dict)  # message → count
    requests_detail: tuple[BenchRequest, ...] = ()
    cancelled: bool = False  # cut short by a cancel: figures cover the finished requests


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchRun:
    """One stored benchmark run (GET /api/bench/runs/{id})."""

    id: int
    name: str
    created_s: float
    state: BenchState
    config: BenchConfig
    finished_s: float | None = None
    target: str = ""  # the OpenAI base URL the requests went to
    engine: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """engine_id, engine, version, device, profile of the engine serving the model, if known."""
    prompt_source: str = ""  # "tokenize" (exact lengths from the engine) | "approx" | "chat"
    definitions: str = ""  # which TTFT/TPOT/ITL definitions the figures use
    detail: str = ""  # the error of a failed run, or notes
    levels: tuple[BenchLevel, ...] = ()
    log_path: str = ""  # the run's log: each failed request with its reason, and the end


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchRunSummary:
    """A row of GET /api/bench/runs (newest first)."""

    id: int
    name: str
    created_s: float
    state: BenchState
    model: str
    workload: str
    input_len: int
    output_len: int
    concurrency: tuple[int, ...]
    target: str = ""
    engine: str = ""  # "vllm 0.32.0 (cpu)"
    finished_s: float | None = None
    best_output_throughput_tps: float | None = None
    best_concurrency: int | None = None
    joules_per_token: float | None = None  # at best_concurrency
    simulated: bool = False
    detail: str = ""
    made_by: str = ""  # "": the user's run; "tune": one of a tuner's measurements


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchProgress(Event):
    """A running benchmark: at each phase change and about twice a second while measuring."""

    kind: ClassVar[str] = "bench.progress"
    run_id: int
    phase: str  # "prepare" | "warmup" | "measure" | "telemetry"
    level_index: int  # 0-based
    levels_total: int
    concurrency: int
    completed: int = 0
    failed: int = 0
    total: int = 0
    elapsed_s: float = 0.0
    output_throughput_tps: float = 0.0  # so far in this level
    detail: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchFinished(Event):
    """A benchmark ended (done, failed, cancelled or interrupted); it is stored."""

    kind: ClassVar[str] = "bench.finished"
    summary: BenchRunSummary
