"""The figures the tuner keeps of one measurement (a bench run's one level, and the candidate's
cold start), and which way each is better."""

from __future__ import annotations

from dataclasses import dataclass

from engines.events.bench import BenchLevel

GIB = 1024**3


@dataclass(frozen=True)
class Figure:
    key: str
    label: str
    better: str  # "higher" | "lower"
    digits: int = 1


FIGURES: tuple[Figure, ...] = (
    Figure("output_tps", "out tok/s", "higher"),
    Figure("request_rps", "req/s", "higher", 2),
    Figure("ttft_p50_ms", "TTFT p50 ms", "lower"),
    Figure("ttft_p95_ms", "TTFT p95 ms", "lower"),
    Figure("tpot_p50_ms", "TPOT p50 ms", "lower", 2),
    Figure("vram_peak_gib", "VRAM GiB", "lower", 2),
    Figure("temperature_peak_c", "peak °C", "lower", 0),
    Figure("power_mean_w", "mean W", "lower"),
    Figure("joules_per_token", "J/token", "lower", 3),
    Figure("cold_start_s", "cold start s", "lower"),
    Figure("failed", "failed", "lower", 0),
)
BY_KEY = {f.key: f for f in FIGURES}


def figures_of(level: BenchLevel, cold_start_s: float | None) -> dict[str, float]:
    """The figures of one measured level; one that was not measured is left out."""
    t = level.telemetry
    values: dict[str, float | None] = {
        "output_tps": level.output_throughput_tps,
        "request_rps": level.request_throughput_rps,
        "ttft_p50_ms": _ms(level.ttft.percentiles_s.get("50")),
        "ttft_p95_ms": _ms(level.ttft.percentiles_s.get("95")),
        "tpot_p50_ms": _ms(level.tpot.percentiles_s.get("50")),
        "vram_peak_gib": t.memory_used_peak_bytes / GIB
        if t.memory_used_peak_bytes is not None
        else None,
        "temperature_peak_c": t.temperature_peak_c,
        "power_mean_w": t.power_mean_w,
        "joules_per_token": t.joules_per_token,
        "cold_start_s": cold_start_s,
        "failed": float(level.failed),
    }
    return {k: float(v) for k, v in values.items() if v is not None}


def _ms(value: float | None) -> float | None:
    return value * 1000 if value is not None else None
