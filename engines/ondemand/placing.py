"""Placement for models on demand: the planner's request for a catalog entry (its engine's
memory rule, 1 or 2 GPUs by the fit estimate for ``gpus = "auto"``; host RAM for an engine on
the CPU), the picture of the GPUs now, the room a load needs (the evictions, which the
lifecycle carries out), and the same answer for previews (the servable list, `traylm models
fit`, the fit badges) as for loads."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Sequence

import psutil

from engines.config.live import SettingsView
from engines.config.profiles import Profile, profile_from_mapping
from engines.control.service import resolve_device
from engines.errors import ConfigError, ModelUnavailable
from engines.events.core import EngineState
from engines.events.gpu import GPUInfo, GPUSnapshot
from engines.events.hub import FitResult
from engines.events.models import Eviction, Placement
from engines.gpu.backend import cuda_order
from engines.hub import fit
from engines.ondemand import occupancy
from engines.ondemand.catalog import Entry
from engines.ondemand.lifecycle import Engines, Lifecycle, LoadFlight, Residency
from engines.ondemand.occupancy import Activity, Booking, Room
from engines.ondemand.planner import (
    HOST_RAM_MARGIN_BYTES,
    Card,
    Request,
    Resident,
    copy_cards,
    plan,
    plan_copies,
    plan_host,
)
from engines.runtime.adapters import adapter_for
from engines.runtime.adapters.memory import GIB, MemoryNeed, cpu_need
from engines.runtime.supervisor import ManagedEngine


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
        sample_after: Callable[[float], Awaitable[None]],
        activity: Activity,
    ) -> None:
        self._settings = settings
        self._engines = engines
        self._lifecycle = lifecycle
        self._latest = latest
        self._sample_after = sample_after
        self._activity = activity
        self.infos: tuple[GPUInfo, ...] = ()
        self.host_free_bytes: Callable[[], int] = lambda: psutil.virtual_memory().available
        """Host RAM free now: a sleeping model's weights move there, a CPU engine runs there
        (tests replace it)."""

    def applies(self, profile: Profile) -> bool:
        """GPU placement is for engines on the GPUs (simulated ones included); an engine on the
        CPU takes none, whatever the GPUs here."""
        return bool(self.infos) and resolve_device(profile) == "cuda"

    def _host_free(self) -> int:
        """Host RAM free for another CPU engine: what the host has available, less what the CPU
        engines booked and have not taken yet (a fresh engine still loading its weights)."""
        untaken = 0
        for e in self._engines.engines.values():
            res = self._lifecycle.residency.get(e.engine_id)
            if res is None or e.state not in occupancy.HOLDING or not occupancy.on_cpu(e):
                continue
            untaken += max(0, res.booking.host_bytes - _tree_rss(e.pid))
        return self.host_free_bytes() - untaken

    def _host_need(self, entry: Entry, profile: Profile) -> MemoryNeed:
        """Host RAM one engine on the CPU takes; vLLM's data parallel runs that many copies."""
        kv_gib = profile.cpu_kv_cache_gib or self._settings.current.engines.cpu_kv_cache_gib
        one = cpu_need(weights_bytes=entry.weights_bytes, kv_cache_bytes=kv_gib * GIB)
        if profile.data_parallel_size == 1:
            return one
        ranks = profile.data_parallel_size
        return dataclasses.replace(
            one,
            hold_bytes=one.hold_bytes * ranks,
            free_needed_bytes=one.free_needed_bytes * ranks,
            rule=f"{ranks} data-parallel ranks, each {one.rule}",
        )

    def _host_residents(self) -> list[Resident]:
        return occupancy.host_residents(
            self._engines.engines.values(),
            {k: r.booking for k, r in self._lifecycle.residency.items()},
            self._activity,
            {k for k, r in self._lifecycle.residency.items() if r.pinned},
        )

    def _plan_host(self, entry: Entry, profile: Profile) -> Placement:
        need = self._host_need(entry, profile)
        residents = self._host_residents()
        return plan_host(entry.name, need, residents, host_free_bytes=self._host_free())

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
            world = len(gpus) if profile.gpus_auto else profile.gpu_count
        elif profile.gpus_auto:
            world = profile.gpu_count if profile.gpu_count > 1 else self._fit_world(entry, cards)
        else:
            gpus, world = profile.gpus, profile.gpu_count
        if profile.gpus_auto and world != profile.gpu_count:
            profile = dataclasses.replace(
                profile,
                tensor_parallel_size=world,
                pipeline_parallel_size=profile.pipeline_parallel_size if profile.boxes else 1,
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
                    max_num_batched_tokens=entry.profile.max_num_batched_tokens,
                    max_num_seqs=entry.profile.max_num_seqs,
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
        residents = self._residents(cards, exclude)
        return plan(request, cards, residents, host_free_bytes=self.host_free_bytes()), profile

    def _residents(self, cards: list[Card], exclude: str | None) -> list[Resident]:
        return occupancy.residents(
            (e for e in self._engines.engines.values() if e.engine_id != exclude),
            {k: r.booking for k, r in self._lifecycle.residency.items()},
            cards,
            self._activity,
            {k for k, r in self._lifecycle.residency.items() if r.pinned},
            self._host_bytes,
        )

    def freeing(self, index: int) -> tuple[list[Eviction], list[Resident]]:
        """What frees GPU ``index`` (CUDA) for another program: each idle model on it asleep
        (sleep mode, where host RAM takes its weights) or stopped; and the models left on it
        (busy, pinned, loading or being unloaded). Nothing is changed."""
        residents = self._residents(self._cards(), None)
        host_left = self.host_free_bytes() - HOST_RAM_MARGIN_BYTES
        moving = self._lifecycle.draining | set(self._lifecycle.flights)
        freed: list[Eviction] = []
        kept: list[Resident] = []
        for r in residents:
            if index not in r.gpus or r.sleeping:
                continue
            if r.busy or r.pinned or r.engine_id in moving:
                kept.append(r)
            elif r.sleep_frees_bytes is not None and r.sleep_host_bytes <= host_left:
                host_left -= r.sleep_host_bytes
                freed.append(Eviction(r.engine_id, "sleep", r.sleep_frees_bytes, r.gpus))
            else:
                freed.append(Eviction(r.engine_id, "stop", r.hold_bytes, r.gpus))
        return freed, kept

    def _host_bytes(self, engine: ManagedEngine) -> int:
        res = self._lifecycle.residency.get(engine.engine_id)
        weights = res.booking.weights_bytes if res else None
        return weights or (res.booking.hold_bytes * len(engine.profile.gpus) if res else 0)

    async def _settle(self) -> None:
        """Before a placement that changes something: the GPU picture read after the last
        engine went down. A snapshot from before would count the memory that engine held as
        another program's (it is no resident any more) and refuse what now fits: the tuner's
        next candidate, a load right after `traylm stop`. Previews read the latest as is."""
        await self._sample_after(self._engines.released_at_s())

    async def place(self, f: LoadFlight, profile: Profile, gpus: tuple[int, ...] | None) -> Room:
        """Plan (under the lifecycle lock) where the model goes and what must make room for
        it; the lifecycle makes the room (``Lifecycle.make_room``)."""
        if resolve_device(profile) == "cpu":
            placement = self._plan_host(f.entry, profile)
        elif not self.applies(profile):
            return Room(profile, f.entry.weights_bytes)
        else:
            waking = self._engines.get(f.entry.engine_id)
            exclude = waking.engine_id if waking and waking.state == EngineState.SLEEPING else None
            await self._settle()
            placement, profile = self._plan(f.entry, profile, gpus, exclude=exclude)
        return self._room(f, (placement,), profile)

    async def place_copies(
        self, f: LoadFlight, profile: Profile, gpus: tuple[int, ...] | None, count: int
    ) -> Room:
        """``count`` copies of the model planned together (under the lifecycle lock), and
        what must make room for all: each copy on its GPUs (one per card when each fits one)."""
        if count == 1:
            return await self.place(f, profile, gpus)
        if resolve_device(profile) != "cpu" and not self.applies(profile):
            return Room(profile, f.entry.weights_bytes, count=count)
        if self.applies(profile):
            await self._settle()
        found, profile = self._plan_copies(f.entry, profile, gpus, count)
        return self._room(f, found, profile)

    def _room(
        self, f: LoadFlight, found: tuple[Placement, ...] | Placement, profile: Profile
    ) -> Room:
        """The room the placements ask for; a refusal as ModelUnavailable (with Retry-After
        when only busy models stand in the way)."""
        placements = found if isinstance(found, tuple) else (found,)
        for refused in (p for p in placements if not p.fits):
            raise ModelUnavailable(
                refused.reason,
                code="insufficient_gpu_memory",
                retry_after_s=self._settings.current.gateway.retry_after_s
                if refused.retry_later
                else None,
                retry=refused.retry_later,
            )
        return Room(profile, f.entry.weights_bytes, placements, len(placements))

    def _plan_copies(
        self, entry: Entry, profile: Profile, gpus: tuple[int, ...] | None, count: int
    ) -> tuple[tuple[Placement, ...] | Placement, Profile]:
        """Where ``count`` copies go now (nothing is changed), or the refusal naming the copy
        that does not fit."""
        if resolve_device(profile) == "cpu":
            need = self._host_need(entry, profile)
            return plan_copies(
                entry.name,
                count,
                lambda _, now, host: plan_host(entry.name, need, now, host_free_bytes=host),
                self._host_residents(),
                host_free_bytes=self._host_free(),
                gpus_per_copy=0,
            ), profile
        cards = self._cards()
        fixed = gpus if gpus is not None else (None if profile.gpus_auto else profile.gpus)
        request, profile = self._request(entry, profile, None, cards)
        world = request.world_size if fixed is None else profile.gpu_count
        if fixed is not None and len(fixed) < world * count:
            listed = list(range(world * count))
            return Placement(
                entry.name,
                fits=False,
                reason=f"{entry.name}: {count} replicas of {world} GPU(s) each need "
                f"{world * count} GPUs, but {len(fixed)} are given: list them (gpus = "
                f'{listed}) or use gpus = "auto"',
            ), profile
        taken: set[int] = set()

        def plan_one(i: int, now: Sequence[Resident], host: int) -> Placement:
            if fixed is not None:
                own = fixed[i * world : (i + 1) * world]
                one = dataclasses.replace(request, world_size=world, gpus=own)
                found = plan(one, cards, now, host_free_bytes=host)
            else:
                found = plan(request, copy_cards(cards, taken, world), now, host_free_bytes=host)
            taken.update(found.gpus)
            return found

        residents = self._residents(cards, None)
        found = plan_copies(
            entry.name,
            count,
            plan_one,
            residents,
            host_free_bytes=self.host_free_bytes(),
            gpus_per_copy=world,
        )
        return found, profile

    def preview(self, entry: Entry, gpus: tuple[int, ...] | None = None) -> Placement:
        """Where ``entry`` would load now (nothing is changed)."""
        if entry.profile is None:
            return Placement(entry.name, fits=True, reason=f"attached server at {entry.url}")
        if resolve_device(entry.profile) == "cpu":
            return self._plan_host(entry, entry.profile)
        if not self.applies(entry.profile):
            return Placement(entry.name, fits=True, reason="no GPU placement here")
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
        f = LoadFlight(entry, "start")
        async with self._lifecycle.lock:
            if profile.gpus_auto:
                room = await self.place(f, profile, None)
                [(placed, booking)] = await self._lifecycle.make_room(room)
            else:
                placed, booking = profile, Booking(0, None, time.monotonic())
                if resolve_device(profile) == "cpu":
                    host = self._plan_host(entry, profile).host_bytes
                    booking = Booking(0, None, booking.loaded_at_s, host)
                elif self.applies(profile):
                    await self._settle()
                    found, _ = self._plan(entry, profile, profile.gpus)
                    booking = Booking(found.need_bytes_per_gpu, None, booking.loaded_at_s)
        ttl = profile.idle_ttl_s or 0.0
        self._lifecycle.residency[profile.name] = Residency(
            profile.name, entry.name, "start", ttl, False, booking
        )
        return placed

    async def place_rank(self, profile: Profile) -> Profile:
        """A pipeline stage of a model across boxes that a paired box asked this one to run:
        placed like a load (GPUs picked for ``gpus = "auto"`` or checked, host RAM on the CPU,
        idle models stopped to make room); ModelUnavailable says why it does not fit."""
        entry = Entry(profile.effective_served_name, "profile", profile.name, (), profile=profile)
        async with self._lifecycle.lock:
            gpus = None if profile.gpus_auto else profile.gpus
            room = await self.place(LoadFlight(entry, "start"), profile, gpus)
            [(placed, _)] = await self._lifecycle.make_room(room)
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


def _tree_rss(pid: int | None) -> int:
    """Resident memory of an engine's process and its children (0 once gone)."""
    if pid is None:
        return 0
    try:
        leader = psutil.Process(pid)
        procs = [leader, *leader.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            continue
    return total
