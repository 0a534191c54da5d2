"""Energy per generated token, cost per million tokens, and the PSU headroom check.

J/token = Σ over the engine's GPUs of Δ NVML total energy (mJ) / 1000, divided by the engine's
Δ generated-token counter (each engine's own name: ``GENERATION_COUNTER``), over a window of at
least 5 s. The 1-second-average power reading is never integrated. Counter resets (driver
reload, engine restart) start a new window.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from engines.events.gpu import EngineEnergy, GPUSnapshot, PSUStatus
from engines.runtime.liveness import GENERATION_COUNTER

MIN_WINDOW_S = 5.0
JOULES_PER_KWH = 3.6e6
_VALUE_RE = r"(?:\{[^}]*\})?\s+([0-9.eE+-]+)(?:\s+\d+)?\s*$"


@dataclass(frozen=True)
class EnergyPoint:
    ts_s: float
    energy_mj: float  # summed over the engine's GPUs
    tokens: float  # the engine's generated-token counter


class EnergyWindow:
    """A sliding window of points for one engine."""

    def __init__(self, window_s: float) -> None:
        self.window_s = max(MIN_WINDOW_S, window_s)
        self._points: collections.deque[EnergyPoint] = collections.deque()

    def add(self, point: EnergyPoint) -> None:
        last = self._points[-1] if self._points else None
        if last is not None and (
            point.energy_mj < last.energy_mj
            or point.tokens < last.tokens
            or point.ts_s <= last.ts_s
        ):
            self._points.clear()  # a counter went backwards: driver reload or engine restart
        self._points.append(point)
        while len(self._points) > 2 and point.ts_s - self._points[1].ts_s >= self.window_s:
            self._points.popleft()

    def span(self) -> tuple[EnergyPoint, EnergyPoint] | None:
        """(oldest, newest) once they are at least ``window_s`` apart."""
        if len(self._points) < 2:
            return None
        first, last = self._points[0], self._points[-1]
        if last.ts_s - first.ts_s < self.window_s:
            return None
        return first, last


def energy_per_token(
    engine_id: str,
    first: EnergyPoint,
    last: EnergyPoint,
    *,
    gpus: Sequence[str],
    price_per_kwh: float,
    currency: str,
    simulated: bool,
) -> EngineEnergy:
    window_s = last.ts_s - first.ts_s
    energy_j = (last.energy_mj - first.energy_mj) / 1000.0
    tokens = round(last.tokens - first.tokens)
    jpt = energy_j / tokens if tokens > 0 else None
    return EngineEnergy(
        engine_id=engine_id,
        gpus=tuple(gpus),
        window_s=window_s,
        energy_j=energy_j,
        tokens=tokens,
        power_w=energy_j / window_s if window_s > 0 else 0.0,
        joules_per_token=jpt,
        cost_per_mtok=cost_per_million_tokens(jpt, price_per_kwh) if jpt is not None else None,
        currency=currency,
        simulated=simulated,
    )


def cost_per_million_tokens(joules_per_token: float, price_per_kwh: float) -> float:
    return joules_per_token * 1e6 / JOULES_PER_KWH * price_per_kwh


def parse_generation_tokens(metrics_text: str, engine: str = "vllm") -> float | None:
    """Sum of the engine's generated-token counter (``GENERATION_COUNTER``: vLLM's
    ``vllm:generation_tokens_total``, SGLang's and TensorRT-LLM's own) over its label sets;
    None when absent or the engine has none."""
    name = GENERATION_COUNTER.get(engine)
    if name is None:
        return None
    pattern = re.compile(r"^" + re.escape(name) + _VALUE_RE, re.M)
    values = [float(m.group(1)) for m in pattern.finditer(metrics_text)]
    return sum(values) if values else None


def energy_now_mj(
    snapshots: Iterable[GPUSnapshot], uuids: Iterable[str], at_s: float
) -> float | None:
    """Σ energy counters of ``uuids``, each carried forward to ``at_s`` with its power reading
    (at most one sample period of extrapolation, so the token and energy windows line up)."""
    wanted = set(uuids)
    total = 0.0
    found = 0
    for snap in snapshots:
        if snap.uuid not in wanted:
            continue
        if snap.energy_mj is None:
            return None
        extra_s = min(max(0.0, at_s - snap.ts_s), 2.0)
        total += snap.energy_mj + (snap.power_draw_mw or 0) * extra_s
        found += 1
    return total if found == len(wanted) and found else None


def psu_status(
    snapshots: Sequence[GPUSnapshot], *, psu_watts: float, other_watts: float, warn_fraction: float
) -> PSUStatus:
    gpu_w = sum((s.power_draw_mw or 0) for s in snapshots) / 1000
    limits_w = sum((s.power_limit_mw or 0) for s in snapshots) / 1000
    load = (gpu_w + other_watts) / psu_watts
    warning = ""
    if load > warn_fraction:
        warning = (
            f"the GPUs draw {gpu_w:.0f} W; with ~{other_watts:.0f} W for the rest that is "
            f"{load:.0%} of the {psu_watts:.0f} W power supply. Lower the power limits "
            "(`traylm power set efficient`) to keep headroom"
        )
    elif limits_w + other_watts > psu_watts:
        warning = (
            f"at their power limits the GPUs may draw {limits_w:.0f} W; with ~{other_watts:.0f} W "
            f"for the rest that exceeds the {psu_watts:.0f} W power supply under full load. "
            "Lower the limits (`traylm power set balanced`)"
        )
    return PSUStatus(
        psu_watts=psu_watts,
        gpu_power_w=gpu_w,
        other_watts=other_watts,
        load_fraction=load,
        limits_w=limits_w,
        warning=warning,
    )
