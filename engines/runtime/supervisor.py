"""ManagedEngine: spawn an engine, decide when it is ready, keep its logs, stop it completely,
and restart it after a crash. Supervisor: the set of engines the daemon runs.

State machine (published as ``EngineStateChanged``)::

    stopped ─start→ starting ─ready→ ready ─stop→ stopping → stopped
        any state ─(start failed | crashed too often)→ failed ─start→ starting
    ready ─crash→ starting (automatic restart, capped exponential backoff)
    ready ─sleep→ sleeping ─wake→ ready  (engines launched with sleep routes: vLLM on CUDA)

While starting, readiness is probed every 50 ms (a refused connection costs little), so a request
waiting for a cold model is relayed within a probe period of the engine listening.

While it starts, the port and pid are published as soon as the process exists (starting →
starting), and each phase the engine's log begins (the adapter's phase rules: importing, loading
weights, compiling, KV cache, CUDA graphs, ...) is an ``EngineStartPhase`` event and the status's
``phase`` fields (engines/runtime/phase_tracker.py); ``detail`` keeps saying why it is in its state.

Ready means: the process is alive AND ``GET /health`` is 200 AND ``GET /v1/models`` is 200.
A crash is noticed within 2 s: the leader's exit at once (its pidfd wakes the watch, no polling;
engines/core/procs.py exit_code), and ``/health`` failing twice in a row (vLLM answers 503 when its
engine core died) also counts.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from pathlib import Path
from typing import Protocol, TextIO

import aiohttp
import psutil

from engines.config.profiles import Profile
from engines.config.sections import EngineSettings
from engines.core.procs import (
    EngineRecord,
    PidRegistry,
    TrackedProcess,
    descendants,
    end_group,
    exit_code,
    free_loopback_port,
    settled,
    vitals,
)
from engines.errors import EngineError, TraylmError
from engines.events.codec import Event
from engines.events.core import (
    Diagnosis,
    EngineDiagnosed,
    EngineLogLine,
    EngineStartPhase,
    EngineState,
    EngineStateChanged,
    EngineStatus,
)
from engines.runtime.adapters.base import EngineAdapter, EngineRuntime, LaunchSpec
from engines.runtime.liveness import Evidence, Health, Liveness, Verdict
from engines.runtime.output import last_error, open_engine_log, read_lines, strip_ansi
from engines.runtime.phase_tracker import PhaseTracker
from engines.runtime.probe import post_action, probe, token_counters
from engines.runtime.spawn import argv_text, engine_env, start_process, write_run_files
from engines.runtime.traffic import ENGINE_ERROR, TRAYLM_STOPPING, EngineTraffic
from engines.runtime.warm import WarmPool

log = logging.getLogger(__name__)

HEALTH_PERIOD_S = 0.05  # readiness probe while starting
DESCENDANTS_PERIOD_S = 0.5  # the process-tree scan while starting (it reads every process)
WATCH_PERIOD_S = 1.0  # once ready: /health twice in a row failing = crashed within 2 s
QUIET_WATCH_PERIOD_S = 3.0  # ready, healthy, no request in flight: a crash is seen at once
# (the exit wait), a hang waits for the next look; a request or one bad look: WATCH_PERIOD_S
DESCENDANTS_READY_PERIOD_S = 5.0  # once ready the tree rarely changes; the scan reads every process
DAEMON_STOPPING = "daemon stopping"

Publish = Callable[[Event], None]
LogSink = Callable[[str], None]
Prepare = Callable[[LogSink], Awaitable[tuple[Profile, str]]]
"""Work before the first spawn of a start (a TensorRT engine build): gets a sink for its log
lines (they are diagnosed like engine output) and returns the profile and model to launch with.
It runs in state ``starting`` and is cancelled by ``stop()``; a TraylmError fails the start."""


class Ranks(Protocol):
    """The other ranks of a model across boxes (vLLM multi-node), supervised with this engine
    (the head rank, which serves the API) as one: started before each life of it, checked
    while it starts and runs, ended with it (engines/multinode/head.py)."""

    async def begin(self, sink: LogSink) -> Profile:
        """Check every box and start the other ranks for one life; returns the profile this
        box's rank launches with. Raises TraylmError (naming the box and the fix); nothing is
        left running on any box then."""
        ...

    def problem(self) -> str | None:
        """Why the ranks cannot go on (a rank ended, its box went silent), or None."""
        ...

    async def end(self) -> None:
        """End the other ranks (every process of each); returns once their boxes said so or
        could not be reached."""
        ...


class ManagedEngine:
    """One engine process and everything about its life."""

    def __init__(
        self,
        engine_id: str,
        *,
        profile: Profile,
        adapter: EngineAdapter,
        runtime: EngineRuntime,
        model: str,
        settings: EngineSettings,
        log_path: Path,
        pids: PidRegistry,
        publish: Publish,
        prepare: Prepare | None = None,
        traffic: EngineTraffic | None = None,
        warm: WarmPool | None = None,
        ranks: Ranks | None = None,
    ) -> None:
        """``traffic``: the gateway's requests in flight (progress for the hang check, and
        their clients are told at once when the engine dies or stops); ``ranks``: the ranks on
        other boxes of a model across boxes."""
        self.engine_id = engine_id
        self._ranks = ranks
        self._traffic = traffic
        self._warm = warm
        self._prepare = prepare
        self.run_dir = log_path.with_suffix(".run")
        self.profile = profile
        self.adapter = adapter
        self.runtime = runtime
        self.model = model
        self.settings = settings
        self.log_path = log_path
        self._pids = pids
        self._publish = publish
        self.state = EngineState.STOPPED
        self.port: int | None = None
        self.restarts = 0
        self.detail = ""
        self.diagnosis: Diagnosis | None = None
        self.ring: collections.deque[str] = collections.deque(maxlen=settings.log_ring_lines)
        self.started_at_s: float | None = None
        self.ready_at_s: float | None = None
        self.released_at_s = 0.0
        """Monotonic time the engine last went down (stopped or failed: its processes gone,
        and their GPU memory with them)."""
        self.served_names = profile.served_names
        self._proc: asyncio.subprocess.Process | None = None
        self._tracked: list[TrackedProcess] = []
        self._task: asyncio.Task[None] | None = None
        self._want_running = False
        self._ready_event = asyncio.Event()
        self._changed = asyncio.Event()
        self._spec: LaunchSpec | None = None
        self._log_fh: TextIO | None = None
        self.supervision = ""
        """What keeps the supervisor from watching this engine fully right now (it retries),
        or "" (shown by `traylm status`)."""
        self._phases = PhaseTracker(engine_id)

    # ----------------------------------------------------------------- public API

    def quiet_s(self, now_s: float) -> float:
        """How long the requests in flight to it have had no reply byte (0 with none in flight):
        what the replica choice passes over before a hang verdict comes."""
        traffic = self._traffic
        if traffic is None or traffic.in_flight(self.engine_id) == 0:
            return 0.0
        return max(0.0, now_s - traffic.last_progress_s(self.engine_id))

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def base_url(self) -> str | None:
        return f"http://127.0.0.1:{self.port}" if self.port else None

    @property
    def metrics_url(self) -> str | None:
        """The engine's Prometheus route (vLLM and SGLang: /metrics; TensorRT-LLM:
        /prometheus/metrics), or None when it has none that may be polled."""
        spec = self._spec
        if self.base_url is None or spec is None or not spec.metrics_path:
            return None
        if spec.metrics_format != "prometheus":
            return None
        return f"{self.base_url}{spec.metrics_path}"

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
        if self._proc is not None:
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
        lines = list(self.ring)
        return lines[-tail:] if tail > 0 else lines

    # ----------------------------------------------------------------- the life loop

    async def _run(self) -> None:
        try:
            if not await self._prepare_launch():
                return
            while self._want_running:
                outcome = await self._one_life()
                if outcome == "stopped" or not self._want_running:
                    return
                if outcome == "start_failed":
                    return
                if outcome == "spawn_failed":  # the daemon's trouble, not a crash: no count
                    delay = self.settings.restart_backoff_max_s
                    self._set_state(EngineState.STARTING, f"{self.supervision}; in {delay:.0f} s")
                    await asyncio.sleep(delay)
                    continue
                # crashed after having been ready: restart with backoff, up to restart_max
                if self.restarts >= self.settings.restart_max:
                    self._set_state(
                        EngineState.FAILED,
                        f"crashed {self.restarts + 1} times; not restarting again. "
                        "Check the engine log, then start it again.",
                    )
                    return
                delay = min(
                    self.settings.restart_backoff_s * (2**self.restarts),
                    self.settings.restart_backoff_max_s,
                )
                self.restarts += 1
                self._set_state(
                    EngineState.STARTING,
                    f"crashed; restart {self.restarts}/{self.settings.restart_max} "
                    f"in {delay:.0f} s",
                )
                await asyncio.sleep(delay)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # boundary: a bug here must become an event, not a dead task
            log.exception("engine %s supervisor task failed", self.engine_id)
            self._set_state(EngineState.FAILED, f"internal error: {exc}")
            try:
                await self._terminate()
            except Exception:  # boundary: the clean-up of a failure must not fail silently
                log.exception("engine %s: cleaning up after the failure failed", self.engine_id)

    async def _prepare_launch(self) -> bool:
        if self._prepare is None:
            return True
        self._set_state(EngineState.STARTING, "preparing the engine (see its log)")
        self._open_log(["===== traylm: preparing (before the first launch)"])
        try:
            self.profile, self.model = await self._prepare(self._log_line)
        except TraylmError as exc:
            self._set_state(EngineState.FAILED, self._failure_text(exc.message))
            return False
        finally:
            self._close_log()
        return True

    async def _one_life(self) -> str:
        """Spawn, wait for ready, watch until exit. Returns start_failed|crashed, or
        spawn_failed when no process could be started."""
        profile = self.profile
        if self._ranks is not None:
            self._open_log(["===== traylm: the ranks on the other boxes"])
            try:
                profile = await self._ranks.begin(self._log_line)
            except TraylmError as exc:
                self.diagnosis = None
                self._set_state(EngineState.FAILED, f"cannot start: {exc.message}")
                return "start_failed"
            finally:
                self._close_log()
        spec = self._spawn_spec(profile)
        if self.state != EngineState.STARTING:
            self._set_state(EngineState.STARTING, f"starting on 127.0.0.1:{self.port}")
        else:
            self.detail = f"starting on 127.0.0.1:{self.port}"
        try:
            await self._spawn(spec)
        except OSError as exc:  # no process: out of descriptors or memory, a missing binary
            self._close_log()
            if self._ranks is not None:
                await self._ranks.end()
            self._trouble("cannot start the engine process", exc)
            return "spawn_failed"
        assert self._proc is not None
        # the port and pid exist now: say so (every view shows them while it starts)
        self._set_state(EngineState.STARTING, self.detail)
        reader = asyncio.create_task(self._read_logs(self._proc), name=f"logs:{self.engine_id}")
        try:
            ready = await self._wait_until_ready(spec)
            if not ready:
                await self._terminate()
                await _drain(reader)
                self._set_state(EngineState.FAILED, self._failure_text("failed to start"))
                return "start_failed"
            self.ready_at_s = time.time()
            self._publish_phase(self._phases.ready())
            self._ready_event.set()
            self._set_state(EngineState.READY, f"serving on 127.0.0.1:{self.port}")
            await self._prepare_warm(spec)
            verdict = await self._watch(spec)
            self._ready_event.clear()
            # At once: the gateway stops routing here and the waiting clients get their error
            # (not after the clean-up); then the remains are cleaned up.
            again = self.restarts < self.settings.restart_max
            if again:
                self._set_state(EngineState.STARTING, f"{verdict}; restarting")
            else:
                self._set_state(EngineState.STOPPING, f"{verdict}; cleaning up")
            self._end_requests(
                f"engine {self.engine_id} stopped in the middle of the reply: {verdict}; "
                + ("traylm is restarting it: retry shortly" if again else "it is not restarted")
            )
            await self._terminate()
            await _drain(reader)
            self.detail = str(verdict)
            log.warning("engine %s %s", self.engine_id, verdict)
            return "crashed"
        except asyncio.CancelledError:
            reader.cancel()
            raise

    def _spawn_spec(self, profile: Profile) -> LaunchSpec:
        self.port = free_loopback_port()
        self._spec = self.adapter.launch(
            profile, runtime=self.runtime, port=self.port, model=self.model
        )
        return self._spec

    async def _spawn(self, spec: LaunchSpec) -> None:
        spec = write_run_files(spec, self.run_dir)
        argv = argv_text(spec.argv)
        env = engine_env(spec)
        warm = None
        if self._warm is not None and spec.warm_argv:
            warm = await self._warm.take(self.engine_id, spec.warm_argv, env, spec.argv)
        note = [f"===== traylm: in warm process {warm.pid} (imports done ahead)"] if warm else []
        self._open_log([f"===== argv: {argv}", *note])
        self._proc = warm or await start_process(spec.argv, env)
        self.started_at_s = time.time()
        self.ready_at_s = None
        self._phases = PhaseTracker(self.engine_id, spec.phases)
        self._publish_phase(self._phases.begin())
        leader = TrackedProcess.of(self._proc.pid)
        self._tracked = []
        if leader is not None:
            self._pids.put(EngineRecord(self.engine_id, self._proc.pid, leader))
        log.info("engine %s started: pid %d port %s", self.engine_id, self._proc.pid, self.port)

    async def _prepare_warm(self, spec: LaunchSpec) -> None:
        """Start the process for this engine's next start now (it is ready: nothing to slow)."""
        if self._warm is None or not spec.warm_argv:
            return
        try:
            await self._warm.prepare(self.engine_id, spec.warm_argv, engine_env(spec))
        except OSError as exc:  # only a later start gets slower: say so, go on serving
            log.warning("engine %s: no warm process for the next start: %s", self.engine_id, exc)

    async def _wait_until_ready(self, spec: LaunchSpec) -> bool:
        assert self._proc is not None
        deadline = time.monotonic() + self.settings.ready_timeout_s
        timeout = aiohttp.ClientTimeout(total=2)
        scanned = 0.0
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while time.monotonic() < deadline:
                if self._proc.returncode is not None:
                    return False
                if self._ranks is not None and (why := self._ranks.problem()):
                    self.diagnosis = Diagnosis(
                        code="rank_ended",
                        summary=why,
                        advice="Every rank was ended; the engine logs on each box show why.",
                    )
                    return False
                if (
                    await probe(http, self.base_url, spec.health_path, self._trouble) == Health.OK
                    and await probe(http, self.base_url, spec.models_path, self._trouble)
                    == Health.OK
                ):
                    return self._proc.returncode is None
                if time.monotonic() - scanned >= DESCENDANTS_PERIOD_S:
                    await self._track_descendants()
                    scanned = time.monotonic()
                await exit_code(self._proc, HEALTH_PERIOD_S)
        self.diagnosis = self.diagnosis or Diagnosis(
            code="ready_timeout",
            summary=f"not ready after {self.settings.ready_timeout_s:.0f} s",
            advice="The engine log shows how far it got; raise engines.ready_timeout_s for very "
            "large models or first-time compiles.",
        )
        return False

    async def _watch(self, spec: LaunchSpec) -> Verdict:
        """Return why, once the ready engine exits, fails /health, hangs or is stopped
        (engines/runtime/liveness.py)."""
        proc = self._proc
        assert proc is not None
        liveness = Liveness(self.settings.stall_timeout_s)
        traffic, engine_id = self._traffic, self.engine_id
        looked_s, scanned_s = time.monotonic(), 0.0  # replies of an earlier life do not count
        period_s = WATCH_PERIOD_S
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.5)) as http:
            while True:
                code = await exit_code(proc, period_s)
                if code is not None:
                    return Verdict("crashed", f"process exited with code {code}")
                if self._ranks is not None and (why := self._ranks.problem()):
                    return Verdict("crashed", why)
                if self.state == EngineState.SLEEPING:  # asleep or waking: no replies, /health
                    liveness = Liveness(self.settings.stall_timeout_s)  # slow while it moves
                    continue  # weights; judged afresh once it serves again
                replied_s = traffic.last_reply_byte_s(engine_id) if traffic is not None else 0.0
                if replied_s > looked_s:  # replies flowed since the last look: it serves
                    health = Health.OK
                else:
                    health = await probe(http, self.base_url, spec.health_path, self._trouble)
                now = looked_s = time.monotonic()
                look = Evidence(now, health)
                if traffic is not None:
                    look.in_flight = traffic.in_flight(engine_id)
                    look.streams = traffic.streams(engine_id)
                    look.last_reply_byte_s = traffic.last_progress_s(engine_id)
                if health == Health.SILENT or liveness.wants_counters(
                    now, in_flight=look.in_flight, last_reply_byte_s=look.last_reply_byte_s
                ):
                    look.counters = await token_counters(
                        http, self.metrics_url, self.profile.engine
                    )
                look.leader_cpu_s, look.stopped = await self._vitals(proc.pid)
                verdict = liveness.look(look)
                if verdict is not None:
                    return verdict
                quiet = health == Health.OK and not look.in_flight
                period_s = QUIET_WATCH_PERIOD_S if quiet else WATCH_PERIOD_S
                tree_known = True  # the last scan worked: the next is due later
                if now - scanned_s >= DESCENDANTS_READY_PERIOD_S:
                    tree_known = await self._track_descendants()  # failed: retried next look
                    scanned_s = now if tree_known else scanned_s
                if tree_known and health != Health.UNKNOWN:
                    self._trouble_over()
                if (
                    self.restarts
                    and self.ready_at_s
                    and time.time() - self.ready_at_s > self.settings.stable_after_s
                ):
                    self.restarts = 0

    async def _vitals(self, pid: int) -> tuple[float | None, list[int]]:
        try:
            return await asyncio.to_thread(vitals, pid, self._tracked)
        except (OSError, psutil.Error) as exc:
            self._trouble("cannot read the state of the engine's processes", exc)
            return None, []

    async def _track_descendants(self) -> bool:
        """Record the engine's child processes (the reaper needs them after a daemon crash).
        False when the scan failed (it is retried on the next tick)."""
        proc = self._proc
        if proc is None:
            return True
        try:
            # a scan of every process on the machine: off the loop that relays the tokens
            found = await asyncio.to_thread(descendants, proc.pid)
            known = {(p.pid, p.create_time) for p in self._tracked}
            new = [p for p in found if (p.pid, p.create_time) not in known]
            if new:
                self._tracked.extend(new)
                leader = TrackedProcess.of(proc.pid)
                if leader is not None:
                    record = EngineRecord(self.engine_id, proc.pid, leader, tuple(self._tracked))
                    await asyncio.to_thread(self._pids.put, record)
        except (OSError, psutil.Error) as exc:
            self._trouble("cannot scan the engine's processes", exc)
            return False
        return True

    def _end_requests(self, why: str, type_: str = ENGINE_ERROR) -> None:
        traffic = self._traffic
        if traffic is not None and (ended := traffic.end_all(self.engine_id, why, type_)):
            log.info("engine %s: ended %d request(s) in flight: %s", self.engine_id, ended, why)

    def _trouble(self, what: str, exc: BaseException) -> None:
        """Something the supervisor needs failed; it goes on and retries. Logged once per
        distinct trouble, and shown in the engine's status until it passes."""
        text = f"{what}: {exc} (retrying)"
        if text != self.supervision:
            log.warning("engine %s: %s", self.engine_id, text)
            self.supervision = text

    def _trouble_over(self) -> None:
        if self.supervision:
            log.info("engine %s: supervision is back to normal", self.engine_id)
            self.supervision = ""

    async def _terminate(self) -> None:
        """End the engine's process group (engines.core.procs.end_group) and forget it."""
        proc = self._proc
        if proc is None:
            return
        await self._track_descendants()
        ending = end_group(
            proc, self._tracked, grace_s=self.settings.stop_timeout_s, trouble=self._trouble
        )
        if self._ranks is not None:  # every rank at once: one left waiting would hang
            left, _ = await asyncio.gather(ending, self._ranks.end())
        else:
            left = await ending
        if left:
            log.error("engine %s: processes %s survived SIGKILL", self.engine_id, left)
            self.detail = f"processes {left} survived SIGKILL"
        else:
            await settled(proc)
        self._finish_terminate()

    def _finish_terminate(self) -> None:
        proc = self._proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        self._pids.drop(self.engine_id)
        self._proc = None
        self._tracked = []
        self._close_log()

    # ----------------------------------------------------------------- logs

    def _open_log(self, header: list[str]) -> None:
        self._log_fh = open_engine_log(self.log_path, self.engine_id, header)

    def _close_log(self) -> None:
        fh = self._log_fh
        if fh is not None:
            fh.close()
            self._log_fh = None

    async def _read_logs(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        await read_lines(proc.stdout, self._log_line)

    def _log_line(self, text: str) -> None:
        line = strip_ansi(text).rstrip()
        if not line:
            return
        self.ring.append(line)
        fh = self._log_fh
        if fh is not None:
            fh.write(line + "\n")
            fh.flush()
        self._publish(EngineLogLine(engine_id=self.engine_id, line=line))
        self._publish_phase(self._phases.feed(line))
        found = self.adapter.diagnose(line)
        if found is not None:
            if found.severity == "error":
                self.diagnosis = found
            self._publish(EngineDiagnosed(engine_id=self.engine_id, diagnosis=found))

    def _publish_phase(self, event: EngineStartPhase | None) -> None:
        if event is not None:
            log.info("engine %s: %s at %.1f s", self.engine_id, event.phase, event.elapsed_s)
            self._notify_change()
            self._publish(event)

    def _notify_change(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _failure_text(self, what: str) -> str:
        if self.diagnosis is not None:
            return f"{what}: {self.diagnosis.summary}. {self.diagnosis.advice}"
        tail = last_error(list(self.ring))
        code = self._proc.returncode if self._proc is not None else None
        exit_text = f" (exit code {code})" if code is not None else ""
        hint = f"; last error line: {tail[:300]}" if tail else ""
        return f"{what}{exit_text}{hint}. See `traylm logs {self.engine_id}`."

    def _set_state(self, state: EngineState, detail: str) -> None:
        previous = self.state
        self.state = state
        self.detail = detail
        if state in (EngineState.STOPPED, EngineState.FAILED) and previous != state:
            self.released_at_s = time.monotonic()
        self._notify_change()
        log.info("engine %s: %s → %s (%s)", self.engine_id, previous, state, detail)
        self._publish(
            EngineStateChanged(
                engine_id=self.engine_id,
                state=state,
                previous=previous,
                engine=self.profile.engine,
                served_names=self.served_names,
                port=self.port,
                pid=self.pid,
                detail=detail,
                restarts=self.restarts,
                diagnosis=self.diagnosis if state == EngineState.FAILED else None,
            )
        )


async def _drain(task: asyncio.Task[None]) -> None:
    try:
        await asyncio.wait_for(task, 2.0)
    except (TimeoutError, asyncio.CancelledError):
        task.cancel()


class EngineView(Protocol):
    """The engines the daemon runs, read-only (GPU telemetry, hub, TensorRT-LLM cache)."""

    @property
    def engines(self) -> Mapping[str, ManagedEngine]: ...


class RoutingView(EngineView, Protocol):
    """How the gateway (and a benchmark) finds the engine for a model name. ``Supervisor`` is
    the one implementation today; models on demand will put a catalog in front of it (start the
    engine a request asks for, stop idle ones) behind this same view."""

    def route(self, model: str) -> ManagedEngine | None:
        """The engine serving ``model``: a ready one first, else one starting or stopping;
        None when no engine serves that name."""
        ...

    def served_models(self) -> list[tuple[str, ManagedEngine]]:
        """(served name, engine) for every ready engine (GET /v1/models)."""
        ...


class Supervisor:
    """The engines the daemon runs, keyed by engine id (the profile name). Implements
    RoutingView."""

    def __init__(self) -> None:
        self.engines: dict[str, ManagedEngine] = {}
        self._forgotten_released_s = 0.0

    def add(self, engine: ManagedEngine) -> None:
        current = self.engines.get(engine.engine_id)
        if current is not None and current.state not in (EngineState.STOPPED, EngineState.FAILED):
            raise EngineError(
                f"engine {engine.engine_id!r} is {current.state}; stop it first "
                f"(`traylm stop {engine.engine_id}`)"
            )
        if current is not None:
            self._forget(current)
        self.engines[engine.engine_id] = engine

    def get(self, engine_id: str) -> ManagedEngine | None:
        return self.engines.get(engine_id)

    def remove(self, engine_id: str) -> None:
        """Forget a stopped engine (a failed start the user stopped: nothing left to show)."""
        engine = self.engines.get(engine_id)
        if engine is not None and engine.state == EngineState.STOPPED:
            self._forget(engine)
            del self.engines[engine_id]

    def _forget(self, engine: ManagedEngine) -> None:
        self._forgotten_released_s = max(self._forgotten_released_s, engine.released_at_s)

    def released_at_s(self) -> float:
        """Monotonic time the last engine went down, forgotten ones included (the tuner
        forgets each candidate it stopped): GPU memory may have been freed since then."""
        return max([self._forgotten_released_s, *(e.released_at_s for e in self.engines.values())])

    def route(self, model: str) -> ManagedEngine | None:
        """The engine serving ``model`` (a served name or alias): a ready one first, else one
        that is starting (the gateway answers 503 + Retry-After for those)."""
        matches = [e for e in self.engines.values() if model in e.served_names]
        for state in (EngineState.READY, EngineState.STARTING, EngineState.STOPPING):
            for engine in matches:
                if engine.state == state:
                    return engine
        return matches[0] if matches else None

    def served_models(self) -> list[tuple[str, ManagedEngine]]:
        return [
            (name, e)
            for e in self.engines.values()
            if e.state == EngineState.READY
            for name in e.served_names
        ]

    async def stop_all(self, reason: str = DAEMON_STOPPING) -> None:
        await asyncio.gather(*(e.stop(reason) for e in self.engines.values()))
