"""Where a model goes (pure functions): which GPU set, which idle models make room, or exactly
why it cannot load now.

Inputs are a picture of the cards (CUDA's view of each card's total, and the memory held by
other programs and the desktop: what NVML does not report free), the traylm models on them
with what each holds by its engine's memory rule (their CUDA context and NCCL included), and
the request: a fixed GPU set or ``auto`` with a world size. The rules:

- a set fits when every card in it has what the engine needs free (its ``free_needed_bytes``);
- of the sets that fit now, the one with the most headroom wins (ties: lower indices);
- otherwise idle models are freed, least recently used first (asleep ones first: they already
  wait), by sleep mode when the engine has it and host RAM takes the weights, else by a stop;
  never a model with requests in flight or queued, a loading one, or a pinned one;
- of the sets that fit after freeing, the one with the fewest evictions wins, then the one whose
  evicted models were used least recently, then headroom;
- ``auto`` never uses a reserved card (``gpu.reserved``); a fixed set may.

An engine on the CPU takes no GPU memory: ``plan_host`` books its host RAM (weights, KV cache,
runtime) against what the host has free, keeping ``HOST_RAM_MARGIN_BYTES`` for the system, and
makes room the same way: idle CPU models stopped, least recently used first (never busy or
pinned ones); when even that is not enough, a refusal that says what holds the RAM.

Replicas (``plan_copies``): each copy of a model is planned in turn against the picture with
the copies before it booked (a busy resident) and their evictions done; an ``auto`` copy goes
to cards no earlier copy took while enough remain, so two copies that each fit one card land one
per card. A copy that cannot be placed refuses the whole load, saying which copy and what to
change (fewer replicas, or one copy across the cards with tensor parallel).

``traylm models fit``, the fit badges, the servable list and every load ask ``plan``, so what
is predicted is what is done.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engines.events.models import Eviction, Placement
from engines.runtime.adapters.memory import MemoryNeed

GIB = 1 << 30
HOST_RAM_MARGIN_BYTES = 4 * GIB
"""Host RAM left free when a model sleeps (its weights move there) or loads on the CPU."""
SMALL_BYTES = 50 << 20
"""Less than this held by others on a card (an idle driver's few MiB) goes unsaid."""


@dataclass(frozen=True)
class Card:
    """One GPU as the planner sees it."""

    index: int  # CUDA index (PCI order), as profiles name GPUs
    name: str
    total_bytes: int
    """As CUDA sees the card (torch's total): NVML's total less the driver's reserve."""
    other_bytes: int
    """Held by what is not a traylm model: other programs (a desktop too) and the driver."""
    others: tuple[str, ...] = ()
    """The other programs, for messages ("pid 4242 (game) 8.0 GiB")."""
    reserved: bool = False
    driver_reserve_bytes: int = 0
    """What the driver reserves outside ``total_bytes`` (NVML v2's reserved), for messages."""


@dataclass(frozen=True)
class Resident:
    """A traylm model on one or more cards."""

    engine_id: str
    gpus: tuple[int, ...]
    hold_bytes: int  # per GPU now (asleep: what sleep keeps)
    busy: bool  # requests in flight or queued, or still loading
    pinned: bool
    last_used_s: float  # larger is more recent
    sleeping: bool = False
    sleep_frees_bytes: int | None = None  # per GPU; None: cannot sleep
    sleep_host_bytes: int = 0  # host RAM its weights take asleep


NeedOf = Callable[[Card, int], MemoryNeed]
"""(card, its free bytes) → what the engine takes there (the adapter's memory rule)."""


@dataclass(frozen=True)
class Request:
    model: str
    world_size: int
    need: NeedOf
    gpus: tuple[int, ...] | None = None  # fixed set; None: auto


def plan(
    request: Request,
    cards: Sequence[Card],
    residents: Sequence[Resident],
    *,
    host_free_bytes: int,
) -> Placement:
    """The placement for ``request`` now (see the module docstring for the rules)."""
    by_index = {c.index: c for c in cards}
    sets, refusal = _candidate_sets(request, cards, by_index)
    if refusal:
        return Placement(request.model, fits=False, reason=refusal)
    free = {c.index: _free(c, residents) for c in cards}
    used = {r.engine_id: r.last_used_s for r in residents}
    best: tuple[tuple[int, float, int, tuple[int, ...]], Placement] | None = None
    for gpus in sets:
        chosen = [by_index[i] for i in gpus]
        found = _fit_with_evictions(request, chosen, residents, free, host_free_bytes)
        if found is None:
            continue
        evictions, headroom, need = found
        # fewest evictions; then the set whose newest victim is the least recently used
        newest = max((used[e.engine_id] for e in evictions), default=0.0)
        key = (len(evictions), newest, -headroom, gpus)
        if best is None or key < best[0]:
            placement = Placement(
                request.model,
                fits=True,
                gpus=gpus,
                evictions=evictions,
                need_bytes_per_gpu=need.hold_bytes,
                free_bytes_per_gpu=tuple(max(0, free[i]) for i in gpus),
                reason=_fit_reason(chosen, free, need, evictions),
            )
            best = (key, placement)
    if best is not None:
        return best[1]
    return _refusal(request, sets, cards, residents, free, host_free_bytes)


def _candidate_sets(
    request: Request, cards: Sequence[Card], by_index: dict[int, Card]
) -> tuple[list[tuple[int, ...]], str]:
    here = ", ".join(str(c.index) for c in cards) or "none"
    if request.gpus is not None:
        missing = [i for i in request.gpus if i not in by_index]
        if missing:
            return [], f"GPU {missing[0]} does not exist; the GPUs here are {here}"
        if len(request.gpus) != request.world_size:
            return [], (
                f"{request.model} runs on {request.world_size} GPU(s) (tensor × pipeline "
                f"parallel) but {len(request.gpus)} were given"
            )
        return [tuple(request.gpus)], ""
    usable = [c.index for c in cards if not c.reserved]
    if len(usable) < request.world_size:
        reserved = [str(c.index) for c in cards if c.reserved]
        why = f" (GPU {', '.join(reserved)} reserved in gpu.reserved)" if reserved else ""
        return [], (
            f"{request.model} needs {request.world_size} GPU(s) but {len(usable)} can take a "
            f"model{why}; GPUs here: {here}"
        )
    return list(itertools.combinations(sorted(usable), request.world_size)), ""


def _free(card: Card, residents: Sequence[Resident]) -> int:
    """Negative when the bookings overrun the card (a reading taken mid-start)."""
    held = sum(r.hold_bytes for r in residents if card.index in r.gpus)
    return card.total_bytes - card.other_bytes - held


def _needs(request: Request, cards: Sequence[Card], free: dict[int, int]) -> dict[int, MemoryNeed]:
    return {c.index: request.need(c, free[c.index]) for c in cards}


def _short(needs: dict[int, MemoryNeed], free: dict[int, int]) -> list[int]:
    return [i for i, n in needs.items() if n.free_needed_bytes > free[i]]


def _fit_with_evictions(
    request: Request,
    cards: Sequence[Card],
    residents: Sequence[Resident],
    free: dict[int, int],
    host_free_bytes: int,
) -> tuple[tuple[Eviction, ...], int, MemoryNeed] | None:
    """(evictions, headroom, need) for this set, or None when even every idle model freed
    is not enough. Sleep first where possible; if that falls short, stops only."""
    for allow_sleep in (True, False):
        found = _evict_until_fit(request, cards, residents, free, host_free_bytes, allow_sleep)
        if found is not None:
            return found
    return None


def _evict_until_fit(
    request: Request,
    cards: Sequence[Card],
    residents: Sequence[Resident],
    free_now: dict[int, int],
    host_free_bytes: int,
    allow_sleep: bool,
) -> tuple[tuple[Eviction, ...], int, MemoryNeed] | None:
    free = dict(free_now)
    host_left = host_free_bytes - HOST_RAM_MARGIN_BYTES
    idle = sorted(
        (r for r in residents if not r.busy and not r.pinned),
        key=lambda r: (not r.sleeping, r.last_used_s),
    )
    evictions: list[Eviction] = []
    needs = _needs(request, cards, free)
    while short := _short(needs, free):
        victim = next((r for r in idle if set(r.gpus) & set(short)), None)
        if victim is None:
            return None
        idle.remove(victim)
        action, frees = "stop", victim.hold_bytes
        can_sleep = victim.sleep_frees_bytes is not None and not victim.sleeping
        if allow_sleep and can_sleep and victim.sleep_host_bytes <= host_left:
            action, frees = "sleep", victim.sleep_frees_bytes or 0
            host_left -= victim.sleep_host_bytes
        for i in victim.gpus:
            if i in free:
                free[i] += frees
        evictions.append(Eviction(victim.engine_id, action, frees, victim.gpus))
        needs = _needs(request, cards, free)
    need = max(needs.values(), key=lambda n: n.hold_bytes)
    headroom = min(free[i] - needs[i].hold_bytes for i in needs)
    return tuple(evictions), headroom, need


def _fit_reason(
    cards: Sequence[Card], free: dict[int, int], need: MemoryNeed, evictions: Sequence[Eviction]
) -> str:
    where = ", ".join(f"GPU {c.index} ({_gib(max(0, free[c.index]))} free)" for c in cards)
    freed = "; ".join(f"{e.action} {e.engine_id}" for e in evictions)
    return f"{where}; needs {_gib(need.free_needed_bytes)}: {need.rule}" + (
        f"; first {freed}" if freed else ""
    )


def _refusal(
    request: Request,
    sets: Sequence[tuple[int, ...]],
    cards: Sequence[Card],
    residents: Sequence[Resident],
    free: dict[int, int],
    host_free_bytes: int,
) -> Placement:
    """Why no set fits: what is where and how much is needed."""
    used = sorted({i for s in sets for i in s})
    by_index = {c.index: c for c in cards}
    need = request.need(by_index[used[0]], free[used[0]]) if used else None
    lines = [_card_line(by_index[i], residents, free[i]) for i in used]
    reserved = [str(c.index) for c in cards if c.reserved and c.index not in used]
    if reserved:
        lines.append(f"GPU {', '.join(reserved)} reserved (gpu.reserved)")
    busy_only = any(
        _fit_with_evictions(
            request,
            [by_index[i] for i in s],
            [_unbusy(r) for r in residents],
            free,
            host_free_bytes,
        )
        for s in sets
    )
    needed = _gib(need.free_needed_bytes) if need else "?"
    per = "each of" if request.world_size > 1 else "one of"
    reason = (
        f"{request.model} needs {needed} free on {per} {request.world_size} GPU(s) "
        f"({need.rule if need else ''}); "
        + "; ".join(lines)
        + (
            ". It fits once the busy models finish their requests: retry shortly"
            if busy_only
            else ". Close what holds the memory, unload a pinned model (`traylm unload NAME`), "
            "lower gpu_memory_utilization, or pick GPUs with `traylm load NAME --gpus N`"
        )
    )
    return Placement(
        request.model,
        fits=False,
        need_bytes_per_gpu=need.hold_bytes if need else 0,
        reason=reason,
        retry_later=busy_only,
    )


def plan_host(
    model: str, need: MemoryNeed, residents: Sequence[Resident], *, host_free_bytes: int
) -> Placement:
    """The placement of a CPU engine: host RAM for ``need``, after stopping idle CPU models
    (``residents``: the models on the CPU, ``hold_bytes`` their host RAM booking) if it must.
    ``host_free_bytes``: free for traylm now (what the host has available, less what the CPU
    models booked but have not taken yet)."""
    free = host_free_bytes - HOST_RAM_MARGIN_BYTES
    idle = sorted(
        (r for r in residents if not r.busy and not r.pinned), key=lambda r: r.last_used_s
    )
    evictions: list[Eviction] = []
    while need.free_needed_bytes > free and idle:
        victim = idle.pop(0)
        free += victim.hold_bytes
        evictions.append(Eviction(victim.engine_id, "stop", victim.hold_bytes, ()))
    if need.free_needed_bytes <= free:
        freed = "; ".join(f"stop {e.engine_id}" for e in evictions)
        reason = f"host RAM ({_gib(max(0, free))} free); needs {_gib(need.hold_bytes)}: " + (
            need.rule + (f"; first {freed}" if freed else "")
        )
        return Placement(
            model,
            fits=True,
            evictions=tuple(evictions),
            reason=reason,
            on_cpu=True,
            host_bytes=need.hold_bytes,
        )
    held = [r for r in residents if r.busy or r.pinned]
    busy_only = free + sum(r.hold_bytes for r in held if not r.pinned) >= need.free_needed_bytes
    who = "; ".join(
        f"{r.engine_id} {_gib(r.hold_bytes)} ({'pinned' if r.pinned else 'busy'})" for r in held
    )
    reason = (
        f"{model} needs {_gib(need.free_needed_bytes)} of host RAM ({need.rule}) but "
        f"{_gib(max(0, host_free_bytes))} is free and traylm keeps "
        f"{_gib(HOST_RAM_MARGIN_BYTES)} for the system"
        + (f"; on the CPU: {who}" if who else "")
        + (
            ". It fits once the busy models finish their requests: retry shortly"
            if busy_only
            else ". Close programs that use the RAM, unload a pinned model (`traylm unload "
            "NAME`), or lower the profile's cpu_kv_cache_gib"
        )
    )
    return Placement(
        model,
        fits=False,
        reason=reason,
        retry_later=busy_only,
        on_cpu=True,
        host_bytes=need.hold_bytes,
    )


def plan_copies(
    model: str,
    count: int,
    plan_one: Callable[[int, Sequence[Resident], int], Placement],
    residents: Sequence[Resident],
    *,
    host_free_bytes: int,
    gpus_per_copy: int,
) -> tuple[Placement, ...] | Placement:
    """Each of ``count`` copies placed in turn (``plan_one(copy index from 0, residents,
    host free)``), or the refusal (a Placement that does not fit) naming the copy."""
    placed: list[Placement] = []
    now = list(residents)
    host_free = host_free_bytes
    for i in range(count):
        found = plan_one(i, now, host_free)
        if not found.fits:
            return _copy_refusal(model, i, count, found, gpus_per_copy)
        placed.append(found)
        evicted = {e.engine_id for e in found.evictions}
        now = [r for r in now if r.engine_id not in evicted]
        host_free += sum(e.frees_bytes for e in found.evictions if found.on_cpu)
        host_free -= found.host_bytes
        hold = found.need_bytes_per_gpu
        now.append(Resident(f"{model} copy {i + 1}", found.gpus, hold, True, False, 0.0))
    return tuple(placed)


def copy_cards(cards: Sequence[Card], taken: set[int], world_size: int) -> list[Card]:
    """The cards an ``auto`` copy may go to: those no earlier copy took, while enough usable
    ones remain; else all of them (a copy then shares a card when it fits beside the other)."""
    free = [c for c in cards if c.index not in taken]
    return free if sum(not c.reserved for c in free) >= world_size else list(cards)


def _copy_refusal(
    model: str, index: int, count: int, found: Placement, gpus_per_copy: int
) -> Placement:
    if index == 0:
        fix = (
            "; one copy does not fit one GPU: serve one copy across GPUs with tensor parallel "
            "(tensor_parallel_size = 2, replicas = 1)"
            if gpus_per_copy == 1 and not found.on_cpu
            else ""
        )
        why = f"{model} cannot place one of its {count} replicas: {found.reason}{fix}"
    else:
        spans = (
            f" (each copy spans {gpus_per_copy} GPUs with tensor parallel: one copy across "
            "them, replicas = 1, may be what this machine has room for)"
            if gpus_per_copy > 1
            else ""
        )
        why = (
            f"{model}: replica {index + 1} of {count} cannot be placed beside the "
            f"{'first' if index == 1 else f'{index} before it'}: {found.reason}. There is room "
            f"for {index}: load it with --replicas {index}{spans}"
        )
    return dataclasses.replace(found, reason=why)


def _unbusy(r: Resident) -> Resident:
    return Resident(
        r.engine_id,
        r.gpus,
        r.hold_bytes,
        False,
        r.pinned,
        r.last_used_s,
        r.sleeping,
        r.sleep_frees_bytes,
        r.sleep_host_bytes,
    )


def _card_line(card: Card, residents: Sequence[Resident], free: int) -> str:
    size = _gib(card.total_bytes) + (
        f" after the driver's {_gib(card.driver_reserve_bytes)}"
        if card.driver_reserve_bytes
        else ""
    )
    parts = [f"GPU {card.index} ({size}): {_gib(max(0, free))} free"]
    if card.other_bytes >= SMALL_BYTES or card.others:
        who = f" ({', '.join(card.others)})" if card.others else ""
        parts.append(f"{_gib(card.other_bytes)} held by other programs and the driver{who}")
    for r in residents:
        if card.index in r.gpus:
            why = "pinned" if r.pinned else "busy" if r.busy else "asleep" if r.sleeping else "idle"
            parts.append(f"{r.engine_id} {_gib(r.hold_bytes)} ({why})")
    return ", ".join(parts)


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"
