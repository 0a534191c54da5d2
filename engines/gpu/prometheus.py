"""GPU gauges for /metrics (Prometheus text format), from the sampler's latest snapshot.

Every series carries ``gpu`` (NVML index), ``uuid`` and ``simulated`` labels.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from engines.core.metrics import Labels, fmt_labels, fmt_number
from engines.events.gpu import EngineEnergy, GPUSnapshot, GPUState
from engines.gpu.sampler import Sampler

_GAUGES: tuple[tuple[str, str, str, float], ...] = (
    # (metric, help, snapshot field, scale)
    ("traylm_gpu_temperature_celsius", "GPU temperature.", "temperature_c", 1.0),
    ("traylm_gpu_power_watts", "GPU power draw (NVML 1 s average).", "power_draw_mw", 1e-3),
    ("traylm_gpu_power_limit_watts", "Enforced GPU power limit.", "power_limit_mw", 1e-3),
    ("traylm_gpu_utilization_ratio", "GPU utilization (0-1).", "utilization_gpu_pct", 1e-2),
    ("traylm_gpu_memory_used_bytes", "GPU memory in use.", "memory_used_bytes", 1.0),
    ("traylm_gpu_memory_total_bytes", "GPU memory size.", "memory_total_bytes", 1.0),
    ("traylm_gpu_sm_clock_hertz", "SM clock.", "sm_clock_mhz", 1e6),
)


def gpu_exposition(sampler: Sampler, energy: Mapping[str, EngineEnergy]) -> Iterator[str]:
    snaps = sampler.latest
    simulated = "true" if sampler.backend.simulated else "false"

    def base(s: GPUSnapshot) -> Labels:
        return (("gpu", str(s.index)), ("simulated", simulated), ("uuid", s.uuid))

    yield "# HELP traylm_gpu_up 1 while the GPU answers, 0 when it is lost."
    yield "# TYPE traylm_gpu_up gauge"
    for s in snaps:
        yield f"traylm_gpu_up{fmt_labels(base(s))} {1 if s.state == GPUState.OK else 0}"
    for metric, help_text, name, scale in _GAUGES:
        yield from _gauge(metric, help_text, ((base(s), getattr(s, name), scale) for s in snaps))
    yield from _gauge(
        "traylm_gpu_fan_speed_ratio",
        "Fan speed as NVML reports it (0-1, may exceed 1).",
        (((*base(s), ("fan", str(f.index))), f.speed_pct, 1e-2) for s in snaps for f in s.fans),
    )
    yield "# HELP traylm_gpu_energy_joules_total Energy used since the driver loaded."
    yield "# TYPE traylm_gpu_energy_joules_total counter"
    for s in snaps:
        if s.energy_mj is not None:
            joules = fmt_number(s.energy_mj / 1000)
            yield f"traylm_gpu_energy_joules_total{fmt_labels(base(s))} {joules}"
    yield from _gauge(
        "traylm_engine_joules_per_token",
        "Energy per generated token over the last window.",
        (
            ((("engine", e.engine_id), ("simulated", simulated)), e.joules_per_token, 1.0)
            for e in energy.values()
        ),
    )
    yield "# HELP traylm_gpu_sample_seconds Mean cost of one sample of all GPUs."
    yield "# TYPE traylm_gpu_sample_seconds gauge"
    labels = fmt_labels((("simulated", simulated),))
    yield f"traylm_gpu_sample_seconds{labels} {fmt_number(sampler.mean_cost_s)}"


def _gauge(
    metric: str, help_text: str, values: Iterable[tuple[Labels, float | int | None, float]]
) -> Iterator[str]:
    yield f"# HELP {metric} {help_text}"
    yield f"# TYPE {metric} gauge"
    for labels, value, scale in values:
        if value is not None:
            yield f"{metric}{fmt_labels(labels)} {fmt_number(value * scale)}"
