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
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from engines.errors import ModelUnavailable
from engines.events.codec import Event
from engines.events.core import EngineState
from engines.events.gpu import GPUInfo, GPUSnapshot
from engines.events.hub import LocalModel
from engines.events.models import LoadedModel, Placement, ServableModel
from engines.gateway.loading import PROGRESS_PERIOD_S, LoadProgress, Progress
from engines.gateway.proxy import Upstream
from engines.ondemand import views
from engines.ondemand.attach import AttachedServers
from engines.ondemand.catalog import Catalog, Entry, LibrarySource, ProfileSource, Source
from engines.ondemand.lifecycle import CheckStart, Engines, Flight, Lifecycle, StartEngine
from engines.ondemand.occupancy import Activity
from engines.ondemand.placing import Placer
from engines.profiles import ProfileStore
from engines.settings import SettingsView
from engines.supervisor import ManagedEngine

log = logging.getLogger(__name__)

CATALOG_REFRESH_S = 30.0


class Router(Engines, Protocol):
    """The Supervisor, as this feature reads it."""

    def route(self, model: str) -> ManagedEngine | None: ...


@dataclass(frozen=True)
class GPUReadings:
    """The GPU feature's inventory and latest samples, read through callables: the daemon
    builds the GPU feature after the gateway, and the gateway needs this feature first."""

    gpus: Callable[[], Awaitable[tuple[GPUInfo, ...]]]
    latest: Callable[[], tuple[GPUSnapshot, ...]]
    simulated: Callable[[], bool]


class ModelsOnDemand:
    name = "ondemand"

    def __init__(
        self,
        *,
        settings: SettingsView,
        engines: Router,
        start_engine: StartEngine,
        profiles: ProfileStore,
        library: Callable[[], list[LocalModel]] | None,
        gpus: GPUReadings,
        activity: Activity,
        publish: Callable[[Event], None],
        attached_file: Path,
        extra_sources: tuple[Source, ...] = (),
        check_start: CheckStart | None = None,
    ) -> None:
        """No I/O. ``library``: the hub library's models (blocking); ``extra_sources``: more
        kinds of servable models (registered local folders); ``check_start``: a start's checks
        before placement (EngineControl.check_start)."""
        self._settings = settings
        self._engines = engines
        self._gpus = gpus
        self._activity = activity
        self._publish = publish
        self._library = library
        self.attached = AttachedServers(attached_file, publish)
        sources: list[Source] = [ProfileSource(profiles, self._weights_of)]
        if library is not None:
            sources.append(LibrarySource(library, lambda: set(profiles.names())))
        sources += [self.attached, *extra_sources]
        self.catalog = Catalog(sources)
        self.lifecycle = Lifecycle(
            engines=engines,
            start_engine=start_engine,
            place=lambda f, profile, gpus: self.placer.place(f, profile, gpus),
            settings=settings,
            publish=publish,
            activity=activity,
            check_start=check_start,
        )
        self.placer = Placer(
            settings=settings,
            engines=engines,
            lifecycle=self.lifecycle,
            latest=gpus.latest,
            simulated=gpus.simulated,
            activity=activity,
        )
        self._library_sizes: dict[str, int] = {}
        self._library_read_s = -CATALOG_REFRESH_S
        self._tasks: list[asyncio.Task[None]] = []

    # ----------------------------------------------------------------- Feature

    async def start(self) -> None:
        self.placer.infos = await self._gpus.gpus()
        await self.attached.start()
        await self.catalog.refresh()
        self._tasks = [
            asyncio.create_task(self.lifecycle.run_idle(), name="ondemand idle"),
            asyncio.create_task(self._refresh_loop(), name="ondemand catalog"),
        ]

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

    @property
    def engines(self) -> Mapping[str, ManagedEngine]:
        return self._engines.engines

    # ----------------------------------------------------------------- the gateway's router

    def upstream(self, model: str) -> Upstream | None:
        entry = self.catalog.index.by_name.get(model)
        if entry is not None and entry.kind == "attached":
            return self.attached.upstream(entry.engine_id, model)
        engine = self._engines.engines.get(entry.engine_id) if entry is not None else None
        if engine is None or engine.state != EngineState.READY:
            # any ready engine serving the name: one started ad hoc (`traylm start --model`)
            engine = self._engines.route(model)
        if engine is None or engine.state != EngineState.READY or not engine.port:
            return None
        if engine.engine_id in self.lifecycle.draining:
            return None
        rename = None
        if engine.profile.engine == "sglang" and model != engine.profile.effective_served_name:
            rename = engine.profile.effective_served_name  # SGLang serves one name only
        return Upstream(engine.engine_id, f"http://127.0.0.1:{engine.port}", {}, model_name=rename)

    async def load(self, model: str, progress: Progress | None) -> Upstream:
        entry = await self.find(model)
        if entry is None:
            engine = self._engines.route(model)
            if engine is not None and engine.state == EngineState.STARTING:
                await engine.wait_state((EngineState.READY, EngineState.FAILED))
                if (up := self.upstream(model)) is not None:
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
                f"{model!r} is not loaded (engines.jit is off); load it with "
                f"`traylm load {entry.name}`",
                code="model_not_loaded",
                http_status=404,
            )
        await self._wait(self.lifecycle.flight(entry, "jit"), model, progress)
        up = self.upstream(model)
        if up is None:
            raise ModelUnavailable(
                f"{model} stopped again right after loading; retry",
                code="engine_unavailable",
                retry_after_s=2,
                retry=True,
            )
        return up

    async def _wait(self, f: Flight, model: str, progress: Progress | None) -> None:
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

    def keep_alive(self, upstream: Upstream, seconds: float) -> None:
        res = self.lifecycle.residency.get(upstream.name)
        if res is not None and res.origin == "jit":
            res.keep_alive_s = seconds

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
            f"the model {model!r} is not served; served models: {listing}",
            code="model_not_found",
            http_status=404,
        )

    async def placement(self, name: str, gpus: tuple[int, ...] | None = None) -> Placement:
        """Where ``name`` would load now (nothing is changed)."""
        entry = await self.find(name)
        if entry is None:
            raise self.unknown(name)
        return self.placer.preview(entry, gpus)

    @property
    def activity(self) -> Activity:
        return self._activity

    async def listing(self) -> list[ServableModel]:
        await self.catalog.refresh_fresh()
        return views.servable(self)

    def ps(self) -> list[LoadedModel]:
        return views.loaded(self)

    # ----------------------------------------------------------------- weights

    def _weights_of(self, repo_id: str) -> int | None:
        """The library's size of a repo (read with the sources, in their worker thread)."""
        if self._library is None:
            return None
        if time.monotonic() - self._library_read_s > CATALOG_REFRESH_S / 2:
            self._library_sizes = {m.repo_id: m.size_bytes for m in self._library()}
            self._library_read_s = time.monotonic()
        return self._library_sizes.get(repo_id)
