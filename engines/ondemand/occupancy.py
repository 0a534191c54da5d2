"""The planner's picture of the machine now: the cards (from the GPU inventory and the
sampler's latest snapshots) and the traylm models on them (from the engines and what each was
booked for when it loaded).

A card is what CUDA sees: NVML's total less the memory the driver reserves (NVML v2's
"reserved", outside its "used"), as torch's total is. Memory held by other programs (a desktop's
Xorg and compositor included) is that total minus NVML's free memory minus what traylm's own
engine processes hold (the sampler marks them in each snapshot's process list), so what the
planner counts free is what NVML says is free. A driver that refuses v2 reports no reserve: v1's
"used" then counts it as another program's, and the free memory is still exact. A card whose
memory NVML does not report at all is taken as empty, and says so in every message about it.

A ready engine whose processes the (slower) process list does not show yet is subtracted by its
booking, so a fresh engine is not counted twice. A stopped engine is no resident, so a snapshot
from while it still ran would count its memory as another program's: placement reads a snapshot
taken after the last engine went down (``Placer._settle``).

An engine on the CPU is on no card: it is a host resident (``host_residents``), booked in host
RAM.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from engines.config.profiles import Profile
from engines.events.core import EngineState
from engines.events.gpu import GPUInfo, GPUSnapshot
from engines.events.models import Eviction, Placement
from engines.gpu.backend import cuda_order
from engines.ondemand.planner import Card, Resident
from engines.runtime.adapters import adapter_for
from engines.runtime.adapters.memory import GIB, MemoryNeed
from engines.runtime.supervisor import ManagedEngine

UNREAD = "NVML did not report this card's memory: taken as empty"
"""Said in place of the other programs on a card whose memory NVML does not report."""
HOLDING = frozenset(
    {EngineState.STARTING, EngineState.READY, EngineState.SLEEPING, EngineState.STOPPING}
)
"""Engine states in which an engine holds (or is taking) GPU memory."""

Activity = Callable[[str], tuple[int, int, float | None]]
"""engine id → (in flight, queued, monotonic time idle since or None): GatewayContext.activity."""


@dataclass(frozen=True)
class Booking:
    """What the planner booked for an engine when it loaded."""

    hold_bytes: int  # per GPU
    weights_bytes: int | None
    loaded_at_s: float  # monotonic
    host_bytes: int = 0
    """Host RAM, for an engine on the CPU."""


@dataclass(frozen=True)
class Room:
    """What a placement of a model's copies asks for: the evictions that make room for them
    (carried out in order, by the lifecycle), then each copy's profile on its GPUs and its
    booking, booked once the room is made."""

    profile: Profile
    weights_bytes: int | None
    placements: tuple[Placement, ...] = ()
    """Empty when the model is placed nowhere (no GPU placement here): ``count`` copies as
    they are."""
    count: int = 1

    @property
    def evictions(self) -> tuple[Eviction, ...]:
        return tuple(e for p in self.placements for e in p.evictions)

    def copies(self, now_s: float) -> list[tuple[Profile, Booking]]:
        """Each copy's profile and its booking at ``now_s`` (monotonic)."""
        if not self.placements:
            return [(self.profile, Booking(0, self.weights_bytes, now_s))] * self.count
        out = []
        for placement in self.placements:
            if placement.on_cpu:
                booking = Booking(0, self.weights_bytes, now_s, placement.host_bytes)
                out.append((self.profile, booking))
            else:
                booking = Booking(placement.need_bytes_per_gpu, self.weights_bytes, now_s)
                out.append((dataclasses.replace(self.profile, gpus=placement.gpus), booking))
        return out


def on_cpu(engine: ManagedEngine) -> bool:
    """The engine runs on the CPU (its env's device): it holds no GPU memory."""
    return engine.runtime.device == "cpu"


def cards(
    infos: Sequence[GPUInfo],
    snapshots: Iterable[GPUSnapshot],
    engines: Iterable[ManagedEngine],
    bookings: Mapping[str, Booking],
    reserved: Sequence[int],
) -> list[Card]:
    """Each GPU in CUDA order with what other programs hold on it."""
    latest = {s.uuid: s for s in snapshots}
    running = [e for e in engines if e.state in HOLDING and not on_cpu(e)]
    out = []
    for index, info in enumerate(cuda_order(infos)):
        snap = latest.get(info.uuid)
        reserve = snap.memory_reserved_bytes if snap is not None else None
        reserve = info.memory_reserved_bytes or 0 if reserve is None else reserve
        total = (info.memory_total_bytes or 0) - reserve
        other, names = _other(snap, index, total, running, bookings)
        out.append(Card(index, info.name, total, other, names, index in reserved, reserve))
    return out


def residents(
    engines: Iterable[ManagedEngine],
    bookings: Mapping[str, Booking],
    cards: Sequence[Card],
    activity: Activity,
    pinned: Collection[str],
    host_bytes: Callable[[ManagedEngine], int],
) -> list[Resident]:
    """The traylm models on the cards: busy when requests run or queue, or while they start
    or stop."""
    total = max((c.total_bytes for c in cards), default=0)
    out = []
    for e in engines:
        gpus = tuple(i for i in e.profile.gpus if i < len(cards))
        if e.state not in HOLDING or not gpus or on_cpu(e):
            continue
        booking = bookings.get(e.engine_id)
        in_flight, waiting, idle_since = activity(e.engine_id)
        need = _need(e, booking, total, total)
        busy = bool(in_flight or waiting) or e.state in (EngineState.STARTING, EngineState.STOPPING)
        loaded_at = booking.loaded_at_s if booking else 0.0
        residual = need.sleep_residual_bytes
        hold = hold_of(e, bookings, total, total)
        out.append(
            Resident(
                e.engine_id,
                gpus,
                hold,
                busy,
                e.engine_id in pinned,
                max(idle_since or 0.0, loaded_at),
                e.state == EngineState.SLEEPING,
                hold - residual if residual is not None and e.can_sleep else None,
                host_bytes(e),
            )
        )
    return out


def host_residents(
    engines: Iterable[ManagedEngine],
    bookings: Mapping[str, Booking],
    activity: Activity,
    pinned: Collection[str],
) -> list[Resident]:
    """The traylm models on the CPU, each holding its host RAM booking (``gpus`` empty)."""
    out = []
    for e in engines:
        if e.state not in HOLDING or not on_cpu(e):
            continue
        booking = bookings.get(e.engine_id)
        in_flight, waiting, idle_since = activity(e.engine_id)
        busy = bool(in_flight or waiting) or e.state in (EngineState.STARTING, EngineState.STOPPING)
        loaded_at = booking.loaded_at_s if booking else 0.0
        out.append(
            Resident(
                e.engine_id,
                (),
                booking.host_bytes if booking else 0,
                busy,
                e.engine_id in pinned,
                max(idle_since or 0.0, loaded_at),
            )
        )
    return out


def _other(
    snap: GPUSnapshot | None,
    index: int,
    total: int,
    running: Sequence[ManagedEngine],
    bookings: Mapping[str, Booking],
) -> tuple[int, tuple[str, ...]]:
    if snap is None or (snap.memory_used_bytes is None and snap.memory_free_bytes is None):
        return 0, (UNREAD,) if snap is not None else ()
    procs = snap.processes or ()
    ours = {p.engine_id for p in procs if p.engine_id}
    listed = sum(p.used_memory_bytes or 0 for p in procs if p.engine_id)
    unlisted = sum(
        hold_of(e, bookings, total, total)
        for e in running
        if index in e.profile.gpus
        and e.engine_id not in ours
        and e.state in (EngineState.READY, EngineState.SLEEPING)
    )
    foreign = sorted(
        (p for p in procs if not p.engine_id and (p.used_memory_bytes or 0) > 0),
        key=lambda p: -(p.used_memory_bytes or 0),
    )
    names = tuple(
        f"pid {p.pid}{f' ({p.name})' if p.name else ''} {(p.used_memory_bytes or 0) / GIB:.1f} GiB"
        for p in foreign[:3]
    )
    if snap.memory_free_bytes is not None:
        taken = total - snap.memory_free_bytes
    else:
        taken = (snap.memory_used_bytes or 0) - (snap.memory_reserved_bytes or 0)
    return max(0, taken - listed - unlisted), names


def hold_of(
    engine: ManagedEngine, bookings: Mapping[str, Booking], total_bytes: int, free_bytes: int
) -> int:
    """Per GPU: the booking (or the engine's rule when traylm did not book it); asleep: what
    sleep mode keeps."""
    booking = bookings.get(engine.engine_id)
    if engine.state == EngineState.SLEEPING:
        residual = _need(engine, booking, total_bytes, free_bytes).sleep_residual_bytes
        if residual is not None:
            return residual
    if booking is not None:
        return booking.hold_bytes
    return _need(engine, booking, total_bytes, free_bytes).hold_bytes


def _need(
    engine: ManagedEngine, booking: Booking | None, total_bytes: int, free_bytes: int
) -> MemoryNeed:
    return adapter_for(engine.profile.engine).memory_need(
        engine.profile,
        total_bytes=total_bytes,
        free_bytes=free_bytes,
        weights_bytes=booking.weights_bytes if booking else None,
    )
