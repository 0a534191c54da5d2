"""The life loop of a ManagedEngine (engine.py, its public face): each life started
(start.py), watched once ready (watch.py) and ended (process.py), restarted after a crash with
capped exponential backoff, and every change of state published as ``EngineStateChanged``."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from pathlib import Path

from engines.config.profiles import Profile
from engines.config.sections import EngineSettings
from engines.core.procs import PidRegistry, free_loopback_port
from engines.errors import TraylmError
from engines.events.core import Diagnosis, EngineStartPhase, EngineState, EngineStateChanged
from engines.runtime.adapters.base import EngineAdapter, EngineRuntime, LaunchSpec
from engines.runtime.log import EngineLog
from engines.runtime.phase_tracker import PhaseTracker
from engines.runtime.ports import Prepare, Publish, Ranks
from engines.runtime.process import EngineProcess
from engines.runtime.start import prepare_warm, spawn, wait_until_ready
from engines.runtime.supervision import Supervision
from engines.runtime.traffic import ENGINE_ERROR, EngineTraffic
from engines.runtime.warm import WarmPool
from engines.runtime.watch import Watch

log = logging.getLogger(__name__)


class EngineLife:
    """One engine's lives and the state they change; ManagedEngine adds the public API."""

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
        self._log = EngineLog(
            engine_id,
            path=log_path,
            ring_lines=settings.log_ring_lines,
            adapter=adapter,
            publish=publish,
            on_line=self._phase_line,
        )
        self.ring: collections.deque[str] = self._log.ring
        self.started_at_s: float | None = None
        self.ready_at_s: float | None = None
        self.released_at_s = 0.0
        """Monotonic time the engine last went down (stopped or failed: its processes gone,
        and their GPU memory with them)."""
        self.served_names = profile.served_names
        self._process: EngineProcess | None = None
        self._task: asyncio.Task[None] | None = None
        self._want_running = False
        self._ready_event = asyncio.Event()
        self._changed = asyncio.Event()
        self._spec: LaunchSpec | None = None
        self._supervision = Supervision(engine_id)
        self._phases = PhaseTracker(engine_id)

    @property
    def diagnosis(self) -> Diagnosis | None:
        """Why the engine failed (or what went wrong last), from its log or its start."""
        return self._log.diagnosis

    @diagnosis.setter
    def diagnosis(self, value: Diagnosis | None) -> None:
        self._log.diagnosis = value

    @property
    def supervision(self) -> str:
        """What keeps the supervisor from watching this engine fully right now (it retries),
        or "" (shown by `traylm status`)."""
        return self._supervision.text

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

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

    # ----------------------------------------------------------------- the life loop

    async def _run(self) -> None:
        try:
            if not await self._prepare_launch():
                return
            while self._want_running:
                outcome = await self._one_life()
                if outcome in ("stopped", "start_failed") or not self._want_running:
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
        self._log.open(["===== traylm: preparing (before the first launch)"])
        try:
            self.profile, self.model = await self._prepare(self._log.line)
        except TraylmError as exc:
            self._set_state(EngineState.FAILED, self._failure_text(exc.message))
            return False
        finally:
            self._log.close()
        return True

    async def _begin_ranks(self) -> Profile | None:
        """The profile this box's rank launches with (the other ranks started), or None when
        they could not be started (the engine failed)."""
        if self._ranks is None:
            return self.profile
        self._log.open(["===== traylm: the ranks on the other boxes"])
        try:
            return await self._ranks.begin(self._log.line)
        except TraylmError as exc:
            self.diagnosis = None
            self._set_state(EngineState.FAILED, f"cannot start: {exc.message}")
            return None
        finally:
            self._log.close()

    async def _one_life(self) -> str:
        """Spawn, wait for ready, watch until exit. Returns start_failed|crashed, or
        spawn_failed when no process could be started."""
        profile = await self._begin_ranks()
        if profile is None:
            return "start_failed"
        self.port = free_loopback_port()
        spec = self._spec = self.adapter.launch(
            profile, runtime=self.runtime, port=self.port, model=self.model
        )
        if self.state != EngineState.STARTING:
            self._set_state(EngineState.STARTING, f"starting on 127.0.0.1:{self.port}")
        else:
            self.detail = f"starting on 127.0.0.1:{self.port}"
        try:
            process = await self._spawn(spec)
        except OSError as exc:  # no process: out of descriptors or memory, a missing binary
            self._log.close()
            if self._ranks is not None:
                await self._ranks.end()
            self._supervision.trouble("cannot start the engine process", exc)
            return "spawn_failed"
        # the port and pid exist now: say so (every view shows them while it starts)
        self._set_state(EngineState.STARTING, self.detail)
        reader = asyncio.create_task(self._log.read(process.proc), name=f"logs:{self.engine_id}")
        try:
            if not await self._ready(process, spec):
                await self._terminate()
                await _drain(reader)
                self._set_state(EngineState.FAILED, self._failure_text("failed to start"))
                return "start_failed"
            await prepare_warm(spec, engine_id=self.engine_id, warm=self._warm)
            await self._crashed(self._watch(process, spec), reader)
            return "crashed"
        except asyncio.CancelledError:
            reader.cancel()
            raise

    async def _spawn(self, spec: LaunchSpec) -> EngineProcess:
        proc = await spawn(
            spec,
            engine_id=self.engine_id,
            run_dir=self.run_dir,
            warm=self._warm,
            engine_log=self._log,
        )
        process = self._process = EngineProcess(
            self.engine_id, proc, pids=self._pids, supervision=self._supervision
        )
        self.started_at_s = time.time()
        self.ready_at_s = None
        self._phases = PhaseTracker(self.engine_id, spec.phases)
        self._publish_phase(self._phases.begin())
        process.record()
        log.info("engine %s started: pid %d port %s", self.engine_id, proc.pid, self.port)
        return process

    async def _ready(self, process: EngineProcess, spec: LaunchSpec) -> bool:
        """Wait until the engine is ready and say so; False when it will not be."""
        ready = await wait_until_ready(
            process,
            spec,
            base_url=self.base_url,
            timeout_s=self.settings.ready_timeout_s,
            ranks=self._ranks,
            engine_log=self._log,
            supervision=self._supervision,
        )
        if ready:
            self.ready_at_s = time.time()
            self._publish_phase(self._phases.ready())
            self._ready_event.set()
            self._set_state(EngineState.READY, f"serving on 127.0.0.1:{self.port}")
        return ready

    def _watch(self, process: EngineProcess, spec: LaunchSpec) -> Watch:
        return Watch(
            self.engine_id,
            process,
            spec,
            base_url=self.base_url,
            metrics_url=self.metrics_url,
            engine=self.profile.engine,
            settings=self.settings,
            traffic=self._traffic,
            ranks=self._ranks,
            supervision=self._supervision,
            state=lambda: self.state,
            looked=self._stable_check,
        )

    def _stable_check(self) -> None:
        """Ready for ``stable_after_s`` since its last restart: the crash count starts over."""
        if (
            self.restarts
            and self.ready_at_s
            and time.time() - self.ready_at_s > self.settings.stable_after_s
        ):
            self.restarts = 0

    async def _crashed(self, watch: Watch, reader: asyncio.Task[None]) -> None:
        """Watch the ready engine until its verdict, then end what is left of it."""
        verdict = await watch.verdict()
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

    def _end_requests(self, why: str, type_: str = ENGINE_ERROR) -> None:
        traffic = self._traffic
        if traffic is not None and (ended := traffic.end_all(self.engine_id, why, type_)):
            log.info("engine %s: ended %d request(s) in flight: %s", self.engine_id, ended, why)

    async def _terminate(self) -> None:
        """End the engine's process group (engines.core.procs.end_group) and forget it."""
        process = self._process
        if process is None:
            return
        ranks = self._ranks.end if self._ranks is not None else None
        left = await process.end(self.settings.stop_timeout_s, ranks)
        if left:
            log.error("engine %s: processes %s survived SIGKILL", self.engine_id, left)
            self.detail = f"processes {left} survived SIGKILL"
        process.forget()
        self._process = None
        self._log.close()

    # ----------------------------------------------------------------- state and events

    def _phase_line(self, line: str) -> None:
        self._publish_phase(self._phases.feed(line))

    def _publish_phase(self, event: EngineStartPhase | None) -> None:
        if event is not None:
            log.info("engine %s: %s at %.1f s", self.engine_id, event.phase, event.elapsed_s)
            self._notify_change()
            self._publish(event)

    def _notify_change(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _failure_text(self, what: str) -> str:
        code = self._process.returncode if self._process is not None else None
        return self._log.failure_text(what, code)

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
