"""Making room: when another program (a game, Blender, ComfyUI) takes memory on a GPU that
holds an idle traylm model, the model gets out of its way, and comes back once it exits.

It reads every GPU sample (``gpu.sample``). A program that is not traylm's (the sampler marks
engine processes) *claims* its card when it appears or grows while the card has less than
``engines.make_room_margin_gib`` free, or as soon as it appears when ``make_room_always`` names
it; ``make_room_ignore`` names programs never made room for (the desktop's own by default).
Programs present at the first sample are the machine as traylm found it: they claim nothing
until they grow. A claim frees the card of every idle model on it (``Placer.freeing``): vLLM's
sleep mode where the engine has it and host RAM takes the weights, else an unload. A model with
a request running or queued, pinned (`traylm load --pin`), loading or being unloaded is never
touched: the claim waits (said once, ``kept``) until the model is idle, or until the program
no longer needs the memory.

The models come back once every program of the claim (by pid and by name: a program that
restarts has a new pid) has been gone ``make_room_return_s`` and the card has the memory they
take free again, margin included (else on their next request, which the on-demand path serves
anyway). Against a program that flaps in and out: one back within the return time cancels the
return (the models stay asleep), and room made again on a card soon after its models came back
doubles that card's return time, up to ``MAX_RETURN_S``.

Every step is published (``model.room``, RoomMade) with the sentence the tray shows as a
notice. One step runs at a time, under the lifecycle's lock like every other change of what is
loaded; a failed step leaves each model asleep, unloaded or as it was, and says which.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fnmatch
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from engines.config.live import SettingsView
from engines.core.bus import EventBus
from engines.errors import TraylmError
from engines.events.codec import Event
from engines.events.core import EngineState, Notice
from engines.events.gpu import GPUInfo, GPUProcess, GPUSampled, GPUSnapshot, GPUState
from engines.events.models import Eviction, FreedModel, RoomMade
from engines.gpu.backend import cuda_order
from engines.ondemand.lifecycle import Engines, Lifecycle
from engines.ondemand.planner import Resident
from engines.runtime.adapters.memory import GIB

log = logging.getLogger(__name__)

MAX_RETURN_S = 600.0
FLAP_WINDOW_S = 120.0
"""Room made again on a card this soon after its models came back doubles its return time."""
SOURCE = "ondemand.room"
FRESH_S = 30.0
"""A program this new still claims its card when the free memory falls under the margin."""

Freeing = Callable[[int], tuple[list[Eviction], list[Resident]]]
"""GPU (CUDA index) → the evictions that free it, and the models left on it (Placer.freeing)."""
BringBack = Callable[[str, str], Awaitable[None]]
"""(model name, engine id) → the model loaded or woken again (a load's flight, awaited)."""


@dataclass
class Claim:
    """Room made on one card for a program (and its namesakes), and what was freed."""

    gpu: int
    program: str
    pid: int
    pids: set[int]
    names: set[str]
    freed: list[FreedModel]
    gone_since_s: float | None = None


@dataclass
class _Card:
    seen: dict[int, int] | None = None
    """pid → bytes at the last process list (None before the first)."""
    waiting: dict[int, GPUProcess] = field(default_factory=dict)
    """Programs that claimed the card while its models could not be touched."""
    told: set[int] = field(default_factory=set)
    """Programs already told that the models stay (said once)."""
    return_s: float = 0.0
    back_at_s: float | None = None
    low: bool = False
    """The card had less than the margin free at the last sample."""
    first_seen_s: dict[int, float] = field(default_factory=dict)


class RoomMaker:
    def __init__(
        self,
        *,
        settings: SettingsView,
        engines: Engines,
        lifecycle: Lifecycle,
        infos: Callable[[], tuple[GPUInfo, ...]],
        freeing: Freeing,
        bring_back: BringBack,
        sample_after: Callable[[float], Awaitable[None]],
        publish: Callable[[Event], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """No I/O."""
        self._settings = settings
        self._engines = engines
        self._lifecycle = lifecycle
        self._infos = infos
        self._freeing = freeing
        self._bring_back = bring_back
        self._sample_after = sample_after
        self._publish = publish
        self._clock = clock
        self._cards: dict[str, _Card] = {}
        self.claims: list[Claim] = []
        self._step: asyncio.Task[None] | None = None

    async def run(self, bus: EventBus) -> None:
        """Read every GPU sample until cancelled."""
        with bus.subscribe(frozenset({GPUSampled.kind})) as sub:
            try:
                while True:
                    event = await sub.get()
                    if isinstance(event, GPUSampled) and not self._stepping():
                        try:
                            self.observe(event.gpus)
                        except Exception:  # boundary: one bad sample must not end making room
                            log.exception("making room: a sample could not be read")
            finally:
                if self._step is not None:
                    self._step.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await self._step

    def _stepping(self) -> bool:
        return self._step is not None and not self._step.done()

    # ----------------------------------------------------------------- per sample

    def observe(self, snaps: Iterable[GPUSnapshot]) -> None:
        """One sample: claims, and returns whose time has come (at most one step starts)."""
        order = {info.uuid: i for i, info in enumerate(cuda_order(self._infos()))}
        now = self._clock()
        for snap in snaps:
            index = order.get(snap.uuid)
            if index is None or snap.state != GPUState.OK or snap.processes is None:
                continue
            step = self._card(index, snap, now)
            if step is not None:
                self._step = asyncio.ensure_future(step)
                return

    def _card(self, index: int, snap: GPUSnapshot, now_s: float) -> Awaitable[None] | None:
        e = self._settings.current.engines
        card = self._cards.setdefault(snap.uuid, _Card(return_s=e.make_room_return_s))
        if card.back_at_s is not None and now_s - card.back_at_s > MAX_RETURN_S:
            card.return_s, card.back_at_s = e.make_room_return_s, None  # quiet again
        others = [p for p in snap.processes or () if not p.engine_id and p.used_memory_bytes]
        present = {p.pid: p for p in others if not _named(p.name, e.make_room_ignore)}
        free = snap.memory_free_bytes
        low = free is not None and free < e.make_room_margin_gib * GIB
        seen, card.seen = card.seen, {p.pid: p.used_memory_bytes or 0 for p in others}
        for pid in set(card.waiting) - set(present):
            card.waiting.pop(pid)
        card.told &= set(present)
        fell, card.low = low and not card.low, low
        for pid in present:
            card.first_seen_s.setdefault(pid, now_s)
        for pid in set(card.first_seen_s) - set(present):
            card.first_seen_s.pop(pid)
        if seen is not None and e.make_room:
            for p in present.values():
                grew = p.pid not in seen or (p.used_memory_bytes or 0) > seen[p.pid]
                # free memory fell under the margin just after it appeared (its memory was
                # read before the engine's, or the engine grew into what it left)
                grew = grew or (fell and now_s - card.first_seen_s[p.pid] < FRESH_S)
                always = p.pid not in seen and _named(p.name, e.make_room_always)
                if always or (grew and low):
                    card.waiting[p.pid] = p
        step = self._claim(index, card, present, low)
        return step if step is not None else self._return(index, card, present, free, now_s)

    def _claim(
        self, index: int, card: _Card, present: dict[int, GPUProcess], low: bool
    ) -> Awaitable[None] | None:
        e = self._settings.current.engines
        if not card.waiting:
            return None
        if not low and not any(_named(p.name, e.make_room_always) for p in card.waiting.values()):
            card.waiting.clear()  # it found the memory it needed
            return None
        for claim in self.claims:  # a program of a claim back within its return time
            if claim.gpu == index and any(
                p.pid in claim.pids or p.name in claim.names for p in card.waiting.values()
            ):
                claim.pids.update(card.waiting)
                claim.names.update(p.name for p in card.waiting.values() if p.name)
                claim.gone_since_s = None
        freed, kept = self._freeing(index)
        program = max(card.waiting.values(), key=lambda p: p.used_memory_bytes or 0)
        if not freed:
            if kept and program.pid not in card.told:
                card.told.add(program.pid)
                text = _kept(index, program, kept)
                self._say(index, program.name, program.pid, "kept", (), text)
            if not kept:
                card.waiting.clear()  # no traylm model on the card: nothing to free
            return None
        claimed = dict(card.waiting)
        card.waiting.clear()
        if card.back_at_s is not None and self._clock() - card.back_at_s < FLAP_WINDOW_S:
            card.return_s = min(MAX_RETURN_S, card.return_s * 2)
        return self._make_room(index, card, program, claimed, freed)

    def _return(
        self,
        index: int,
        card: _Card,
        present: dict[int, GPUProcess],
        free: int | None,
        now_s: float,
    ) -> Awaitable[None] | None:
        names = {p.name for p in present.values() if p.name}
        for claim in [c for c in self.claims if c.gpu == index]:
            claim.freed = [m for m in claim.freed if self._still_away(m)]
            if not claim.freed:
                self.claims.remove(claim)  # woken by a request, unloaded by hand
                continue
            if claim.pids & set(present) or claim.names & names:
                claim.gone_since_s = None
                continue
            if claim.gone_since_s is None:
                claim.gone_since_s = now_s
            need = sum(m.frees_bytes for m in claim.freed)
            margin = self._settings.current.engines.make_room_margin_gib * GIB
            if now_s - claim.gone_since_s < card.return_s or free is None or free < need + margin:
                continue
            self.claims.remove(claim)
            card.back_at_s = now_s
            return self._come_back(claim)
        return None

    def _still_away(self, model: FreedModel) -> bool:
        engine = self._engines.get(model.engine_id)
        if model.action == "sleep":
            return engine is not None and engine.state == EngineState.SLEEPING
        return engine is None or engine.state in (EngineState.STOPPED, EngineState.FAILED)

    # ----------------------------------------------------------------- steps

    async def _make_room(
        self,
        index: int,
        card: _Card,
        program: GPUProcess,
        claimed: dict[int, GPUProcess],
        evictions: list[Eviction],
    ) -> None:
        freed: list[FreedModel] = []
        failed: list[str] = []
        async with self._lifecycle.lock:
            for eviction in evictions:
                res = self._lifecycle.residency.get(eviction.engine_id)
                name = res.name if res is not None else eviction.engine_id
                try:
                    await self._lifecycle.evict(eviction, reason="room")
                except TraylmError as exc:  # a request came in meanwhile, or sleep refused
                    log.info("making room: %s stays: %s", eviction.engine_id, exc.message)
                    failed.append(f"{name} stays ({exc.message})")
                    continue
                freed.append(
                    FreedModel(name, eviction.engine_id, eviction.action, eviction.frees_bytes)
                )
        await self._sample_after(self._clock())
        if freed:
            names = {p.name for p in claimed.values() if p.name}
            claim = Claim(index, program.name, program.pid, set(claimed), names, freed)
            self.claims.append(claim)
            message = _made(index, program, freed, card.return_s, self._settings)
            self._say(index, program.name, program.pid, "made", tuple(freed), message)
        if failed:
            text = f"GPU {index}: " + "; ".join(failed)
            self._say(index, program.name, program.pid, "failed", (), text)

    async def _come_back(self, claim: Claim) -> None:
        back: list[FreedModel] = []
        failed: list[str] = []
        for model in claim.freed:
            saved = self._lifecycle.residency.get(model.engine_id)
            saved = dataclasses.replace(saved) if saved is not None else None
            try:
                await self._bring_back(model.name, model.engine_id)
            except TraylmError as exc:
                log.info("making room: %s did not come back: %s", model.name, exc.message)
                failed.append(f"{model.name} did not come back ({exc.message})")
                continue
            res = self._lifecycle.residency.get(model.engine_id)
            if saved is not None and res is not None:  # the TTL it had, not a fresh one
                res.ttl_s, res.keep_alive_s = saved.ttl_s, saved.keep_alive_s
            back.append(model)
        who = _who(claim.program, claim.pid)
        if back:
            names = _names(back)
            verb = "is" if len(back) == 1 else "are"
            message = f"{who} exited: {names} {verb} back on GPU {claim.gpu}"
            self._say(claim.gpu, claim.program, claim.pid, "back", tuple(back), message)
        if failed:
            message = f"{who} exited, but " + "; ".join(failed) + ": it loads on its next request"
            self._say(claim.gpu, claim.program, claim.pid, "failed", (), message)

    # ----------------------------------------------------------------- what is said

    def _say(
        self,
        index: int,
        program: str,
        pid: int,
        phase: str,
        models: tuple[FreedModel, ...],
        text: str,
    ) -> None:
        """Publish one step (RoomMade) and the notice the tray shows; ``program`` may be ""."""
        program = _who(program, pid)
        log.info("making room on GPU %d for %s (pid %d): %s", index, program, pid, text)
        self._publish(
            RoomMade(gpu=index, program=program, pid=pid, phase=phase, models=models, message=text)
        )
        titles = {
            "made": f"Made room on GPU {index}",
            "back": f"Back on GPU {index}",
            "kept": f"GPU {index} is busy",
            "failed": f"Making room on GPU {index}",
        }
        level = "warning" if phase in ("kept", "failed") else "info"
        self._publish(Notice(level=level, title=titles[phase], message=text, source=SOURCE))


def _named(name: str, patterns: Iterable[str]) -> bool:
    """``name`` matches one of the patterns (shell-style, case-insensitive)."""
    low = name.lower()
    return bool(name) and any(fnmatch.fnmatchcase(low, p.lower()) for p in patterns)


def _who(program: str, pid: int) -> str:
    return program or f"pid {pid}"


def _names(models: list[FreedModel]) -> str:
    return ", ".join(m.name for m in models)


def _made(
    index: int,
    program: GPUProcess,
    freed: list[FreedModel],
    return_s: float,
    settings: SettingsView,
) -> str:
    """ "Made room on GPU 1 for blender: qwen-32b sleeps; it comes back when blender exits"."""
    who = _who(program.name, program.pid)
    done = ", ".join(f"{m.name} {'sleeps' if m.action == 'sleep' else 'unloaded'}" for m in freed)
    it = "it comes" if len(freed) == 1 else "they come"
    when = f"when {who} exits"
    if return_s > settings.current.engines.make_room_return_s:
        when = f"{return_s:.0f} s after {who} exits ({who} came back soon after last time)"
    return f"Made room on GPU {index} for {who}: {done}; {it} back {when}"


def _kept(index: int, program: GPUProcess, kept: list[Resident]) -> str:
    who = _who(program.name, program.pid)
    why = ", ".join(
        f"{r.engine_id} ({'pinned' if r.pinned else 'answering requests' if r.busy else 'busy'})"
        for r in kept
    )
    one = len(kept) == 1
    command = f"`traylm unload {kept[0].engine_id}`" if one else "`traylm unload` each"
    return (
        f"{who} needs memory on GPU {index}, but {why} {'stays' if one else 'stay'}: traylm "
        f"makes room once {'it is' if one else 'they are'} idle; unload {'it' if one else 'them'}"
        f" to free the card now (Unload in the tray, or {command})"
    )
