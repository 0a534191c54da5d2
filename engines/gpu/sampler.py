"""The GPU sampler: one worker thread reads every GPU each ``interval_s``.

Each sample goes to a ring buffer (the last hour at full rate), to the event bus as one
``GPUSampled`` event with all GPUs, to the ``on_sample`` hook (thermal guard, energy), and to the
downsampled SQLite history. The expensive reads (process list, PCIe throughput) run every
``process_interval_s``; in between each snapshot carries the last process list forward. When NVML
is unavailable the sampler says so once (``GPUStateChanged``) and retries with backoff.

``sample_after`` asks for a sample now (process list included) and waits for it: placement right
after an engine stopped must not read a snapshot taken while that engine still held its memory.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import psutil

from engines.errors import GPUError, GPUUnavailable
from engines.events.codec import Event
from engines.events.gpu import GPUInfo, GPUSampled, GPUSnapshot, GPUState, GPUStateChanged
from engines.gpu.backend import GPUBackend
from engines.gpu.history import TelemetryHistory

log = logging.getLogger(__name__)

RING_S = 3600.0
BACKOFF_MIN_S = 2.0
BACKOFF_MAX_S = 60.0

Snapshots = tuple[GPUSnapshot, ...]


class Sampler:
    def __init__(
        self,
        backend: GPUBackend,
        *,
        interval_s: float,
        process_interval_s: float,
        publish: Callable[[Event], None],
        on_sample: Callable[[Snapshots], None] | None = None,
        history: TelemetryHistory | None = None,
        engine_pids: Callable[[], Mapping[int, str]] | None = None,
        ring_s: float = RING_S,
    ) -> None:
        self.backend = backend
        self.interval_s = interval_s
        self.process_interval_s = process_interval_s
        self._publish = publish
        self._on_sample = on_sample
        self._history = history
        self._engine_pids = engine_pids
        self.ring: collections.deque[Snapshots] = collections.deque(
            maxlen=max(1, int(ring_s / interval_s))
        )
        self.latest: Snapshots = ()
        self.infos: tuple[GPUInfo, ...] = ()
        self.state = GPUState.UNAVAILABLE
        self.message = "starting"
        self.samples = 0
        self.cost_s_total = 0.0
        self.last_cost_s = 0.0
        self._processes: dict[str, Any] = {}
        self._lost: set[str] = set()
        self._stop = threading.Event()
        self._wake = threading.Condition()
        self._asked = False
        self.sampled_at_s = -math.inf
        """Monotonic time the latest sample began (its snapshots show the cards from then on)."""
        self._thread: threading.Thread | None = None
        self._last_slow_s = -1e18

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        with self._wake:
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    @property
    def mean_cost_s(self) -> float:
        return self.cost_s_total / self.samples if self.samples else 0.0

    # ----------------------------------------------------------------- the thread

    def _run(self) -> None:
        backoff_s = 0.0
        next_s = time.monotonic()
        while not self._stop.is_set():
            try:
                self.sample_once()
                backoff_s = 0.0
            except GPUUnavailable as exc:
                backoff_s = min(BACKOFF_MAX_S, max(BACKOFF_MIN_S, backoff_s * 2))
                self._set_state(
                    GPUState.UNAVAILABLE, f"{exc.message} (retrying in {backoff_s:.0f} s)"
                )
                if self._stop.wait(backoff_s):
                    return
                next_s = time.monotonic()
                continue
            except GPUError as exc:
                log.warning("GPU sample failed: %s", exc.message)
            except Exception:  # boundary: the sampler thread must outlive any one bad sample
                log.exception("GPU sample failed")
            next_s += self.interval_s
            delay = next_s - time.monotonic()
            if delay < 0:  # fell behind (suspend, slow NVML): do not try to catch up
                next_s, delay = time.monotonic(), 0.0
            with self._wake:  # until the next turn, or a sample asked for now
                self._wake.wait_for(lambda: self._asked or self._stop.is_set(), delay)
            if self._stop.is_set():
                return

    def sample_after(self, after_s: float, timeout_s: float) -> bool:
        """Block until the latest snapshots were read after ``after_s`` (monotonic), asking the
        thread for one now, with the process list, rather than at its next turn. False when none
        came within ``timeout_s`` (NVML down, the sampler stopped)."""
        with self._wake:
            if self.sampled_at_s > after_s:
                return True
            self._asked = True
            self._wake.notify_all()
            return self._wake.wait_for(lambda: self.sampled_at_s > after_s, timeout_s)

    def sample_once(self) -> Snapshots:
        """Take one sample and hand it on (the thread's body; tests call it directly)."""
        with self._wake:  # taken first: a sample that fails answers the ask too (no spin)
            asked, self._asked = self._asked, False
        opened = self.state != GPUState.OK or not self.infos
        if opened:
            self.infos = self.backend.open()
        now = time.monotonic()
        slow = asked or now - self._last_slow_s >= self.process_interval_s
        started = time.perf_counter()
        snaps = self.backend.sample(slow=slow)
        cost = time.perf_counter() - started
        if opened:  # OK once a sample came: a driver that opens but cannot sample stays down
            self._set_state(GPUState.OK, f"{len(self.infos)} GPU(s) via {self.backend.name}")
        self.last_cost_s = cost
        self.cost_s_total += cost
        self.samples += 1
        if slow:
            self._last_slow_s = now
            snaps = self._label(snaps)
            self._processes = {s.uuid: s.processes for s in snaps}
        else:
            snaps = tuple(
                dataclasses.replace(s, processes=self._processes.get(s.uuid))
                if s.processes is None and self._processes.get(s.uuid) is not None
                else s
                for s in snaps
            )
        self._note_lost(snaps)
        with self._wake:
            self.latest, self.sampled_at_s = snaps, now
            self._wake.notify_all()
        self.ring.append(snaps)
        self._publish(
            GPUSampled(backend=self.backend.name, simulated=self.backend.simulated, gpus=snaps)
        )
        if self._on_sample is not None:
            self._on_sample(snaps)
        if self._history is not None:
            self._history.add(snaps)
        return snaps

    # ----------------------------------------------------------------- helpers

    def _set_state(self, state: GPUState, message: str) -> None:
        """Publish a change of state. The log says an outage once (each retry only at debug:
        a machine without NVIDIA retries for as long as the daemon runs) and its end once."""
        if (
            state == self.state
            and message.split(" (retrying")[0] == self.message.split(" (retrying")[0]
        ):
            self.message = message
            if state == GPUState.UNAVAILABLE:
                log.debug("GPU telemetry still unavailable: %s", message)
            return
        was_down = self.state == GPUState.UNAVAILABLE and self.message != "starting"
        self.state, self.message = state, message
        if state == GPUState.UNAVAILABLE:
            log.warning("GPU telemetry unavailable: %s", message)
        elif was_down:
            log.info("GPU telemetry is back: %s", message)
        else:
            log.info("GPU telemetry: %s", message)
        self._publish(
            GPUStateChanged(
                state=state,
                backend=self.backend.name,
                message=message,
                simulated=self.backend.simulated,
            )
        )

    def _note_lost(self, snaps: Snapshots) -> None:
        for s in snaps:
            if s.state == GPUState.LOST and s.uuid not in self._lost:
                self._lost.add(s.uuid)
                self._publish(
                    GPUStateChanged(
                        state=GPUState.LOST,
                        backend=self.backend.name,
                        uuid=s.uuid,
                        simulated=self.backend.simulated,
                        message=(
                            f"GPU {s.index} ({s.uuid}) is lost: it fell off the bus. traylm "
                            "stopped controlling it; save your work and reboot the machine"
                        ),
                    )
                )

    def _label(self, snaps: Snapshots) -> Snapshots:
        """Name each GPU process and mark those that belong to a traylm engine."""
        pids = dict(self._engine_pids()) if self._engine_pids is not None else {}
        out = []
        for s in snaps:
            if not s.processes:
                out.append(s)
                continue
            procs = tuple(
                dataclasses.replace(
                    p, name=p.name or _process_name(p.pid), engine_id=pids.get(p.pid)
                )
                for p in s.processes
            )
            out.append(dataclasses.replace(s, processes=procs))
        return tuple(out)


def _process_name(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except (psutil.Error, OSError):
        return ""
