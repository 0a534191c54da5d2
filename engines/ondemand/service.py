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
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import psutil

from engines.adapters import adapter_for
from engines.adapters.memory import MemoryNeed
from engines.config import Profile, ProfileStore, profile_from_mapping
from engines.control.service import resolve_device
from engines.errors import ConfigError, ModelUnavailable
from engines.events.codec import Event
from engines.events.core import EngineState
from engines.events.gpu import GPUInfo, GPUSnapshot
from engines.events.hub import FitResult, LocalModel
from engines.events.models import LoadedModel, Placement, ServableModel
from engines.gateway.loading import PROGRESS_PERIOD_S, LoadProgress, Progress
from engines.gateway.proxy import Upstream
from engines.gpu.backend import cuda_order
from engines.hub import fit
from engines.ondemand import occupancy, views
from engines.ondemand.attach import AttachedServers
from engines.ondemand.catalog import Catalog, Entry, LibrarySource, ProfileSource, Source
from engines.ondemand.lifecycle import Engines, Flight, Lifecycle, Residency, StartEngine
from engines.ondemand.occupancy import Activity, Booking
from engines.ondemand.planner import Card, Request, plan
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
    ) -> None:
        """No I/O. ``library``: the hub library's models (blocking); ``extra_sources``: more
        kinds of servable models (registered local folders)."""
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
            place=self._place,
            settings=settings,
            publish=publish,
            activity=activity,
        )
        self.host_free_bytes: Callable[[], int] = lambda: psutil.virtual_memory().available
        """Host RAM free now: a sleeping model's weights move there (tests replace it)."""
        self._infos: tuple[GPUInfo, ...] = ()
        self._library_sizes: dict[str, int] = {}
        self._library_read_s = -CATALOG_REFRESH_S
        self._tasks: list[asyncio.Task[None]] = []

    # ----------------------------------------------------------------- Feature

    async def start(self) -> None:
        self._infos = await self._gpus.gpus()
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

    def keep_alive(self, upstream: Upstream, seconds: float) -> None:
        res = self.lifecycle.residency.get(upstream.name)
        if res is not None and res.origin == "jit":
            res.keep_alive_s = seconds

    async def find(self, name: str) -> Entry | None:
        """The catalog entry ``name`` routes to; ModelUnavailable (409) when it is ambiguous."""
        entry = self.catalog.find(name)
        if entry is None and name not in self.catalog.index.ambiguous:
            await self.catalog.refresh_for_miss()
            entry = self.catalog.find(name)
        if entry is None and name in self.catalog.index.ambiguous:
            raise ModelUnavailable(
                self.catalog.index.ambiguous[name], code="model_ambiguous", http_status=409
            )
        return entry

    def unknown(self, model: str) -> ModelUnavailable:
        names = sorted({e.name for e in self.catalog.index.entries})
        listing = ", ".join(names) if names else "none (add a profile or `traylm models pull`)"
        return ModelUnavailable(
            f"the model {model!r} is not served; served models: {listing}",
            code="model_not_found",
            http_status=404,
        )

    # ----------------------------------------------------------------- placement

    def applies(self, profile: Profile) -> bool:
        """GPU placement is for engines on the GPUs (and for every engine on the simulator,
        which shows them on their cards)."""
        return bool(self._infos) and (self._gpus.simulated() or resolve_device(profile) == "cuda")

    def _cards(self) -> list[Card]:
        bookings = {k: r.booking for k, r in self.lifecycle.residency.items()}
        return occupancy.cards(
            self._infos,
            self._gpus.latest(),
            self._engines.engines.values(),
            bookings,
            self._settings.current.gpu.reserved,
        )

    def _request(
        self, entry: Entry, profile: Profile, gpus: tuple[int, ...] | None, cards: list[Card]
    ) -> tuple[Request, Profile]:
        """The planner's request, and the profile with the world size it will run at."""
        if gpus is not None:
            world = len(gpus) if profile.gpus_auto else profile.world_size
        elif profile.gpus_auto:
            world = profile.world_size if profile.world_size > 1 else self._fit_world(entry, cards)
        else:
            gpus, world = profile.gpus, profile.world_size
        if profile.gpus_auto and world != profile.world_size:
            profile = dataclasses.replace(
                profile, tensor_parallel_size=world, pipeline_parallel_size=1
            )
        adapter = adapter_for(profile.engine)
        placed = profile

        def need(card: Card, free: int) -> MemoryNeed:
            return adapter.memory_need(
                placed,
                total_bytes=card.total_bytes,
                free_bytes=free,
                weights_bytes=entry.weights_bytes,
            )

        return Request(entry.name, world, need, gpus), profile

    def _fit_world(self, entry: Entry, cards: list[Card]) -> int:
        """1 GPU if the fit estimate says the model fits on one, else 2 if it fits on two."""
        infos = cuda_order(self._infos)
        if entry.details is None or not infos or entry.profile is None:
            return 1
        engine = entry.profile.engine if entry.profile.engine in fit.FIT_ENGINES else "vllm"
        for world in (1, 2):
            if world > len(infos):
                break
            result = fit.estimate(
                entry.details,
                fit.FitRequest(
                    engine=engine,
                    gpus=tuple(infos[:world]),
                    context_len=entry.profile.max_model_len,
                    gpu_memory_utilization=entry.profile.gpu_memory_utilization,
                    gpus_available=len(infos),
                ),
            )
            if result.verdict != "wont_fit":
                return world
        return 1

    def _plan(
        self,
        entry: Entry,
        profile: Profile,
        gpus: tuple[int, ...] | None,
        *,
        exclude: str | None = None,
    ) -> tuple[Placement, Profile]:
        cards = self._cards()
        request, profile = self._request(entry, profile, gpus, cards)
        residents = occupancy.residents(
            (e for e in self._engines.engines.values() if e.engine_id != exclude),
            {k: r.booking for k, r in self.lifecycle.residency.items()},
            cards,
            self._activity,
            {k for k, r in self.lifecycle.residency.items() if r.pinned},
            self._host_bytes,
        )
        return plan(request, cards, residents, host_free_bytes=self.host_free_bytes()), profile

    def _host_bytes(self, engine: ManagedEngine) -> int:
        res = self.lifecycle.residency.get(engine.engine_id)
        weights = res.booking.weights_bytes if res else None
        return weights or (res.booking.hold_bytes * len(engine.profile.gpus) if res else 0)

    async def _place(
        self, f: Flight, profile: Profile, gpus: tuple[int, ...] | None
    ) -> tuple[Profile, Booking]:
        """Plan and make room (under the lifecycle lock); the profile on its GPUs."""
        now = time.monotonic()
        if not self.applies(profile):
            return profile, Booking(0, f.entry.weights_bytes, now)
        waking = self._engines.get(f.entry.engine_id)
        exclude = waking.engine_id if waking and waking.state == EngineState.SLEEPING else None
        placement, profile = self._plan(f.entry, profile, gpus, exclude=exclude)
        if not placement.fits:
            raise ModelUnavailable(
                placement.reason,
                code="insufficient_gpu_memory",
                retry_after_s=self._settings.current.gateway.retry_after_s
                if placement.retry_later
                else None,
                retry=placement.retry_later,
            )
        for eviction in placement.evictions:
            f.phase, f.detail = "evicting", f"{eviction.action} {eviction.engine_id}"
            await self.lifecycle.evict(eviction)
        placed = dataclasses.replace(profile, gpus=placement.gpus)
        return placed, Booking(placement.need_bytes_per_gpu, f.entry.weights_bytes, now)

    async def placement(self, name: str, gpus: tuple[int, ...] | None = None) -> Placement:
        """Where ``name`` would load now (nothing is changed): `traylm models fit`, the fit
        badges and the servable list ask this."""
        entry = await self.find(name)
        if entry is None:
            raise self.unknown(name)
        if entry.profile is None:
            return Placement(entry.name, fits=True, reason=f"attached server at {entry.url}")
        if not self.applies(entry.profile):
            return Placement(entry.name, fits=True, on_cpu=True, reason="runs on the CPU")
        found, _ = self._plan(entry, entry.profile, gpus)
        return found

    async def place_fit(self, result: FitResult) -> Placement | None:
        """Where a fit row (an engine on ``tensor_parallel`` GPUs at the fit's memory budget)
        would load now; None without GPUs. Nothing is changed."""
        total = max((g.memory_total_bytes or 0 for g in result.gpus), default=0)
        if not self._infos or not total or result.engine not in ("vllm", "trtllm", "sglang"):
            return None
        profile = profile_from_mapping(
            "fit",
            {
                "engine": result.engine,
                "model": "org/fit",
                "gpus": "auto",
                "tensor_parallel_size": result.tensor_parallel,
                "gpu_memory_utilization": min(1.0, max(0.05, result.budget_bytes_per_gpu / total)),
            },
        )
        weights = result.weights_bytes_per_gpu * result.tensor_parallel
        entry = Entry("this model", "fit", "fit", (), profile=profile, weights_bytes=weights)
        found, _ = self._plan(entry, profile, None)
        return found

    async def place_started(self, profile: Profile) -> Profile:
        """EngineControl's placement hook for `traylm start` and POST /api/engines: a profile
        with ``gpus = "auto"`` is placed like a load (evicting idle models); every start is
        booked so that its idle TTL and the planner know it."""
        entry = Entry(profile.effective_served_name, "profile", profile.name, (), profile=profile)
        f = Flight(entry, "start")
        async with self.lifecycle.lock:
            if profile.gpus_auto:
                placed, booking = await self._place(f, profile, None)
            else:
                placed, booking = profile, Booking(0, None, time.monotonic())
                if self.applies(profile):
                    found, _ = self._plan(entry, profile, profile.gpus)
                    booking = Booking(found.need_bytes_per_gpu, None, booking.loaded_at_s)
        ttl = profile.idle_ttl_s or 0.0
        self.lifecycle.residency[profile.name] = Residency(
            profile.name, entry.name, "start", ttl, False, booking
        )
        return placed

    def preview_gpus(self, entry: Entry) -> tuple[int, ...]:
        """Where an unloaded entry would go now (the servable list; nothing is changed)."""
        assert entry.profile is not None
        found, _ = self._plan(entry, entry.profile, None)
        return found.gpus

    def check_gpus(self, gpus: tuple[int, ...] | None) -> tuple[int, ...] | None:
        """Refuse GPU indices this machine does not have (ConfigError saying which it has)."""
        if gpus is None:
            return None
        if not self._infos:
            raise ConfigError(
                "this machine has no GPU traylm can see (the engine runs on the CPU): "
                "leave out --gpus, or start traylm with --simulate-gpus N to try placement"
            )
        here = len(self._infos)
        for index in gpus:
            if index >= here:
                listed = ", ".join(str(i) for i in range(here))
                raise ConfigError(f"GPU {index} does not exist; the GPUs here are {listed}")
        return gpus

    def card_bytes(self) -> int:
        """The memory of the largest GPU (0 without GPUs)."""
        return max((i.memory_total_bytes or 0 for i in self._infos), default=0)

    @property
    def activity(self) -> Activity:
        return self._activity

    def listing(self) -> list[ServableModel]:
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
