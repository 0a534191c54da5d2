"""The thermal guard: escalating actions as a GPU nears its slowdown temperature.

Thresholds are margins below each card's own slowdown temperature (settings ``gpu.guard_*``).
Steps, in order: 1 notice (event + notification), 2 lower the power limit through traylm-gpud,
3 pause new requests at the gateway, 4 stop the engines that use that GPU. The first step is
taken at once; each further one only after ``guard_step_s`` at the previous step while the
temperature is still past its threshold, so a lower power limit gets a chance to work. Once the
GPU is ``guard_hysteresis_c`` below the notice threshold the guard stands down: the gateway
resumes and the power limit goes back. Every action is logged and published as
``GPUGuardAction``; a failed action is shown too, and the guard moves on.
"""

from __future__ import annotations

import collections
import itertools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from engines.config.sections import GPUSettings
from engines.events.gpu import GPUGuardAction, GPUInfo, GPUSnapshot, GPUState, GuardGPU, GuardLevel

log = logging.getLogger(__name__)

PAUSE_PREFIX = "thermal guard"
"""The guard's pause reasons start with this; it lifts a gateway pause only when it is its own."""

DEFAULT_SLOWDOWN_C = 90  # when a card does not report its own (RTX 4090: ~90 °C)
THRESHOLD_FIELDS = (
    "guard_notice_margin_c",
    "guard_power_margin_c",
    "guard_pause_margin_c",
    "guard_stop_margin_c",
    "guard_power_pct",
    "guard_step_s",
    "guard_hysteresis_c",
)
ACTION_OF_LEVEL = {
    GuardLevel.NOTICE: "notice",
    GuardLevel.POWER: "lower_power",
    GuardLevel.PAUSE: "pause",
    GuardLevel.STOP: "stop_engine",
}


@dataclass(frozen=True)
class GuardThresholds:
    enabled: bool = True
    notice_margin_c: float = 10.0
    power_margin_c: float = 7.0
    pause_margin_c: float = 4.0
    stop_margin_c: float = 2.0
    power_pct: float = 70.0
    step_s: float = 10.0
    hysteresis_c: float = 3.0

    @classmethod
    def from_settings(cls, s: GPUSettings) -> GuardThresholds:
        return cls(
            enabled=s.guard_enabled,
            notice_margin_c=s.guard_notice_margin_c,
            power_margin_c=s.guard_power_margin_c,
            pause_margin_c=s.guard_pause_margin_c,
            stop_margin_c=s.guard_stop_margin_c,
            power_pct=s.guard_power_pct,
            step_s=s.guard_step_s,
            hysteresis_c=s.guard_hysteresis_c,
        )

    def problems(self) -> list[str]:
        margins = [
            ("guard_notice_margin_c", self.notice_margin_c),
            ("guard_power_margin_c", self.power_margin_c),
            ("guard_pause_margin_c", self.pause_margin_c),
            ("guard_stop_margin_c", self.stop_margin_c),
        ]
        out = []
        for (n0, v0), (n1, v1) in itertools.pairwise(margins):
            if v1 > v0:
                out.append(
                    f"{n1} = {v1:g} must not exceed {n0} = {v0:g}: each step acts closer to the "
                    "slowdown temperature than the one before"
                )
        return out

    def margin_c(self, level: GuardLevel) -> float:
        return {
            GuardLevel.NOTICE: self.notice_margin_c,
            GuardLevel.POWER: self.power_margin_c,
            GuardLevel.PAUSE: self.pause_margin_c,
            GuardLevel.STOP: self.stop_margin_c,
        }[level]

    def as_mapping(self) -> dict[str, float]:
        return {
            "guard_notice_margin_c": self.notice_margin_c,
            "guard_power_margin_c": self.power_margin_c,
            "guard_pause_margin_c": self.pause_margin_c,
            "guard_stop_margin_c": self.stop_margin_c,
            "guard_power_pct": self.power_pct,
            "guard_step_s": self.step_s,
            "guard_hysteresis_c": self.hysteresis_c,
        }


@dataclass(frozen=True)
class Step:
    """One transition the guard decided on."""

    uuid: str
    index: int
    level: GuardLevel  # the level after the step
    action: str  # see ACTION_OF_LEVEL, or "stand_down"
    temperature_c: int | None
    threshold_c: float
    previous: GuardLevel


class GuardActions(Protocol):
    """What the daemon lets the guard do. Each returns a line saying what happened; failures
    raise TraylmError (the guard records them and carries on)."""

    async def notice(self, step: Step, text: str) -> str: ...

    async def lower_power(self, step: Step, power_pct: float) -> str: ...

    async def pause(self, step: Step, reason: str) -> str: ...

    async def stop_engines(self, step: Step) -> str: ...

    async def stand_down(self, step: Step) -> str: ...


@dataclass
class _Track:
    level: GuardLevel = GuardLevel.NORMAL
    since_s: float | None = None
    temperature_c: int | None = None
    slowdown_c: int = DEFAULT_SLOWDOWN_C


class ThermalGuard:
    def __init__(self, thresholds: GuardThresholds, *, simulated: bool = False) -> None:
        self.thresholds = thresholds
        self.simulated = simulated
        self._tracks: dict[str, _Track] = {}
        self._index: dict[str, int] = {}
        self.actions: collections.deque[GPUGuardAction] = collections.deque(maxlen=50)

    def level(self, uuid: str) -> GuardLevel:
        track = self._tracks.get(uuid)
        return track.level if track else GuardLevel.NORMAL

    def evaluate(
        self, snapshots: Sequence[GPUSnapshot], infos: Mapping[str, GPUInfo], now_s: float
    ) -> list[Step]:
        """Decide the steps to take now (pure: no action is taken here)."""
        th = self.thresholds
        steps: list[Step] = []
        for snap in snapshots:
            info = infos.get(snap.uuid)
            track = self._tracks.setdefault(snap.uuid, _Track())
            self._index[snap.uuid] = snap.index
            track.temperature_c = snap.temperature_c
            if info is not None and info.slowdown_temperature_c:
                track.slowdown_c = info.slowdown_temperature_c
            if not th.enabled or snap.state != GPUState.OK or snap.temperature_c is None:
                continue
            t = snap.temperature_c
            notice_c = track.slowdown_c - th.notice_margin_c
            if track.level > GuardLevel.NORMAL and t < notice_c - th.hysteresis_c:
                steps.append(
                    Step(
                        snap.uuid,
                        snap.index,
                        GuardLevel.NORMAL,
                        "stand_down",
                        t,
                        notice_c,
                        track.level,
                    )
                )
                track.level, track.since_s = GuardLevel.NORMAL, now_s
                continue
            if track.level >= GuardLevel.STOP:
                continue
            nxt = GuardLevel(track.level + 1)
            threshold = track.slowdown_c - th.margin_c(nxt)
            if t < threshold:
                continue
            waited = now_s - (track.since_s if track.since_s is not None else now_s)
            if track.level > GuardLevel.NORMAL and waited < th.step_s:
                continue
            steps.append(
                Step(snap.uuid, snap.index, nxt, ACTION_OF_LEVEL[nxt], t, threshold, track.level)
            )
            track.level, track.since_s = nxt, now_s
        return steps

    async def act(self, steps: Sequence[Step], actions: GuardActions) -> list[GPUGuardAction]:
        """Carry the steps out; returns the events (also kept in ``self.actions``)."""
        from engines.errors import TraylmError

        done = []
        for step in steps:
            ok = True
            try:
                detail = await self._do(step, actions)
            except TraylmError as exc:
                ok, detail = False, f"{step.action} failed: {exc.message}"
            event = GPUGuardAction(
                uuid=step.uuid,
                gpu_index=step.index,
                level=step.level,
                action=step.action,
                detail=detail,
                temperature_c=step.temperature_c,
                threshold_c=step.threshold_c,
                ok=ok,
                simulated=self.simulated,
            )
            (log.warning if ok else log.error)("thermal guard, GPU %d: %s", step.index, detail)
            self.actions.append(event)
            done.append(event)
        return done

    async def _do(self, step: Step, actions: GuardActions) -> str:
        t = step.temperature_c
        where = f"GPU {step.index} is at {t} °C (threshold {step.threshold_c:g} °C)"
        if step.action == "notice":
            slowdown_c = step.threshold_c + self.thresholds.notice_margin_c
            return await actions.notice(step, f"{where}; it slows down at {slowdown_c:g} °C")
        if step.action == "lower_power":
            return await actions.lower_power(step, self.thresholds.power_pct)
        if step.action == "pause":
            return await actions.pause(step, f"{PAUSE_PREFIX}: {where}")
        if step.action == "stop_engine":
            return await actions.stop_engines(step)
        return await actions.stand_down(step)

    def status(self) -> tuple[GuardGPU, ...]:
        return tuple(
            GuardGPU(
                uuid=uuid,
                index=self._index.get(uuid, -1),
                level=track.level,
                temperature_c=track.temperature_c,
                slowdown_c=track.slowdown_c,
                since_s=track.since_s,
            )
            for uuid, track in self._tracks.items()
        )
