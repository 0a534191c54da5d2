"""ManagedEngine: spawn an engine, decide when it is ready, keep its logs, stop it completely,
and restart it after a crash. This module holds its public face; its life loop is
engines/runtime/life.py, the start of a life start.py, the watch of a ready one watch.py, its
output log.py, its processes process.py.

State machine (published as ``EngineStateChanged``)::

    stopped ─start→ starting ─ready→ ready ─stop→ stopping → stopped
        any state ─(start failed | crashed too often)→ failed ─start→ starting
    ready ─crash→ starting (automatic restart, capped exponential backoff)
    ready ─sleep→ sleeping ─wake→ ready  (engines launched with sleep routes: vLLM on CUDA)

While it starts, the port and pid are published as soon as the process exists (starting →
starting), and each phase the engine's log begins (the adapter's phase rules: importing, loading
weights, compiling, KV cache, CUDA graphs, ...) is an ``EngineStartPhase`` event and the status's
``phase`` fields (engines/runtime/phase_tracker.py); ``detail`` keeps saying why it is in its state.

A crash is noticed within 2 s: the leader's exit at once (its pidfd wakes the watch, no polling;
engines/core/procs.py exit_code), and ``/health`` failing twice in a row (vLLM answers 503 when its
engine core died) also counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection

from engines.errors import EngineError
from engines.events.core import EngineState, EngineStatus
from engines.runtime.life import EngineLife
from engines.runtime.probe import post_action
from engines.runtime.traffic import TRAYLM_STOPPING

log = logging.getLogger(__name__)

DAEMON_STOPPING = "daemon stopping"


class ManagedEngine(EngineLife):
    """One engine process and everything about its life: its state and status, and start,
    stop, restart, sleep and wake (its life loop: EngineLife, life.py)."""

    def quiet_s(self, now_s: float) -> float:
        """How long the requests in flight to it have had no reply byte (0 with none in flight):
        what the replica choice passes over before a hang verdict comes."""
        traffic = self._traffic
        if traffic is None or traffic.in_flight(self.engine_id) == 0:
            return 0.0
        return max(0.0, now_s - traffic.last_progress_s(self.engine_id))

    @property
    def stage(self) -> str:
        """What it does now, in words: while starting its start phase ("loading weights") or
        why it is starting (EngineStatus.stage), else the state's detail."""
        return self.status().stage or self.detail

    def status(self) -> EngineStatus:
        phase, label, phase_elapsed_s = self._phases.current()
        return EngineStatus(
            self.engine_id,
            self.profile.engine,
            self.state,
            self.served_names,
            self.port,
            self.pid,
            self.restarts,
            self.detail,
            self.diagnosis,
            self.started_at_s,
            self.ready_at_s,
            self.profile.name,
            self.runtime.device,
            str(self.runtime.version),
            supervision=self.supervision,
            phase=phase,
            phase_label=label,
            phase_elapsed_s=round(phase_elapsed_s, 3),
            phases=self._phases.times(),
            gpus=self.profile.gpus if self.runtime.device == "cuda" else (),
        )

    async def start(self) -> None:
        """Begin starting (returns at once; watch the events or ``wait_ready``)."""
        if self._task is not None and not self._task.done():
            if self.state in (EngineState.STARTING, EngineState.READY):
                return
            await self.stop()
        self._want_running = True
        self.restarts = 0
        self.diagnosis = None
        self._ready_event.clear()
        self._set_state(EngineState.STARTING, "launching")
        self._task = asyncio.create_task(self._run(), name=f"engine:{self.engine_id}")
        self._task.add_done_callback(self._task_ended)

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        """The supervision task never ends silently: whatever escaped it is logged."""
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("engine %s: supervision ended", self.engine_id, exc_info=exc)

    async def wait_ready(self, timeout_s: float) -> None:
        await asyncio.wait_for(self._ready_event.wait(), timeout_s)

    async def wait_state(self, states: Collection[EngineState]) -> EngineState:
        """Return the state as soon as it is one of ``states`` (woken by the transition itself,
        no polling); the caller bounds the wait."""
        while self.state not in states:
            await self._changed.wait()
        return self.state

    async def wait_change(self, timeout_s: float) -> None:
        """Return at the next change of state or start phase, or after ``timeout_s``."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout_s)

    @property
    def can_sleep(self) -> bool:
        """The running engine has sleep routes (vLLM sleep mode on CUDA)."""
        return self._spec is not None and self._spec.sleep is not None

    async def sleep(self) -> None:
        """Ask a ready engine with sleep mode to free its GPU memory (weights to host RAM); it
        stays alive and is not routed to until ``wake``. Raises EngineError."""
        routes = self._spec.sleep if self._spec is not None else None
        if routes is None or self.state != EngineState.READY:
            raise EngineError(
                f"engine {self.engine_id!r} cannot sleep ({self.state}"
                f"{'' if routes else ', started without sleep mode'})"
            )
        self._set_state(EngineState.SLEEPING, "asleep: weights in host RAM")
        try:
            await post_action(self.base_url, routes.sleep_path, self.engine_id)
        except EngineError:
            self._set_state(EngineState.READY, f"serving on 127.0.0.1:{self.port}")
            raise

    async def wake(self) -> None:
        """Wake a sleeping engine (weights back to the GPU); returns once it serves again."""
        routes = self._spec.sleep if self._spec is not None else None
        if routes is None or self.state != EngineState.SLEEPING:
            raise EngineError(f"engine {self.engine_id!r} is {self.state}, not sleeping")
        self.detail = "waking up: weights back to the GPU"
        await post_action(self.base_url, routes.wake_path, self.engine_id)
        self._set_state(EngineState.READY, f"serving on 127.0.0.1:{self.port}")

    async def stop(self, reason: str = "stopped") -> None:
        """Stop the engine and everything it started; returns when no process of it remains."""
        self._want_running = False
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._process is not None:
            self._set_state(EngineState.STOPPING, reason)
            if reason == DAEMON_STOPPING:
                self._end_requests(
                    "traylm is stopping, so the reply was cut off; retry once it runs again",
                    TRAYLM_STOPPING,
                )
            else:
                self._end_requests(
                    f"engine {self.engine_id} was stopped ({reason}) in the middle of the reply"
                )
            await self._terminate()
        elif self._ranks is not None:  # stopped before this box's rank started: end the others
            await self._ranks.end()
        if self.state != EngineState.STOPPED:  # a stop also clears a failure
            self._set_state(EngineState.STOPPED, reason)

    async def restart(self) -> None:
        await self.stop("restarting")
        await self.start()

    def logs(self, tail: int) -> list[str]:
        return self._log.tail(tail)
