"""JSONL traces of GPU telemetry: ``TraceRecorder`` writes one from any backend, and
``ReplayBackend`` plays it back (tests, demos, bug reports from machines we do not have).

Format (one JSON object per line)::

    {"kind": "header", "version": 1, "backend": "nvml", "simulated": false,
     "recorded_at_s": 1730000000.0, "gpus": [GPUInfo, ...]}
    {"kind": "sample", "ts_s": 1730000001.0, "gpus": [GPUSnapshot, ...]}
    ...
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from engines.errors import ConfigError, GPUPermissionDenied
from engines.events.codec import from_plain, to_plain
from engines.events.gpu import GPUInfo, GPUSnapshot
from engines.gpu.backend import GPUBackend

TRACE_VERSION = 1


class TraceRecorder:
    """Append samples to a JSONL trace. Use as a context manager."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh: IO[str] | None = None
        self.samples = 0

    def __enter__(self) -> TraceRecorder:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("w", encoding="utf-8")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def header(self, backend: GPUBackend, infos: tuple[GPUInfo, ...]) -> None:
        self._line(
            {
                "kind": "header",
                "version": TRACE_VERSION,
                "backend": backend.name,
                "simulated": backend.simulated,
                "recorded_at_s": time.time(),
                "gpus": to_plain(infos),
            }
        )

    def write(self, snapshots: tuple[GPUSnapshot, ...]) -> None:
        ts = snapshots[0].ts_s if snapshots else time.time()
        self._line({"kind": "sample", "ts_s": ts, "gpus": to_plain(snapshots)})
        self.samples += 1

    def _line(self, data: dict[str, Any]) -> None:
        assert self._fh is not None, "use TraceRecorder as a context manager"
        self._fh.write(json.dumps(data, separators=(",", ":")) + "\n")
        self._fh.flush()


def record(
    backend: GPUBackend,
    path: Path,
    *,
    seconds: float,
    interval_s: float = 1.0,
    slow_every: int = 5,
    sleep: Callable[[float], None] = time.sleep,
    on_sample: Callable[[tuple[GPUSnapshot, ...], float], None] | None = None,
) -> int:
    """Record ``seconds`` of samples; returns the number written. ``on_sample`` gets each
    sample and the seconds the backend took to read it."""
    infos = backend.open()
    count = max(1, round(seconds / interval_s))
    with TraceRecorder(path) as rec:
        rec.header(backend, infos)
        for n in range(count):
            started = time.perf_counter()
            snaps = backend.sample(slow=n % max(1, slow_every) == 0)
            cost_s = time.perf_counter() - started
            rec.write(snaps)
            if on_sample is not None:
                on_sample(snaps, cost_s)
            if n + 1 < count:
                sleep(max(0.0, interval_s - cost_s))
        return rec.samples


@dataclasses.dataclass(frozen=True)
class Trace:
    backend: str
    simulated: bool
    infos: tuple[GPUInfo, ...]
    samples: tuple[tuple[GPUSnapshot, ...], ...]


def read_trace(path: Path) -> Trace:
    """Parse a trace; ConfigError says which line is wrong."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read GPU trace {path}: {exc.strerror}") from None
    header: dict[str, Any] | None = None
    samples: list[tuple[GPUSnapshot, ...]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            if data.get("kind") == "header":
                header = data
            elif data.get("kind") == "sample":
                samples.append(tuple(from_plain(GPUSnapshot, g) for g in data["gpus"]))
            else:
                raise ValueError(f"unknown kind {data.get('kind')!r}")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(
                f"{path}:{number} is not a GPU trace line ({exc}); record traces with "
                "`traylm gpus record FILE`"
            ) from None
    if header is None or header.get("version") != TRACE_VERSION:
        raise ConfigError(
            f"{path} has no version-{TRACE_VERSION} header line; record it again with "
            "`traylm gpus record FILE`"
        )
    infos = tuple(from_plain(GPUInfo, g) for g in header.get("gpus", []))
    return Trace(
        str(header.get("backend", "")), bool(header.get("simulated")), infos, tuple(samples)
    )


class ReplayBackend:
    """Plays a trace back one sample per ``sample()`` call; read-only.

    ``retime=True`` (the daemon's demo mode) stamps each sample with the current time and marks
    it simulated (the numbers are not live); ``retime=False`` returns the recorded snapshots
    unchanged. ``loop`` starts over at the end; otherwise the last sample repeats.
    """

    name = "replay"
    simulated = True

    def __init__(self, path: Path, *, retime: bool = True, loop: bool = True) -> None:
        self.path = path
        self._retime = retime
        self._loop = loop
        self._trace: Trace | None = None
        self._frames: Iterator[tuple[GPUSnapshot, ...]] | None = None
        self._last: tuple[GPUSnapshot, ...] = ()
        self._lock = threading.Lock()

    def open(self) -> tuple[GPUInfo, ...]:
        with self._lock:
            if self._trace is None:
                self._trace = read_trace(self.path)
                self._frames = iter(self._trace.samples)
            infos = self._trace.infos
        if self._retime:
            return tuple(dataclasses.replace(i, simulated=True) for i in infos)
        return infos

    def infos(self) -> tuple[GPUInfo, ...]:
        return self.open()

    def sample(self, *, slow: bool = False) -> tuple[GPUSnapshot, ...]:
        self.open()
        with self._lock:
            assert self._trace is not None and self._frames is not None
            frame = next(self._frames, None)
            if frame is None and self._loop and self._trace.samples:
                self._frames = iter(self._trace.samples)
                frame = next(self._frames, None)
            if frame is not None:
                self._last = frame
            frame = self._last
        if not self._retime:
            return frame
        now = time.time()
        return tuple(dataclasses.replace(s, ts_s=now, simulated=True) for s in frame)

    def set_fan_speed(self, uuid: str, fan: int, speed_pct: int) -> None:
        raise self._read_only()

    def set_fan_auto(self, uuid: str, fan: int) -> None:
        raise self._read_only()

    def set_power_limit(self, uuid: str, limit_mw: int) -> None:
        raise self._read_only()

    def lock_clocks(self, uuid: str, domain: str, min_mhz: int, max_mhz: int) -> None:
        raise self._read_only()

    def reset_clocks(self, uuid: str, domain: str) -> None:
        raise self._read_only()

    def close(self) -> None:
        pass

    def _read_only(self) -> GPUPermissionDenied:
        return GPUPermissionDenied(
            f"the GPUs are a replayed trace ({self.path.name}): nothing can be controlled; "
            "unset gpu.replay_file to use the real GPUs"
        )
