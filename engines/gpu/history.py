"""Telemetry history: the downsampled rows in SQLite (``telemetry`` table) and chart columns.

The sampler keeps the last hour at full rate in memory; every ``history_resolution_s`` it writes
one averaged row per GPU to the store and, once an hour, deletes rows older than
``history_days`` and the oldest past ``history_max_rows``. ``GPUHistory`` columns are built
from the ring buffer, the store, or both, and reduced to at most ``points`` buckets for a chart.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engines.core.store import Store
from engines.errors import DiskFull
from engines.events.gpu import GPUHistory, GPUSnapshot, GPUState

COLUMNS = (
    "temperature_c",
    "power_draw_w",
    "power_limit_w",
    "utilization_gpu_pct",
    "fan_speed_pct",
    "memory_used_bytes",
    "sm_clock_mhz",
)
PRUNE_EVERY_S = 3600.0


def row_values(s: GPUSnapshot) -> dict[str, float | None]:
    """The charted values of one snapshot, in chart units (W, not mW)."""
    fans = [f.speed_pct for f in s.fans if f.speed_pct is not None]
    return {
        "temperature_c": _f(s.temperature_c),
        "power_draw_w": None if s.power_draw_mw is None else s.power_draw_mw / 1000,
        "power_limit_w": None if s.power_limit_mw is None else s.power_limit_mw / 1000,
        "utilization_gpu_pct": _f(s.utilization_gpu_pct),
        "fan_speed_pct": sum(fans) / len(fans) if fans else None,
        "memory_used_bytes": _f(s.memory_used_bytes),
        "sm_clock_mhz": _f(s.sm_clock_mhz),
    }


def _f(value: int | None) -> float | None:
    return None if value is None else float(value)


@dataclass
class _Bucket:
    start_s: float
    sums: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    temperature_max_c: float | None = None
    energy_mj: int | None = None

    def add(self, s: GPUSnapshot) -> None:
        for key, value in row_values(s).items():
            if value is not None:
                self.sums[key] = self.sums.get(key, 0.0) + value
                self.counts[key] = self.counts.get(key, 0) + 1
        if s.temperature_c is not None:
            self.temperature_max_c = max(self.temperature_max_c or -273.0, s.temperature_c)
        if s.energy_mj is not None:
            self.energy_mj = s.energy_mj

    def row(self) -> dict[str, Any]:
        data: dict[str, Any] = {k: self.sums[k] / self.counts[k] for k in self.sums}
        data["temperature_max_c"] = self.temperature_max_c
        data["energy_mj"] = self.energy_mj
        data["samples"] = max(self.counts.values(), default=0)
        return data


class TelemetryHistory:
    """Averages samples into ``resolution_s`` rows and writes them (called from the sampler
    thread: the store calls block)."""

    def __init__(
        self, store: Store, *, resolution_s: float, keep_days: float, max_rows: int = 1_000_000
    ) -> None:
        self.store = store
        self.resolution_s = resolution_s
        self.keep_s = keep_days * 86400
        self.max_rows = max_rows
        self._buckets: dict[str, _Bucket] = {}
        self._last_prune_s = 0.0

    def add(self, snapshots: Sequence[GPUSnapshot]) -> int:
        """Returns the number of rows written."""
        rows: list[tuple[float, str, str]] = []
        for s in snapshots:
            if s.state != GPUState.OK:
                continue
            start = s.ts_s - s.ts_s % self.resolution_s
            bucket = self._buckets.get(s.uuid)
            if bucket is not None and bucket.start_s != start:
                rows.append((bucket.start_s, s.uuid, json.dumps(bucket.row())))
                bucket = None
            if bucket is None:
                bucket = self._buckets[s.uuid] = _Bucket(start)
            bucket.add(s)
        try:
            if rows:
                with self.store.transaction() as db:
                    db.executemany(
                        "INSERT OR REPLACE INTO telemetry (ts_s, gpu_uuid, data_json)"
                        " VALUES (?,?,?)",
                        rows,
                    )
            now = time.time()
            if now - self._last_prune_s >= PRUNE_EVERY_S:
                self._last_prune_s = now
                self.prune(now)
        except DiskFull:  # the store logged it once; these averages are not kept
            return 0
        return len(rows)

    def prune(self, now_s: float) -> None:
        """Delete rows older than ``keep_days``, then the oldest past ``max_rows``."""
        with self.store.transaction() as db:
            db.execute("DELETE FROM telemetry WHERE ts_s < ?", (now_s - self.keep_s,))
            db.execute(
                "DELETE FROM telemetry WHERE ts_s <= (SELECT ts_s FROM telemetry "
                "ORDER BY ts_s DESC LIMIT 1 OFFSET ?)",
                (self.max_rows,),
            )

    def rows(self, since_s: float, until_s: float) -> list[dict[str, Any]]:
        return self.store.query(
            "SELECT ts_s, gpu_uuid, data_json FROM telemetry WHERE ts_s >= ? AND ts_s < ? "
            "ORDER BY ts_s",
            (since_s, until_s),
        )


def build_history(
    *,
    uuids: Sequence[tuple[str, int]],
    ring: Iterable[Sequence[GPUSnapshot]],
    rows: Iterable[dict[str, Any]],
    resolution_s: float,
    points: int,
    since_s: float,
    simulated: bool,
) -> tuple[GPUHistory, ...]:
    """Chart columns per GPU from stored rows (older) and ring samples (newer), in at most
    ``points`` buckets."""
    series: dict[str, list[tuple[float, dict[str, float | None]]]] = {u: [] for u, _ in uuids}
    for r in rows:
        if r["gpu_uuid"] in series:
            series[r["gpu_uuid"]].append((float(r["ts_s"]), json.loads(r["data_json"])))
    for sample in ring:
        for s in sample:
            if s.uuid in series and s.ts_s >= since_s and s.state == GPUState.OK:
                series[s.uuid].append((s.ts_s, row_values(s)))
    out = []
    for uuid, index in uuids:
        data = sorted(series[uuid], key=lambda item: item[0])
        step = _step(data, resolution_s, points)
        ts, cols = _bucketise(data, step)
        out.append(
            GPUHistory(
                uuid=uuid,
                index=index,
                simulated=simulated,
                resolution_s=step or resolution_s,
                ts_s=tuple(ts),
                **{c: tuple(cols[c]) for c in COLUMNS},
            )
        )
    return tuple(out)


def _step(data: Sequence[tuple[float, Any]], resolution_s: float, points: int) -> float:
    """Bucket width; 0 when every sample fits (each one is its own point)."""
    if len(data) <= points:
        return 0.0
    span = data[-1][0] - data[0][0]
    return max(resolution_s, span / max(1, points - 1))


def _bucketise(
    data: Sequence[tuple[float, dict[str, float | None]]], step_s: float
) -> tuple[list[float], dict[str, list[float | None]]]:
    ts: list[float] = []
    cols: dict[str, list[float | None]] = {c: [] for c in COLUMNS}
    if not data:
        return ts, cols
    origin = data[0][0]
    current: int | None = None
    group: list[dict[str, float | None]] = []
    group_ts: list[float] = []

    def flush() -> None:
        ts.append(round(sum(group_ts) / len(group_ts), 3))
        for c in COLUMNS:
            values = [v for v in (g.get(c) for g in group) if v is not None]
            cols[c].append(round(sum(values) / len(values), 3) if values else None)

    for n, (t, values) in enumerate(data):
        key = int((t - origin) // step_s) if step_s > 0 else n
        if current is not None and key != current:
            flush()
            group, group_ts = [], []
        current = key
        group.append(values)
        group_ts.append(t)
    if group:
        flush()
    return ts, cols
