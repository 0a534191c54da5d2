"""What the app knows about the GPUs, on the GUI thread: the overview loaded at connect, kept
fresh by the daemon's gpu.* events. The GPU page, the Fans & power page and the tray read it;
only ``apply`` (called by AppState) changes it.

"Hot" is the tray's red-hot state: the thermal guard has acted on a GPU (any level above
normal), or a GPU reports a thermal slowdown right now.
"""

from __future__ import annotations

import dataclasses

from PySide6.QtCore import QObject, Signal

from desktop.daemon.messages import EfficiencyLoaded, GPUsLoaded
from engines.events import (
    EfficiencyProfiles,
    EngineEnergy,
    GPUEnergyUpdated,
    GPUGuardAction,
    GPUHelperChanged,
    GPUInfo,
    GPUOverview,
    GPUSampled,
    GPUSnapshot,
    GPUState,
    GPUStateChanged,
    GuardLevel,
)

THERMAL_REASONS = frozenset({"software thermal slowdown", "hardware thermal slowdown"})


class GPUWatch(QObject):
    overview_changed = Signal()  # infos, helper, energy, PSU or backend state changed
    sampled = Signal(object)  # GPUSampled
    hot_changed = Signal(bool)
    guard_acted = Signal(object)  # GPUGuardAction
    efficiency_changed = Signal()  # the efficiency profiles, or the one in force, changed

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.overview: GPUOverview | None = None
        self.error = ""  # why there is no overview (an older daemon, not connected)
        self.latest: dict[str, GPUSnapshot] = {}
        self.guard_levels: dict[str, GuardLevel] = {}
        self.hot = False
        self.efficiency: EfficiencyProfiles | None = None
        self.efficiency_error = ""  # why there are no profiles to switch (an older daemon)

    # ----------------------------------------------------------------- derived facts

    @property
    def available(self) -> bool:
        return self.overview is not None and bool(self.overview.gpus)

    @property
    def simulated(self) -> bool:
        return self.overview is not None and self.overview.simulated

    def infos(self) -> list[GPUInfo]:
        return [e.info for e in self.overview.gpus] if self.overview is not None else []

    def info(self, uuid: str) -> GPUInfo | None:
        return next((i for i in self.infos() if i.uuid == uuid), None)

    def energy_for(self, uuid: str) -> list[EngineEnergy]:
        if self.overview is None:
            return []
        return [e for e in self.overview.energy if uuid in e.gpus]

    def profile_in_force(self) -> str | None:
        """The efficiency profile in force on every GPU; None when none is, or they differ."""
        ef, uuids = self.efficiency, [i.uuid for i in self.infos()]
        if ef is None or not uuids:
            return None
        names = {ef.in_force.get(u) for u in uuids}
        return names.pop() if len(names) == 1 else None

    def tooltip_lines(self) -> list[str]:
        """One line per GPU: temperature and power against the limit."""
        lines = []
        for info in self.infos():
            snap = self.latest.get(info.uuid)
            if snap is None or snap.state != GPUState.OK:
                state = snap.state if snap is not None else "no reading yet"
                lines.append(f"GPU {info.index}: {state}")
                continue
            temp = f"{snap.temperature_c} °C" if snap.temperature_c is not None else "? °C"
            power = _watts(snap.power_draw_mw)
            limit = _watts(snap.power_limit_mw)
            level = self.guard_levels.get(info.uuid, GuardLevel.NORMAL)
            guard = f"  [guard: {level.name.lower()}]" if level > GuardLevel.NORMAL else ""
            lines.append(f"GPU {info.index}: {temp} · {power} / {limit}{guard}")
        if lines and self.simulated:
            lines[0] = "SIMULATED " + lines[0]
        return lines

    # ----------------------------------------------------------------- updates

    def apply(self, message: object) -> None:
        if isinstance(message, GPUsLoaded):
            self._on_loaded(message)
        elif isinstance(message, EfficiencyLoaded):
            if (message.profiles, message.error) != (self.efficiency, self.efficiency_error):
                self.efficiency, self.efficiency_error = message.profiles, message.error
                self.efficiency_changed.emit()
        elif isinstance(message, GPUSampled):
            for snap in message.gpus:
                self.latest[snap.uuid] = snap
            self.sampled.emit(message)
            self._update_hot()
        elif isinstance(message, GPUGuardAction):
            self.guard_levels[message.uuid] = message.level
            self.guard_acted.emit(message)
            self._update_hot()
        elif self.overview is not None:
            self._apply_to_overview(message)

    def _on_loaded(self, message: GPUsLoaded) -> None:
        self.overview, self.error = message.overview, message.error
        self.latest = {}
        self.guard_levels = {}
        if message.overview is not None:
            for entry in message.overview.gpus:
                self.guard_levels[entry.info.uuid] = entry.guard_level
                if entry.snapshot is not None:
                    self.latest[entry.info.uuid] = entry.snapshot
        self.overview_changed.emit()
        self._update_hot()

    def _apply_to_overview(self, message: object) -> None:
        ov = self.overview
        assert ov is not None
        if isinstance(message, GPUHelperChanged):
            self.overview = dataclasses.replace(ov, helper=message.status)
        elif isinstance(message, GPUEnergyUpdated):
            others = tuple(e for e in ov.energy if e.engine_id != message.energy.engine_id)
            self.overview = dataclasses.replace(
                ov, energy=(*others, message.energy), psu=message.psu or ov.psu
            )
        elif isinstance(message, GPUStateChanged) and not message.uuid:
            self.overview = dataclasses.replace(ov, state=message.state, message=message.message)
        else:
            return
        self.overview_changed.emit()

    def clear(self, reason: str) -> None:
        """The daemon is gone: nothing is known until it is back."""
        self._on_loaded(GPUsLoaded(None, reason))
        self.apply(EfficiencyLoaded(None, reason))

    def _update_hot(self) -> None:
        hot = any(level > GuardLevel.NORMAL for level in self.guard_levels.values()) or any(
            THERMAL_REASONS & set(s.clock_event_reasons) for s in self.latest.values()
        )
        if hot != self.hot:
            self.hot = hot
            self.hot_changed.emit(hot)


def _watts(mw: int | None) -> str:
    return "? W" if mw is None else f"{mw / 1000:.0f} W"
