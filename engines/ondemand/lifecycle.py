"""Loading and unloading models: one load per model however many requests wait (single
flight), placement with eviction, the idle TTL, ``keep_alive``, pins, and unloads that wait
for the last request instead of cutting a stream.

Every change of what is loaded (a load's placement and start, an eviction, an unload) runs under
one lock, so two cold models never take the same free memory; waiting for an engine to become
ready happens outside it. Nothing polls for readiness: a load waits on the engine's state
transition (``ManagedEngine.wait_state``).

How long a model stays loaded once idle (no request running or queued):

- loaded on demand (a request): the profile's ``idle_ttl_s``, else ``engines.idle_ttl_s``; a
  request's ``keep_alive`` replaces it (0: unload when that request ends; negative: never);
- loaded with `traylm load` (``--ttl`` or the profile's ``idle_ttl_s``, else never) or started
  with `traylm start` (the profile's ``idle_ttl_s``, else never): requests' ``keep_alive`` does
  not change it;
- pinned: never unloaded, never evicted, until `traylm unload`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from engines.config.live import SettingsView
from engines.config.profiles import MAX_REPLICAS, Profile, replica_id
from engines.errors import EngineError, ModelUnavailable, TraylmError
from engines.events.codec import Event
from engines.events.core import EngineState, EngineStatus
from engines.events.models import Eviction, ModelLoading, ModelStateChanged, ModelStatus
from engines.ondemand.catalog import Entry
from engines.ondemand.occupancy import Activity, Booking, Room
from engines.runtime.supervisor import ManagedEngine

log = logging.getLogger(__name__)

IDLE_CHECK_S = 1.0  # an idle model unloads within a second of its limit
PROGRESS_CHECK_S = 1.0  # a load's phase follows the engine's changes; this bounds a missed one
SETTLED = frozenset({EngineState.READY, EngineState.FAILED, EngineState.STOPPED})

StartEngine = Callable[[Profile], Awaitable[EngineStatus]]
"""Start a placed profile (EngineControl.start_engine with ``placed=True``)."""
CheckStart = Callable[[Profile], Awaitable[None]]
"""Every check of a start that needs no placement (EngineControl.check_start): the engine env,
trust, a Hub model that cannot be fetched offline, the flags. Raises TraylmError."""


class Engines(Protocol):
    """The engines the daemon runs (the Supervisor)."""

    @property
    def engines(self) -> Mapping[str, ManagedEngine]: ...

    def get(self, engine_id: str) -> ManagedEngine | None: ...

    def released_at_s(self) -> float:
        """Monotonic time the last engine went down (forgotten ones included)."""
        ...


Place = Callable[["LoadFlight", Profile, tuple[int, ...] | None, int], Awaitable[Room]]
"""Placement (placing.py): where that many copies of the profile go, each on concrete GPUs,
and the evictions that make room for them (``Lifecycle.make_room`` carries them out)."""


@dataclass
class Residency:
    """How traylm keeps one loaded model."""

    engine_id: str
    name: str
    origin: str  # jit | load | start
    ttl_s: float  # 0: never
    pinned: bool
    booking: Booking
    keep_alive_s: float | None = None
    unload_when_idle: bool = False
    ready_at_s: float | None = None
    """When traylm first saw the engine ready (monotonic): its idle time counts from then, not
    from the booking, so a slow start does not use up the TTL before the first request."""

    def idle_limit_s(self) -> float | None:
        """Seconds of idleness after which it unloads; None: never."""
        if self.pinned:
            return None
        if self.unload_when_idle:
            return 0.0
        if self.origin == "jit" and self.keep_alive_s is not None:
            return None if self.keep_alive_s < 0 else self.keep_alive_s
        return self.ttl_s if self.ttl_s > 0 else None

    def reason(self) -> str:
        if self.unload_when_idle:
            return "asked"
        return "keep_alive" if self.origin == "jit" and self.keep_alive_s is not None else "idle"


@dataclass
class LoadFlight:
    """One load in progress; every request for the model waits on ``task``."""

    entry: Entry
    origin: str
    started_s: float = field(default_factory=time.monotonic)
    phase: str = "queued"
    detail: str = ""
    begun: asyncio.Future[ManagedEngine] = field(default_factory=asyncio.Future)
    """Set once the model is placed and its engine starting (or the load failed before)."""
    task: asyncio.Task[ManagedEngine] | None = None

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started_s


class Lifecycle:
    def __init__(
        self,
        *,
        engines: Engines,
        start_engine: StartEngine,
        place: Place,
        settings: SettingsView,
        publish: Callable[[Event], None],
        activity: Activity,
        check_start: CheckStart | None = None,
    ) -> None:
        self._engines = engines
        self._start = start_engine
        self._check_start = check_start
        self._place = place
        self._settings = settings
        self._publish = publish
        self._activity = activity
        self.residency: dict[str, Residency] = {}
        self.flights: dict[str, LoadFlight] = {}
        self.draining: set[str] = set()
        """Engines being unloaded: the gateway routes nothing new to them."""
        self.lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()

    # ----------------------------------------------------------------- loads

    def flight(self, entry: Entry, origin: str, gpus: tuple[int, ...] | None = None) -> LoadFlight:
        """The load of ``entry`` in progress, or a new one (single flight per engine id)."""
        current = self.flights.get(entry.engine_id)
        if current is not None:
            return current
        f = LoadFlight(entry, origin)
        f.task = asyncio.create_task(self._load(f, gpus), name=f"load:{entry.engine_id}")
        self.flights[entry.engine_id] = f

        def finished(task: asyncio.Task[ManagedEngine]) -> None:
            if self.flights.get(entry.engine_id) is f:
                del self.flights[entry.engine_id]
            if not task.cancelled():
                task.exception()  # retrieved: the waiters got it (or there were none)
            if f.begun.done() and not f.begun.cancelled():
                f.begun.exception()

        f.task.add_done_callback(finished)
        return f

    async def _load(self, f: LoadFlight, gpus: tuple[int, ...] | None) -> ManagedEngine:
        try:
            engine = await self._begin(f, gpus)
        except asyncio.CancelledError:
            f.begun.cancel()
            raise
        except Exception as exc:
            if not f.begun.done():
                f.begun.set_exception(exc)
            if isinstance(exc, ModelUnavailable):
                self._failed(f, exc.message)
            raise
        f.begun.set_result(engine)
        return await self._until_ready(f, engine)

    async def _begin(self, f: LoadFlight, gpus: tuple[int, ...] | None) -> ManagedEngine:
        """Under the lock: every engine of the model up or starting (its replicas placed
        together); returns its first."""
        running = self._engines.get(f.entry.engine_id)
        if running is None or running.state in (EngineState.STOPPED, EngineState.FAILED):
            await self._check(f)  # before the lock and the placement: a doomed start evicts none
        self._phase(f, "queued", "waiting for another load or unload")
        async with self.lock:
            assert f.entry.profile is not None
            ids = replica_ids(f.entry)
            down = [i for i in ids if await self._up(f, i) is None]
            if down:
                self._phase(f, "placing", "")
                room = await self._place(f, f.entry.profile, gpus, len(down))
                placed = await self.make_room(room, f)
                for engine_id, (profile, booking) in zip(down, placed, strict=True):
                    await self._start_one(f, dataclasses.replace(profile, name=engine_id), booking)
            first = self._engines.get(ids[0])
            assert first is not None
            return first

    async def _up(self, f: LoadFlight, engine_id: str) -> ManagedEngine | None:
        """The engine ``engine_id`` of the model, running, starting or woken up; None when it
        must be placed and started (called under ``lock``)."""
        engine = self._engines.get(engine_id)
        if engine is not None and engine_id not in self.draining:
            if engine.state in (EngineState.READY, EngineState.STARTING):
                return engine  # already there, or started by someone else
            if engine.state == EngineState.SLEEPING:
                await self._wake(f, engine)
                return engine
        if engine is not None and engine.state == EngineState.STOPPING:
            await engine.wait_state((EngineState.STOPPED, EngineState.FAILED))
        return None

    async def _start_one(self, f: LoadFlight, profile: Profile, booking: Booking) -> None:
        on_gpus = profile.gpus and profile.device != "cpu"  # a CPU profile's gpus mean nothing
        where = f"on GPU {_gpus(profile.gpus)}" if on_gpus else ""
        replica = "" if profile.name == f.entry.engine_id else f"{profile.name} "
        self._phase(f, "starting", f"{replica}{where}".strip())
        try:
            await self._start(profile)
        except TraylmError as exc:
            raise ModelUnavailable(
                f"{f.entry.name} cannot load: {exc.message}", code=exc.code
            ) from exc
        self.residency[profile.name] = self._residency(f, profile, booking)

    async def _check(self, f: LoadFlight) -> None:
        if self._check_start is None or f.entry.profile is None:
            return
        try:
            await self._check_start(f.entry.profile)
        except TraylmError as exc:
            # what this computer lacks (a GPU, an engine env) fails the same way next time:
            # a 400, which no client retries; a Hub that did not answer may answer later
            status = 400 if exc.http_status < 500 else 503
            raise ModelUnavailable(
                f"{f.entry.name} cannot load: {exc.message}", code=exc.code, http_status=status
            ) from exc

    async def _until_ready(self, f: LoadFlight, engine: ManagedEngine) -> ManagedEngine:
        """Wait for every engine of the model to settle: loaded when one is ready (a replica
        that failed is said in the log and `traylm ps`), failed when none is."""
        engines = [e for i in replica_ids(f.entry) if (e := self._engines.get(i)) is not None]
        for one in engines:
            while one.state not in SETTLED:
                self._phase(f, "starting", one.stage)  # at each start phase: "loading weights"
                await one.wait_change(PROGRESS_CHECK_S)
        ready = [e for e in engines if e.state == EngineState.READY]
        for one in ready:
            self._seen_ready(one.engine_id, time.monotonic())
        for failed in (e for e in engines if e.state != EngineState.READY and ready):
            log.warning("%s: %s did not start: %s", f.entry.name, failed.engine_id, failed.detail)
        if ready:
            self._publish(
                ModelStateChanged(
                    name=f.entry.name,
                    engine_id=engine.engine_id,
                    status=ModelStatus.LOADED,
                    state=str(EngineState.READY),
                    gpus=tuple(g for e in ready for g in e.profile.gpus),
                    reason="asked" if f.origin == "load" else "request",
                    detail=f"loaded in {f.elapsed_s:.1f} s"
                    + (f" ({len(ready)} of {len(engines)} replicas)" if len(engines) > 1 else ""),
                )
            )
            return engine
        message = f"{f.entry.name} failed to load: {engine.detail}"
        self._failed(f, message)
        raise ModelUnavailable(message, code="model_load_failed")

    async def _wake(self, f: LoadFlight, engine: ManagedEngine) -> None:
        self._phase(f, "placing", "making room to wake it")
        await self.make_room(await self._place(f, engine.profile, engine.profile.gpus, 1), f)
        self._phase(f, "waking", "weights back to the GPU")
        try:
            await engine.wake()
        except EngineError as exc:
            raise ModelUnavailable(
                f"{f.entry.name} did not wake up: {exc.message}", code="model_load_failed"
            ) from exc

    def _residency(self, f: LoadFlight, profile: Profile, booking: Booking) -> Residency:
        default = self._settings.current.engines.idle_ttl_s if f.origin == "jit" else 0.0
        ttl = profile.idle_ttl_s if profile.idle_ttl_s is not None else default
        return Residency(profile.name, f.entry.name, f.origin, ttl, False, booking)

    def _phase(self, f: LoadFlight, phase: str, detail: str) -> None:
        if (phase, detail) == (f.phase, f.detail):
            return
        f.phase, f.detail = phase, detail
        self._publish(
            ModelLoading(
                name=f.entry.name,
                engine_id=f.entry.engine_id,
                phase=phase,
                elapsed_s=f.elapsed_s,
                detail=detail,
            )
        )

    def _failed(self, f: LoadFlight, message: str) -> None:
        log.warning("load of %s failed: %s", f.entry.name, message)
        self._publish(
            ModelStateChanged(
                name=f.entry.name,
                engine_id=f.entry.engine_id,
                status=ModelStatus.UNLOADED,
                state="failed",
                reason="failed",
                detail=message,
            )
        )

    # ----------------------------------------------------------------- evictions, unloads

    async def make_room(
        self, room: Room, f: LoadFlight | None = None
    ) -> list[tuple[Profile, Booking]]:
        """Carry out the evictions ``room`` plans (called under ``lock``), in order, then book
        its copies. A load's flight ``f`` says each one (phase "evicting") to the clients that
        follow the load."""
        for eviction in room.evictions:
            if f is not None:
                self._phase(f, "evicting", f"{eviction.action} {eviction.engine_id}")
            await self.evict(eviction)
        return room.copies(time.monotonic())

    async def evict(self, eviction: Eviction, reason: str = "evicted") -> None:
        """Free memory as planned (called under ``lock``). A request that arrived since the
        plan keeps its model: the load then answers 503 with Retry-After. ``reason``: what
        the model's ``model.state`` event says (``room``: made room for another program)."""
        engine = self._engines.get(eviction.engine_id)
        if engine is None:
            return
        in_flight, waiting, _ = self._activity(engine.engine_id)
        if in_flight or waiting:
            raise ModelUnavailable(
                f"{engine.engine_id} got requests while it was being unloaded to make room; "
                "retry in a moment",
                code="insufficient_gpu_memory",
                retry_after_s=2,
                retry=True,
            )
        res = self.residency.get(engine.engine_id)
        name = res.name if res else engine.engine_id
        if eviction.action == "sleep":
            await engine.sleep()
            self._unloaded(name, engine, reason, status=ModelStatus.UNLOADED)
            return
        await self._stop(engine, reason)

    async def _stop(self, engine: ManagedEngine, reason: str) -> None:
        """Stop an engine that serves nothing now (called under ``lock``)."""
        res = self.residency.get(engine.engine_id)
        name = res.name if res else engine.engine_id
        self.draining.add(engine.engine_id)
        try:
            await engine.stop(f"unloaded ({reason})")
        finally:
            self.draining.discard(engine.engine_id)
            self.residency.pop(engine.engine_id, None)
        self._unloaded(name, engine, reason, status=ModelStatus.UNLOADED)

    def _unloaded(
        self, name: str, engine: ManagedEngine, reason: str, *, status: ModelStatus
    ) -> None:
        log.info("%s (%s): %s (%s)", name, engine.engine_id, engine.state, reason)
        self._publish(
            ModelStateChanged(
                name=name,
                engine_id=engine.engine_id,
                status=status,
                state=str(engine.state),
                gpus=engine.profile.gpus,
                reason=reason,
            )
        )

    async def unload(self, engine: ManagedEngine, reason: str) -> bool:
        """Unload now when nothing runs on it; with requests in flight or queued the unload
        waits for the last one (returns False: deferred). Never cuts a stream."""
        res = self.residency.get(engine.engine_id)
        async with self.lock:
            in_flight, waiting, _ = self._activity(engine.engine_id)
            if in_flight or waiting:
                if res is None:
                    res = self.adopt(engine)
                res.unload_when_idle = True
                return False
            await self._stop(engine, reason)
            return True

    def adopt(self, engine: ManagedEngine) -> Residency:
        """A residency for an engine traylm did not place (started before it booked it)."""
        booking = Booking(0, None, time.monotonic())
        res = Residency(engine.engine_id, engine.engine_id, "start", 0.0, False, booking)
        self.residency[engine.engine_id] = res
        return res

    # ----------------------------------------------------------------- idle unload

    async def run_idle(self) -> None:
        while True:
            await asyncio.sleep(IDLE_CHECK_S)
            try:
                self._idle_tick(time.monotonic())
            except Exception:  # boundary: the idle timer must survive a bug in one tick
                log.exception("idle check failed")

    def idle_for_s(self, res: Residency, now_s: float) -> float | None:
        """Seconds the model has been idle; the replicas of one model count together (they
        unload together, not the one the balancer happened to spare)."""
        group = [res, *(r for r in self.residency.values() if r.name == res.name and r is not res)]
        since = 0.0
        for one in group:
            in_flight, waiting, idle_since = self._activity(one.engine_id)
            if in_flight or waiting:
                return None
            if one.ready_at_s is None:
                return 0.0  # not seen ready yet
            since = max(since, idle_since or 0.0, one.booking.loaded_at_s, one.ready_at_s)
        return now_s - since

    def _seen_ready(self, engine_id: str, now_s: float) -> None:
        res = self.residency.get(engine_id)
        if res is not None and res.ready_at_s is None:
            res.ready_at_s = now_s

    def _idle_tick(self, now_s: float) -> None:
        for engine_id, res in list(self.residency.items()):
            engine = self._engines.get(engine_id)
            if engine is None:
                continue  # booked just before its start (`traylm start`)
            if engine.state in (EngineState.STOPPED, EngineState.FAILED):
                if engine_id not in self.flights:
                    self.residency.pop(engine_id, None)
                continue
            if engine.state not in (EngineState.READY, EngineState.SLEEPING):
                continue
            self._seen_ready(engine_id, now_s)
            if engine_id in self.draining or engine_id in self.flights:
                continue
            limit = res.idle_limit_s()
            idle = self.idle_for_s(res, now_s)
            if limit is None or idle is None or idle < limit:
                continue
            self._spawn(self._unload_idle(engine, res))

    async def _unload_idle(self, engine: ManagedEngine, res: Residency) -> None:
        async with self.lock:
            if self.residency.get(engine.engine_id) is not res:
                return  # unloaded or reloaded meanwhile
            limit = res.idle_limit_s()
            idle = self.idle_for_s(res, time.monotonic())
            if limit is None or idle is None or idle < limit:
                return  # a request came in meanwhile
            if engine.state in (EngineState.READY, EngineState.SLEEPING):
                await self._stop(engine, res.reason())

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        for task in [*self._tasks, *(f.task for f in self.flights.values() if f.task)]:
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task


def replica_ids(entry: Entry) -> list[str]:
    """The engine ids of an entry's engines: its own, then ``NAME.r2``... (profile
    ``replicas``)."""
    count = entry.profile.replicas if entry.profile is not None else 1
    return [replica_id(entry.engine_id, k) for k in range(1, min(count, MAX_REPLICAS) + 1)]


def _gpus(gpus: Collection[int]) -> str:
    return ",".join(str(g) for g in gpus)
