"""GPU telemetry alongside a benchmark, read from the daemon (``GET /api/gpus`` for the GPUs and
the latest sample, then the ``gpu.sample`` events) through any object shaped like
engines.client.DaemonClient.

Energy over a window is the NVML total-energy counter (mJ) read at the window's two ends, each
interpolated between the samples around it (or carried at most a couple of sample periods with
that sample's power when the window ends past the last sample), summed over every GPU the daemon
sees, then divided by the level's output tokens. Mean power is that energy over the window; the
1-second power readings are only a fallback when a GPU has no energy counter (labelled). Peak
temperature and peak fan speed are the hottest GPU's and the fastest fan's in the window.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from engines.errors import TraylmError
from engines.events.bench import BenchTelemetry, GPUBenchTelemetry
from engines.events.codec import Event
from engines.events.gpu import GPUInfo, GPUOverview, GPUSampled, GPUSnapshot, GPUState

log = logging.getLogger(__name__)
MIN_EXTRAPOLATE_S = 2.0


class TelemetrySource(Protocol):
    async def gpus(self) -> GPUOverview: ...

    def events(self, kinds: Iterable[str] | None = None) -> AsyncIterator[Event]: ...


@dataclass(frozen=True)
class Sample:
    ts_s: float
    gpus: tuple[GPUSnapshot, ...]


class TelemetryRecorder:
    """Collects samples from ``start`` to ``stop``; ``window`` summarises a slice of them."""

    def __init__(self, source: TelemetrySource | None) -> None:
        self._source = source
        self.samples: list[Sample] = []
        self.infos: tuple[GPUInfo, ...] = ()
        self.simulated = False
        self.backend = ""
        self.interval_s = 1.0
        self.problem = "" if source is not None else "no connection to the daemon's telemetry"
        self._arrived = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def available(self) -> bool:
        return not self.problem

    async def start(self) -> None:
        if self._source is None:
            return
        try:
            overview = await self._source.gpus()
        except TraylmError as exc:
            self.problem = f"GPU telemetry unavailable: {exc.message}"
            return
        self.simulated, self.backend = overview.simulated, overview.backend
        self.interval_s = overview.sample_interval_s
        self.infos = tuple(e.info for e in overview.gpus)
        if overview.state != GPUState.OK or not overview.gpus:
            self.problem = f"GPU telemetry unavailable: {overview.message or 'no GPU'}"
            return
        latest = tuple(e.snapshot for e in overview.gpus if e.snapshot is not None)
        if latest:
            self._add(latest)
        self._task = asyncio.create_task(self._follow(self._source), name="bench telemetry")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _follow(self, source: TelemetrySource) -> None:
        try:
            async for event in source.events(kinds=("gpu.sample",)):
                if isinstance(event, GPUSampled) and event.gpus:
                    self._add(event.gpus)
        except TraylmError as exc:
            log.warning("telemetry stream ended: %s", exc.message)

    def _add(self, snaps: tuple[GPUSnapshot, ...]) -> None:
        ts = min(s.ts_s for s in snaps)
        if self.samples and ts <= self.samples[-1].ts_s:
            return
        self.samples.append(Sample(ts, snaps))
        self._arrived.set()

    async def wait_past(self, ts_s: float) -> None:
        """Wait (a few sample periods at most) for a sample taken after ``ts_s``, so that the
        window's end falls between two samples."""
        if not self.available or self._task is None:
            return
        deadline = asyncio.get_running_loop().time() + 3 * self.interval_s + 1.0
        while not self.samples or self.samples[-1].ts_s < ts_s:
            self._arrived.clear()
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), left)

    def window(self, start_s: float, end_s: float, output_tokens: int) -> BenchTelemetry:
        """Figures for the wall-clock window [start_s, end_s]."""
        if not self.available:
            return BenchTelemetry(available=False, detail=self.problem)
        inside = [s for s in self.samples if start_s <= s.ts_s <= end_s]
        if not inside:
            before = [s for s in self.samples if s.ts_s <= end_s]
            inside = before[-1:] or self.samples[:1]
        if not inside:
            return BenchTelemetry(
                available=False,
                simulated=self.simulated,
                backend=self.backend,
                detail="no GPU sample arrived during the run",
            )
        gpus = tuple(self._gpu(info, start_s, end_s, inside) for info in self.infos)
        return _combine(
            gpus,
            inside,
            start_s=start_s,
            end_s=end_s,
            output_tokens=output_tokens,
            simulated=self.simulated,
            backend=self.backend,
        )

    def _gpu(
        self, info: GPUInfo, start_s: float, end_s: float, inside: Sequence[Sample]
    ) -> GPUBenchTelemetry:
        series = [g for s in self.samples for g in s.gpus if g.uuid == info.uuid]
        mine = [g for s in inside for g in s.gpus if g.uuid == info.uuid]
        temps = [float(g.temperature_c) for g in mine if g.temperature_c is not None]
        mems = [g.memory_used_bytes for g in mine if g.memory_used_bytes is not None]
        span = self.interval_s * 2 + MIN_EXTRAPOLATE_S
        e0, e1 = energy_at_mj(series, start_s, span), energy_at_mj(series, end_s, span)
        energy_j = (e1 - e0) / 1000.0 if e0 is not None and e1 is not None else None
        window_s = end_s - start_s
        if energy_j is not None and window_s > 0:
            power_w: float | None = energy_j / window_s
        else:
            powers = [g.power_draw_mw / 1000 for g in mine if g.power_draw_mw is not None]
            power_w = _mean(powers)
        return GPUBenchTelemetry(
            uuid=info.uuid,
            index=info.index,
            name=info.name,
            temperature_peak_c=max(temps) if temps else None,
            temperature_mean_c=_mean(temps),
            power_mean_w=power_w,
            energy_j=energy_j,
            memory_used_peak_bytes=max(mems) if mems else None,
            memory_used_mean_bytes=_mean([float(m) for m in mems]),
        )


def energy_at_mj(
    series: Sequence[GPUSnapshot], ts_s: float, max_extrapolate_s: float
) -> float | None:
    """One GPU's energy counter at ``ts_s``: interpolated between the samples around it, or
    carried from the nearest sample with its power reading (at most ``max_extrapolate_s``)."""
    points = sorted((s for s in series if s.energy_mj is not None), key=lambda s: s.ts_s)
    if not points:
        return None
    for a, b in itertools.pairwise(points):
        if a.ts_s <= ts_s <= b.ts_s:
            assert a.energy_mj is not None and b.energy_mj is not None
            if b.ts_s == a.ts_s:
                return float(a.energy_mj)
            share = (ts_s - a.ts_s) / (b.ts_s - a.ts_s)
            return a.energy_mj + share * (b.energy_mj - a.energy_mj)
    edge = points[0] if ts_s < points[0].ts_s else points[-1]
    gap_s = ts_s - edge.ts_s
    if abs(gap_s) > max_extrapolate_s or edge.power_draw_mw is None:
        return None
    assert edge.energy_mj is not None
    return edge.energy_mj + edge.power_draw_mw * gap_s


def _combine(
    gpus: tuple[GPUBenchTelemetry, ...],
    inside: Sequence[Sample],
    *,
    start_s: float,
    end_s: float,
    output_tokens: int,
    simulated: bool,
    backend: str,
) -> BenchTelemetry:
    window_s = max(0.0, end_s - start_s)
    energies = [g.energy_j for g in gpus]
    hottest = [_max_or_none(g.temperature_c for g in s.gpus) for s in inside]
    power_sums = [_sum_or_none(g.power_draw_mw for g in s.gpus) for s in inside]
    memory_sums = [_sum_or_none(g.memory_used_bytes for g in s.gpus) for s in inside]
    if gpus and all(e is not None for e in energies):
        counted = math.fsum(e for e in energies if e is not None)
        energy_j: float | None = counted
        source = "counter"
        power_w = counted / window_s if window_s > 0 else None
        detail = f"energy from the NVML counters of {len(gpus)} GPU(s)"
    else:
        readings = [p / 1000 for p in power_sums if p is not None]
        power_w = _mean(readings)
        energy_j = power_w * window_s if power_w is not None else None
        source = "power" if energy_j is not None else ""
        detail = "no energy counter: energy = mean power reading × duration"
    if simulated:
        how = "" if backend == "simulated" else f" ({backend})"
        detail = f"SIMULATED GPUs{how}: {detail}"
    temps = [t for t in hottest if t is not None]
    mems = [m for m in memory_sums if m is not None]
    fans = [f.speed_pct for s in inside for g in s.gpus for f in g.fans if f.speed_pct is not None]
    return BenchTelemetry(
        available=True,
        simulated=simulated,
        backend=backend,
        detail=detail,
        samples=len(inside),
        window_s=window_s,
        temperature_peak_c=max(temps) if temps else None,
        temperature_mean_c=_mean(temps),
        power_mean_w=power_w,
        energy_j=energy_j,
        joules_per_token=energy_j / output_tokens
        if energy_j is not None and output_tokens
        else None,
        energy_source=source,
        memory_used_peak_bytes=int(max(mems)) if mems else None,
        fan_speed_peak_pct=float(max(fans)) if fans else None,
        gpus=gpus,
        ts_s=tuple(s.ts_s - start_s for s in inside),
        temperature_c=tuple(hottest),
        power_w=tuple(p / 1000 if p is not None else None for p in power_sums),
    )


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def _max_or_none(values: Iterable[int | None]) -> float | None:
    known = [float(v) for v in values if v is not None]
    return max(known) if known else None


def _sum_or_none(values: Iterable[int | None]) -> float | None:
    known = [float(v) for v in values if v is not None]
    return math.fsum(known) if known else None
