"""Placement for models on demand: the planner's request for a catalog entry (its engine's
memory rule, 1 or 2 GPUs by the fit estimate for ``gpus = "auto"``), the picture of the GPUs
now, making room (evictions through the lifecycle), and the same answer for previews (the
servable list, `traylm models fit`, the fit badges) as for loads."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import psutil

from engines.adapters import adapter_for
from engines.adapters.memory import MemoryNeed
from engines.control.service import resolve_device
from engines.errors import ConfigError, ModelUnavailable
from engines.events.core import EngineState
from engines.events.gpu import GPUInfo, GPUSnapshot
from engines.events.hub import FitResult
from engines.events.models import Placement
from engines.gpu.backend import cuda_order
from engines.hub import fit
from engines.ondemand import occupancy
from engines.ondemand.catalog import Entry
from engines.ondemand.lifecycle import Engines, Flight, Lifecycle, Residency
from engines.ondemand.occupancy import Activity, Booking
from engines.ondemand.planner import Card, Request, plan
from engines.profiles import Profile, profile_from_mapping
from engines.settings import SettingsView
from engines.supervisor import ManagedEngine


class Placer:
    """Plans where models go and makes room. No I/O at construction; ``infos`` is set once the
    GPU inventory answered (the feature's start)."""

    def __init__(
        self,
        *,
        settings: SettingsView,
        engines: Engines,
        lifecycle: Lifecycle,
        latest: Callable[[], tuple[GPUSnapshot, ...]],
        simulated: Callable[[], bool],
        activity: Activity,
    ) -> None:
        self._settings = settings
        self._engines = engines
        self._lifecycle = lifecycle
        self._latest = latest
        self._simulated = simulated
        self._activity = activity
        self.infos: tuple[GPUInfo, ...] = ()
        self.host_free_bytes: Callable[[], int] = lambda: psutil.virtual_memory().available
        """Host RAM free now: a sleeping model's weights move there (tests replace it)."""

    def applies(self, profile: Profile) -> bool:
        """GPU placement is for engines on the GPUs (and for every engine on the simulator,
        which shows them on their cards)."""
        return bool(self.infos) and (self._simulated() or resolve_device(profile) == "cuda")

    def _cards(self) -> list[Card]:
        bookings = {k: r.booking for k, r in self._lifecycle.residency.items()}
        return occupancy.cards(
            self.infos,
            self._latest(),
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
        infos = cuda_order(self.infos)
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
            {k: r.booking for k, r in self._lifecycle.residency.items()},
            cards,
            self._activity,
            {k for k, r in self._lifecycle.residency.items() if r.pinned},
            self._host_bytes,
        )
        return plan(request, cards, residents, host_free_bytes=self.host_free_bytes()), profile

    def _host_bytes(self, engine: ManagedEngine) -> int:
        res = self._lifecycle.residency.get(engine.engine_id)
        weights = res.booking.weights_bytes if res else None
        return weights or (res.booking.hold_bytes * len(engine.profile.gpus) if res else 0)

    async def place(
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
            await self._lifecycle.evict(eviction)
        placed = dataclasses.replace(profile, gpus=placement.gpus)
        return placed, Booking(placement.need_bytes_per_gpu, f.entry.weights_bytes, now)

    def preview(self, entry: Entry, gpus: tuple[int, ...] | None = None) -> Placement:
        """Where ``entry`` would load now (nothing is changed)."""
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
        if not self.infos or not total or result.engine not in ("vllm", "trtllm", "sglang"):
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
        async with self._lifecycle.lock:
            if profile.gpus_auto:
                placed, booking = await self.place(f, profile, None)
            else:
                placed, booking = profile, Booking(0, None, time.monotonic())
                if self.applies(profile):
                    found, _ = self._plan(entry, profile, profile.gpus)
                    booking = Booking(found.need_bytes_per_gpu, None, booking.loaded_at_s)
        ttl = profile.idle_ttl_s or 0.0
        self._lifecycle.residency[profile.name] = Residency(
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
        if not self.infos:
            raise ConfigError(
                "this machine has no GPU traylm can see (the engine runs on the CPU): "
                "leave out --gpus, or start traylm with --simulate-gpus N to try placement"
            )
        here = len(self.infos)
        for index in gpus:
            if index >= here:
                listed = ", ".join(str(i) for i in range(here))
                raise ConfigError(f"GPU {index} does not exist; the GPUs here are {listed}")
        return gpus

    def card_bytes(self) -> int:
        """The memory of the largest GPU (0 without GPUs)."""
        return max((i.memory_total_bytes or 0 for i in self.infos), default=0)
