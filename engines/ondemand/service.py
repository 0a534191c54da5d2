"""``ModelsOnDemand``: the daemon's models-on-demand feature. It is the gateway's model router
(``upstream`` for a loaded model, ``load`` for a cold one, ``keep_alive``, ``listing``), the
placement behind `traylm load`, `traylm start` and the fit badges, and `traylm ps`/`unload`/
`attach`. Its routes are engines/ondemand/routes.py.

Events: ``model.state`` (ModelStateChanged), ``model.loading`` (ModelLoading),
``attached.state`` (AttachedChanged).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from typing import Protocol

from engines.config.live import SettingsView
from engines.config.profiles import MAX_REPLICAS, Profile, ProfileStore, replica_id
from engines.config.replica_ids import replica_base
from engines.core.bus import EventBus
from engines.core.modelinfo import read_model_info
from engines.errors import ModelUnavailable, TraylmError, quoted
from engines.events.codec import Event
from engines.events.core import EngineState, EngineStatus, EnvInstallProgress
from engines.events.gpu import GPUSnapshot
from engines.events.hub import LocalFolder, LocalModel
from engines.events.models import (
    LoadedModel,
    ModelStatus,
    Placement,
    ReplicaInfo,
    ServableModel,
    SetupProposal,
)
from engines.events.peers import BoxModel
from engines.gateway.balance import Affinity, Balancer, Replica
from engines.gateway.loading import PROGRESS_PERIOD_S, LoadProgress, Progress
from engines.gateway.upstream import Upstream
from engines.ondemand import proposals, views
from engines.ondemand.attach import AttachedServers
from engines.ondemand.catalog import Catalog, Entry, FolderSource, LibrarySource, ProfileSource
from engines.ondemand.lifecycle import Engines, Lifecycle, LoadFlight
from engines.ondemand.occupancy import HOLDING
from engines.ondemand.parts import Parts
from engines.ondemand.placing import Placer
from engines.ondemand.room_maker import RoomMaker
from engines.ondemand.tools import tools_blocked
from engines.ondemand.verdicts import StartVerdicts
from engines.runtime.supervisor import ManagedEngine

log = logging.getLogger(__name__)

CATALOG_REFRESH_S = 30.0
ENDED = frozenset({"done", "failed", "cancelled"})
"""The phases that end an engine-env install."""


class SupervisorView(Engines, Protocol):
    """The Supervisor, as this feature reads it."""

    def route(self, model: str) -> ManagedEngine | None: ...


class Boxes(Protocol):
    """The models paired boxes serve, as replicas here (engines/peers/replicas.py)."""

    def serving(self, model: str) -> list[Upstream]:
        """The upstreams of the boxes that serve ``model`` now (dict lookups only)."""
        ...

    def away(self, model: str) -> str:
        """Why the box that last served ``model`` does not now (it names the box), or ""."""
        ...

    def rows(self) -> list[LoadedModel]:
        """`traylm ps`: each box's models, with the box and its GPUs."""
        ...

    def listed(self, known: set[str]) -> list[ServableModel]:
        """/v1/models: the models the boxes serve whose names are not in ``known``."""
        ...

    def copies(self, names: Collection[str]) -> tuple[ReplicaInfo, ...]:
        """/v1/models: the boxes' copies of a model this box lists too (by any of ``names``)."""
        ...


class ModelsOnDemand:
    name = "ondemand"

    def __init__(
        self,
        *,
        settings: SettingsView,
        engines: SupervisorView,
        profiles: ProfileStore,
        publish: Callable[[Event], None],
        attached_file: Path,
        bus: EventBus,
        boxes: Boxes | None = None,
    ) -> None:
        """No I/O. ``bus``: where an engine-env install's end and library changes are heard
        (the servable list's verdicts are then checked again). What this feature uses of the
        parts built after it comes with ``connect``; ``boxes``: the paired boxes' replicas
        (engines/peers/replicas.py)."""
        self._settings = settings
        self._boxes = boxes
        self._engines = engines
        self._parts: Parts | None = None
        self._publish = publish
        self.profiles = profiles
        self.attached = AttachedServers(attached_file, publish)
        self.catalog = Catalog(
            [
                ProfileSource(profiles, self._weights_of),
                LibrarySource(self._library_models, self._profile_names),
                self.attached,
                FolderSource(self._folders, self._profile_names),
            ]
        )
        self.verdicts = StartVerdicts(self._check_start)
        self._bus = bus
        self.lifecycle = Lifecycle(
            engines=engines,
            start_engine=self._start_placed,
            place=lambda f, profile, gpus, count: self.placer.place_copies(f, profile, gpus, count),
            settings=settings,
            publish=publish,
            activity=self.activity,
            check_start=self._check_start,
        )
        self.placer = Placer(
            settings=settings,
            engines=engines,
            lifecycle=self.lifecycle,
            latest=self._latest,
            sample_after=self._sample_after,
            activity=self.activity,
        )
        self.room_maker = RoomMaker(
            settings=settings,
            engines=engines,
            lifecycle=self.lifecycle,
            infos=lambda: self.placer.infos,
            freeing=self.placer.freeing,
            bring_back=self._bring_back,
            sample_after=self._sample_after,
            publish=publish,
        )
        """Frees a card for another program that needs its memory (room_maker.py)."""
        self.balancer = Balancer()
        self._library_sizes: dict[str, int] = {}
        self._library_read_s = -CATALOG_REFRESH_S
        self._tasks: list[asyncio.Task[None]] = []

    # ----------------------------------------------------------------- the parts built after it

    def connect(self, parts: Parts) -> None:
        """The parts this feature uses that need it first (parts.py); once, before ``start``."""
        if self._parts is not None:
            raise RuntimeError("models on demand is connected to its parts already")
        self._parts = parts

    @property
    def parts(self) -> Parts:
        if self._parts is None:
            raise RuntimeError("models on demand is used before the daemon connected its parts")
        return self._parts

    async def _start_placed(self, profile: Profile) -> EngineStatus:
        return await self.parts.control.start_engine(profile, placed=True)

    async def _check_start(self, profile: Profile) -> None:
        await self.parts.control.check_start(profile)

    def activity(self, upstream: str) -> tuple[int, int, float | None]:
        """(in flight, queued, idle since) of one upstream, as the gateway admits it."""
        return self.parts.gateway.activity(upstream)

    def _latest(self) -> tuple[GPUSnapshot, ...]:
        return self.parts.gpus.sampler.latest

    async def _sample_after(self, after_s: float) -> None:
        await self.parts.gpus.sample_after(after_s)

    def _library_models(self) -> list[LocalModel]:
        return self.parts.hub.library.models()

    def _folders(self) -> list[LocalFolder]:
        return self.parts.hub.folders.list()

    def _profile_names(self) -> set[str]:
        return set(self.profiles.names())

    # ----------------------------------------------------------------- Feature

    async def start(self) -> None:
        self.placer.infos = await self.parts.gpus.inventory.gpus()
        await self.attached.start()
        await self.catalog.refresh()
        self._tasks = [
            asyncio.create_task(self.lifecycle.run_idle(), name="ondemand idle"),
            asyncio.create_task(self._refresh_loop(), name="ondemand catalog"),
        ]
        self._tasks.append(
            asyncio.create_task(self._forget_on_changes(self._bus), name="ondemand verdicts")
        )
        self._tasks.append(
            asyncio.create_task(self.room_maker.run(self._bus), name="ondemand room maker")
        )

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.lifecycle.stop()
        await self.attached.stop()

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(CATALOG_REFRESH_S)
            await self.catalog.refresh()

    async def _forget_on_changes(self, bus: EventBus) -> None:
        """An engine env installed (or not) or the library changed: the servable list's
        verdicts are checked again at the next listing. Wakes only on those events."""
        with bus.subscribe(frozenset({"env.install", "library.changed"})) as sub:
            while True:
                event = await sub.get()
                if not isinstance(event, EnvInstallProgress) or event.phase in ENDED:
                    self.verdicts.forget()

    @property
    def engines(self) -> Mapping[str, ManagedEngine]:
        return self._engines.engines

    # ----------------------------------------------------------------- the gateway's router

    def upstream(self, model: str, affinity: Affinity | None = None) -> Upstream | None:
        entry = self.catalog.index.by_name.get(model)
        if entry is not None and entry.kind == "attached":
            return self.attached.upstream(entry.engine_id, model)
        ready = self._ready(self.replicas(entry.engine_id)) if entry is not None else []
        if not ready:
            # an engine serving the name outside the catalog (`traylm start --model`, the
            # tuner's candidates)
            ready = self._ready(
                e for e in self._engines.engines.values() if model in e.served_names
            )
        if not ready and (routed := self._engines.route(model)) is not None:
            ready = self._ready([routed])
        boxes = self._boxes.serving(model) if self._boxes and affinity and affinity.boxes else []
        if len(ready) + len(boxes) <= 1:
            return _engine_upstream(ready[0], model) if ready else next(iter(boxes), None)
        # several replicas (this box's engines, paired boxes'): the balancer's pick (fewest
        # outstanding, the conversation's own while not much busier)
        names = [e.engine_id for e in ready] + [up.name for up in boxes]
        now = time.monotonic()
        quiet = {e.engine_id: e.quiet_s(now) for e in ready}
        loads = [Replica(n, sum(self.activity(n)[:2]), quiet.get(n, 0.0)) for n in names]
        chosen = self.balancer.pick(loads, affinity).name
        engine = next((e for e in ready if e.engine_id == chosen), None)
        if engine is not None:
            return _engine_upstream(engine, model)
        return next(up for up in boxes if up.name == chosen)

    def replicas(self, engine_id: str) -> list[ManagedEngine]:
        """The engines serving one catalog entry: its own, and its replicas' (``NAME.r2``...)."""
        engines = self._engines.engines
        ids = (replica_id(engine_id, k) for k in range(1, MAX_REPLICAS + 1))
        return [e for i in ids if (e := engines.get(i)) is not None]

    def _ready(self, engines: Iterable[ManagedEngine]) -> list[ManagedEngine]:
        """Those of ``engines`` that take requests now."""
        draining = self.lifecycle.draining
        return [
            e
            for e in engines
            if e.state == EngineState.READY and e.port and e.engine_id not in draining
        ]

    async def load(
        self, model: str, progress: Progress | None, affinity: Affinity | None = None
    ) -> Upstream:
        entry = await self.find(model)
        if entry is None and self._boxes is not None and (away := self._boxes.away(model)):
            raise ModelUnavailable(
                f"{quoted(model)} is served only by another box, which is away: {away}",
                code="box_away",
                retry_after_s=self._settings.current.gateway.retry_after_s,
                retry=True,
            )
        if entry is None:
            engine = self._engines.route(model)
            if engine is not None and engine.state == EngineState.STARTING:
                await engine.wait_state((EngineState.READY, EngineState.FAILED))
                if (up := self.upstream(model, affinity)) is not None:
                    return up
            raise self.unknown(model)
        if entry.kind == "attached":
            server = self.attached.servers.get(entry.engine_id)
            detail = f": {server.detail}" if server and server.detail else ""
            raise ModelUnavailable(
                f"the attached server {entry.engine_id} ({entry.url}) is unreachable{detail}",
                code="attached_unreachable",
                retry_after_s=self._settings.current.gateway.retry_after_s,
                retry=True,
            )
        engine = self._engines.engines.get(entry.engine_id)
        starting = engine is not None and engine.state == EngineState.STARTING
        if not self._settings.current.engines.jit and not starting:
            raise ModelUnavailable(
                f"{quoted(model)} is not loaded (engines.jit is off); load it with "
                f"`traylm load {entry.name}`",
                code="model_not_loaded",
                http_status=404,
            )
        entry = await self.fresh(entry)
        await self._wait(self.lifecycle.flight(entry, "jit"), model, progress)
        up = self.upstream(model, affinity)
        if up is None:
            raise ModelUnavailable(
                f"{model} stopped again right after loading; retry",
                code="engine_unavailable",
                retry_after_s=2,
                retry=True,
            )
        return up

    async def _bring_back(self, name: str, engine_id: str) -> None:
        """A model freed for another program, loaded or woken again as it was (its origin)."""
        entry = await self.find(name)
        if entry is None or entry.engine_id != replica_base(engine_id):
            raise ModelUnavailable(f"{quoted(name)} is no longer served", code="model_not_found")
        res = self.lifecycle.residency.get(engine_id)
        f = self.lifecycle.flight(entry, res.origin if res is not None else "jit")
        assert f.task is not None
        await f.task

    async def _wait(self, f: LoadFlight, model: str, progress: Progress | None) -> None:
        assert f.task is not None
        if progress is not None:
            await progress(LoadProgress(model, f.phase, f.elapsed_s, f.detail))
        while not f.task.done():
            await asyncio.wait({f.task}, timeout=PROGRESS_PERIOD_S)
            if progress is not None and not f.task.done():
                await progress(LoadProgress(model, f.phase, f.elapsed_s, f.detail))
        f.task.result()

    def state(self, model: str) -> str:
        entry = self.catalog.index.by_name.get(model)
        if entry is not None and entry.kind == "attached":
            server = self.attached.servers.get(entry.engine_id)
            return server.state if server is not None else "unreachable"
        engine = self._engines.engines.get(entry.engine_id) if entry is not None else None
        engine = engine or self._engines.route(model)
        if engine is None:
            return "stopped" if entry is not None else "not_served"
        return str(engine.state)

    async def start_profile(self, model: str, *, fresh: bool) -> Profile | None:
        if fresh:
            await self.catalog.refresh_fresh()
        entry = self.catalog.find(model)
        if entry is None or entry.profile is None:
            return None
        engine = self._engines.engines.get(entry.engine_id)
        down = engine is None or engine.state in (EngineState.STOPPED, EngineState.FAILED)
        return entry.profile if down and entry.engine_id not in self.lifecycle.flights else None

    def served_as(self, engine_id: str) -> str:
        if engine_id in self.profiles.names():  # a profile wins over a folder of its name
            return "preset" if self.profiles.is_preset(engine_id) else "profile"
        return next((e.kind for e in self.catalog.index.entries if e.engine_id == engine_id), "")

    def keep_alive(self, upstream: Upstream, seconds: float) -> None:
        """A request's ``keep_alive``, for its model: every replica of it."""
        res = self.lifecycle.residency.get(upstream.name)
        if res is None:
            return
        for one in self.lifecycle.residency.values():
            if one.name == res.name and one.origin == "jit":
                one.keep_alive_s = seconds

    async def fresh(self, entry: Entry) -> Entry:
        """``entry`` as its source has it now, when its engine is about to start: a profile
        edited or a folder's settings changed (`traylm models set`) since the catalog's last
        read apply to this start. A running, sleeping or loading engine keeps its own."""
        engine = self._engines.engines.get(entry.engine_id)
        down = engine is None or engine.state in (EngineState.STOPPED, EngineState.FAILED)
        if not down or entry.engine_id in self.lifecycle.flights:
            return entry
        await self.catalog.refresh_fresh()
        now = self.catalog.find(entry.name)
        return now if now is not None and now.engine_id == entry.engine_id else entry

    async def find(self, name: str) -> Entry | None:
        """The catalog entry ``name`` routes to; ModelUnavailable (409) when it is ambiguous."""
        entry = self.catalog.find(name)
        if entry is None and name not in self.catalog.index.ambiguous:
            await self.catalog.refresh_fresh()
            entry = self.catalog.find(name)
        if entry is None and name in self.catalog.index.ambiguous:
            raise ModelUnavailable(
                self.catalog.index.ambiguous[name], code="model_ambiguous", http_status=409
            )
        return entry

    def unknown(self, model: str) -> ModelUnavailable:
        names = sorted({n for e in self.catalog.index.entries for n in (e.name, *e.listed)})
        listing = ", ".join(names) if names else "none (add a profile or `traylm models pull`)"
        return ModelUnavailable(
            f"the model {quoted(model)} is not served; served models: {listing}",
            code="model_not_found",
            http_status=404,
        )

    async def placement(self, name: str, gpus: tuple[int, ...] | None = None) -> Placement:
        """Where ``name`` would load now (nothing is changed)."""
        entry = await self.find(name)
        if entry is None:
            raise self.unknown(name)
        return self.placer.preview(entry, gpus)

    async def listing(self) -> list[ServableModel]:
        """The servable models, each unloaded one with why it cannot start here (``blocked``)."""
        await self.catalog.refresh_fresh()
        models = views.servable(self)
        entries = {e.engine_id: e for e in self.catalog.index.entries}
        reasons = await asyncio.gather(
            *(self._blocked(m, entries.get(m.engine_id)) for m in models)
        )
        found = [entries.get(m.engine_id) for m in models]
        images = await asyncio.to_thread(_accepts_images, found)
        tools = await asyncio.to_thread(tools_blocked, self._runs(models, found), self.served_as)
        here = [
            dataclasses.replace(
                m,
                blocked=r.brief if r else "",
                blocked_code=r.code if r else "",
                accepts_images=takes,
                tools_blocked=no_tools,
            )
            for m, r, takes, no_tools in zip(models, reasons, images, tools, strict=True)
        ]
        if self._boxes is None:
            return here
        known = {n for m in here for n in (m.name, *m.aliases, *m.names)}
        return [self._with_copies(m) for m in here] + self._boxes.listed(known)

    def _runs(
        self, models: list[ServableModel], found: list[Entry | None]
    ) -> list[tuple[str, Profile | None]]:
        """Each model's name and the profile it runs (its engine's, while it holds one) or
        would start from."""
        out = []
        for model, entry in zip(models, found, strict=True):
            engine = self._engines.engines.get(model.engine_id)
            running = engine is not None and engine.state in HOLDING
            profile = entry.profile if entry is not None else None
            if engine is not None and running:
                profile = engine.profile
            out.append((model.name, profile if model.kind != "attached" else None))
        return out

    def _with_copies(self, model: ServableModel) -> ServableModel:
        """A model paired boxes serve too: their copies listed among its replicas (after this
        box's own engine or engines, when loaded here)."""
        assert self._boxes is not None
        copies = self._boxes.copies((model.name, *model.aliases, *model.names))
        if not copies:
            return model
        own = model.replicas or (
            (
                ReplicaInfo(
                    model.engine_id, model.state, model.gpus, self.activity(model.engine_id)[0]
                ),
            )
            if model.status == ModelStatus.LOADED
            else ()
        )
        return dataclasses.replace(model, replicas=own + copies)

    async def _blocked(self, model: ServableModel, entry: Entry | None) -> TraylmError | None:
        """The reason a start of it would be refused with now (EngineControl.check_start: no
        GPU, then the engine, then the model; kept a while, verdicts.py); None when it can
        start, or is loaded, loading or attached."""
        if model.status != ModelStatus.UNLOADED:
            return None
        if entry is None or entry.profile is None:
            return None
        return await self.verdicts.refusal(entry.profile)

    async def setup_proposals(self) -> list[SetupProposal]:
        """What the first-run setup proposes on this computer (proposals.py)."""
        return await proposals.setup_proposals(self, await self.parts.gpus.inventory.gpus())

    def ps(self) -> list[LoadedModel]:
        rows = views.loaded(self)
        return rows + self._boxes.rows() if self._boxes is not None else rows

    def shared(self) -> list[BoxModel]:
        """The models ready on this box's own engines, for paired boxes (views.shared)."""
        return views.shared(self)

    # ----------------------------------------------------------------- weights

    def _weights_of(self, repo_id: str) -> int | None:
        """The library's size of a repo (read with the sources, in their worker thread)."""
        if time.monotonic() - self._library_read_s > CATALOG_REFRESH_S / 2:
            self._library_sizes = {m.repo_id: m.size_bytes for m in self._library_models()}
            self._library_read_s = time.monotonic()
        return self._library_sizes.get(repo_id)


def _engine_upstream(engine: ManagedEngine, model: str) -> Upstream:
    rename = None
    if engine.profile.engine == "sglang" and model != engine.profile.effective_served_name:
        rename = engine.profile.effective_served_name  # SGLang serves one name only
    return Upstream(engine.engine_id, f"http://127.0.0.1:{engine.port}", {}, model_name=rename)


def _accepts_images(entries: list[Entry | None]) -> list[bool]:
    """Which of these models take images, by their config.json (blocking: read in a thread)."""
    out = []
    for entry in entries:
        profile = entry.profile if entry is not None else None
        info = read_model_info(profile.model, profile.revision) if profile is not None else None
        out.append(info is not None and info.accepts_images)
    return out
