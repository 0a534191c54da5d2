"""``HelperCore``: what traylm-gpud controls, and how it gives control back.

Each fan and each GPU's power limit has up to three layers of settings: ``persist`` (saved in the
state file, re-applied at start and after a resume), ``lease`` (held by one client connection:
released when it goes away) and ``guard`` (the thermal guard's lower power limit, also a lease).
The highest layer present wins (guard > lease > persist); with none, the fan belongs to the
firmware and the power limit is the card's default.

Safety rules: nothing is applied before it is validated against the card; a failed temperature
read hands that GPU's fans back to the firmware; a lost GPU is dropped; ``restore_all`` (exit,
signals, errors) gives every fan back to the firmware, every limit back to the default and every
clock lock back to the driver (clock locks have the lease and persist layers only). All
methods are blocking (NVML) and thread-safe.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engines.errors import GPUError, GPUNotFound, GPUNotSupported
from engines.events.codec import to_plain
from engines.events.gpu import FanCurve, GPUInfo, GPUSnapshot, GPUState
from engines.gpu.backend import CLOCK_DOMAINS, GPUBackend, find_info
from engines.gpu.clocks import check_lock
from engines.gpu.fans import FanController, curve_from_mapping, validate_curve
from engines.gpu.fans import fan_ids as check_fans
from engines.gpu.power import check_limit

log = logging.getLogger(__name__)

LAYERS = ("guard", "tune", "lease", "persist")  # highest priority first
"""Power limits: the thermal guard's over the tuner's (a candidate's limit while it is measured,
`traylm tune`) over the user's. The tuner's has a layer of its own so that lifting it gives back
exactly what the user had (lease, persisted limit or the default); like a lease it is dropped
when its client goes away (the daemon crashed mid-tune)."""
OWN_LAYERS = ("guard", "tune")  # sources whose power limit is a layer of that name
RESUME_JUMP_S = 5.0


@dataclass
class _Entry:
    value: Any  # FanCurve for fans, int (mW) for power
    owner: int | None  # connection id for leases, None for persisted


@dataclass
class _Fan:
    layers: dict[str, _Entry] = field(default_factory=dict)
    controller: FanController | None = None
    duty_pct: int | None = None


@dataclass
class _Power:
    layers: dict[str, _Entry] = field(default_factory=dict)
    applied_mw: int | None = None


@dataclass
class _Clock:
    layers: dict[str, _Entry] = field(default_factory=dict)  # value: (min_mhz, max_mhz)
    applied: tuple[int, int] | None = None


def _top(layers: dict[str, _Entry]) -> tuple[str, _Entry] | None:
    for name in LAYERS:
        if name in layers:
            return name, layers[name]
    return None


class HelperCore:
    def __init__(
        self,
        backend: GPUBackend,
        state_dir: Path | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend
        self._clock = clock
        self.state_path = state_dir / "state.json" if state_dir is not None else None
        self._lock = threading.RLock()
        self._infos: tuple[GPUInfo, ...] = ()
        self._fans: dict[tuple[str, int], _Fan] = {}
        self._power: dict[str, _Power] = {}
        self._clocks: dict[tuple[str, str], _Clock] = {}
        """(uuid, domain) → the clock lock layers of that GPU's SM or memory clock."""
        self._latest: dict[str, GPUSnapshot] = {}
        self._lost: set[str] = set()
        self._clock_gap_s: float | None = None
        self._foreign: list[str] = []
        self.warnings: list[str] = []

    # ----------------------------------------------------------------- start

    def start(self) -> list[str]:
        """Open the backend and re-apply the persisted settings (a reboot forgets them).
        Returns one line per setting that could not be re-applied."""
        with self._lock:
            self._infos = self.backend.open()
            problems: list[str] = []
            for item in self._load_state():
                try:
                    if item["kind"] == "fan":
                        curve = curve_from_mapping(item["curve"])
                        self.apply_curve(item["gpu"], curve, (item["fan"],), persist=True)
                    elif item["kind"] == "clock":
                        low, high = (int(v) for v in item["mhz"])
                        self.apply_clocks(item["gpu"], item["domain"], low, high, persist=True)
                    else:
                        self.apply_power(item["gpu"], int(item["limit_mw"]), persist=True)
                except (GPUError, KeyError, TypeError, ValueError) as exc:
                    problems.append(f"saved setting {item} not re-applied: {exc}")
            for line in problems:
                log.warning("%s", line)
            return problems

    # ----------------------------------------------------------------- requests

    def apply_curve(
        self,
        gpu: str,
        curve: FanCurve,
        fans: tuple[int, ...] | None,
        *,
        persist: bool,
        owner: int | None = None,
    ) -> dict[str, Any]:
        with self._lock:
            info = self._info(gpu)
            fan_ids = check_fans(list(fans) if fans is not None else None, info, GPUError)
            warnings = list(
                validate_curve(curve, min_pct=info.fan_min_pct, max_pct=info.fan_max_pct)
            )
            latest = self._latest.get(info.uuid)
            for fan in fan_ids:
                state = self._fans.setdefault((info.uuid, fan), _Fan())
                if not state.layers and latest is not None and _manual(latest, fan):
                    warnings.append(
                        f"fan {fan} of GPU {info.index} was held in manual mode by another "
                        "program; traylm-gpud has taken it over (stop the other fan tool)"
                    )
                layer = "persist" if persist else "lease"
                state.layers[layer] = _Entry(curve, None if persist else owner)
                if persist:
                    state.layers.pop("lease", None)
                self._refresh_fan(info, fan, state)
            try:
                self._step_fans(info.uuid, strict=True)
            except GPUError:
                for fan in fan_ids:
                    self._fans.pop((info.uuid, fan), None)
                    self._auto(info.uuid, fan)
                raise
            self._save_state()
            return {"gpu": info.uuid, "fans": list(fan_ids), "warnings": warnings}

    def restore_fans(self, gpu: str) -> list[str]:
        """Hand fans back to the firmware and forget their curves; returns the GPUs touched."""
        with self._lock:
            uuids = [i.uuid for i in self._infos] if gpu == "all" else [self._info(gpu).uuid]
            for key in [k for k in self._fans if k[0] in uuids]:
                self._fans[key].layers.clear()
                self._auto(*key)
                del self._fans[key]
            self._save_state()
            self._resample()
            return uuids

    def apply_power(
        self,
        gpu: str,
        limit_mw: int,
        *,
        persist: bool,
        source: str = "user",
        owner: int | None = None,
    ) -> dict[str, Any]:
        with self._lock:
            info = self._info(gpu)
            check_limit(info, limit_mw)
            state = self._power.setdefault(info.uuid, _Power())
            before = dict(state.layers)
            layer = source if source in OWN_LAYERS else ("persist" if persist else "lease")
            state.layers[layer] = _Entry(limit_mw, None if layer == "persist" else owner)
            if layer == "persist":
                state.layers.pop("lease", None)
            try:
                self._apply_power_layers(info, state)
            except GPUError:
                state.layers = before
                if not before:
                    self._power.pop(info.uuid, None)
                raise
            self._save_state()
            return {"gpu": info.uuid, "limit_mw": state.applied_mw, "layer": layer}

    def restore_power(self, gpu: str, source: str = "user") -> list[str]:
        """``source="guard"`` (``"tune"``) lifts only the guard's (the tuner's) limit; ``"user"``
        drops the user's."""
        with self._lock:
            uuids = [i.uuid for i in self._infos] if gpu == "all" else [self._info(gpu).uuid]
            for uuid in uuids:
                state = self._power.get(uuid)
                if state is None:
                    continue
                for layer in (source,) if source in OWN_LAYERS else ("lease", "persist"):
                    state.layers.pop(layer, None)
                self._apply_power_layers(self._info(uuid), state)
            self._save_state()
            return uuids

    def apply_clocks(
        self,
        gpu: str,
        domain: str,
        min_mhz: int,
        max_mhz: int,
        *,
        persist: bool,
        owner: int | None = None,
    ) -> dict[str, Any]:
        """Lock one clock of one GPU (a lease, or persisted). Checked against the card's
        supported range first; a refusal by the driver leaves the previous lock in force."""
        with self._lock:
            info = self._info(gpu)
            check_lock(info, domain, min_mhz, max_mhz)
            key = (info.uuid, domain)
            state = self._clocks.setdefault(key, _Clock())
            before = dict(state.layers)
            layer = "persist" if persist else "lease"
            state.layers[layer] = _Entry((min_mhz, max_mhz), None if persist else owner)
            if persist:
                state.layers.pop("lease", None)
            try:
                self._apply_clock_layers(key, state)
            except GPUError:
                state.layers = before
                if not before:
                    self._clocks.pop(key, None)
                raise
            self._save_state()
            mhz = list(state.applied or ())
            return {"gpu": info.uuid, "domain": domain, "mhz": mhz, "layer": layer}

    def restore_clocks(self, gpu: str, domain: str = "all") -> list[str]:
        """Drop the user's clock locks (``domain`` "sm", "memory" or "all"): the driver's again."""
        with self._lock:
            uuids = [i.uuid for i in self._infos] if gpu == "all" else [self._info(gpu).uuid]
            domains = CLOCK_DOMAINS if domain == "all" else (domain,)
            for key in [(u, d) for u in uuids for d in domains]:
                state = self._clocks.get(key)
                if state is None:
                    continue
                state.layers.clear()
                self._apply_clock_layers(key, state)
            self._save_state()
            return uuids

    def release(self, owner: int) -> int:
        """A client went away: drop its leases (back to the persisted setting or the default).
        Returns how many settings were released."""
        released = 0
        with self._lock:
            for (uuid, fan), state in list(self._fans.items()):
                for name, entry in list(state.layers.items()):
                    if entry.owner == owner:
                        del state.layers[name]
                        released += 1
                        info = self._info_or_none(uuid)
                        if info is not None:
                            self._refresh_fan(info, fan, state)
                if not state.layers:
                    del self._fans[(uuid, fan)]
            for uuid, pstate in list(self._power.items()):
                names = [n for n, e in pstate.layers.items() if e.owner == owner]
                for name in names:
                    del pstate.layers[name]
                    released += 1
                info = self._info_or_none(uuid)
                if names and info is not None:
                    self._apply_power_layers(info, pstate)
            for key, cstate in list(self._clocks.items()):
                names = [n for n, e in cstate.layers.items() if e.owner == owner]
                for name in names:
                    del cstate.layers[name]
                    released += 1
                if names and key[0] not in self._lost:
                    try:
                        self._apply_clock_layers(key, cstate)
                    except GPUError as exc:
                        self._warn(
                            f"GPU {key[0]}: could not release the {key[1]} clock lock: "
                            f"{exc.message}"
                        )
            if released:
                self._resample()
        if released:
            log.info("client %d went away: released %d setting(s)", owner, released)
        return released

    # ----------------------------------------------------------------- the control loop

    def tick(self, clock_gap_s: float | None = None) -> None:
        """One pass of the fan loop. ``clock_gap_s`` (CLOCK_BOOTTIME - CLOCK_MONOTONIC) grows
        across a suspend: then the settings are re-applied."""
        with self._lock:
            now_s = self._clock()
            if clock_gap_s is not None:
                if (
                    self._clock_gap_s is not None
                    and clock_gap_s - self._clock_gap_s > RESUME_JUMP_S
                ):
                    self.resumed()
                self._clock_gap_s = clock_gap_s
            snaps = self.backend.sample()
            self._latest = {s.uuid: s for s in snaps}
            self._note_foreign(snaps)
            for snap in snaps:
                if snap.state == GPUState.LOST:
                    self._drop_lost(snap.uuid)
                    continue
                keys = [k for k in self._fans if k[0] == snap.uuid]
                if not keys:
                    continue
                if snap.temperature_c is None:
                    self._read_failed(snap.uuid, keys)
                    continue
                for key in keys:
                    self._command(key, snap.temperature_c, now_s)

    def resumed(self) -> None:
        """After a suspend the driver forgot manual fan speeds and power limits: re-apply."""
        with self._lock:
            log.info("resume from suspend detected: re-applying fan curves and power limits")
            for state in self._fans.values():
                if state.controller is not None:
                    state.controller.reset()
                state.duty_pct = None
            for uuid, pstate in list(self._power.items()):
                pstate.applied_mw = None
                info = self._info_or_none(uuid)
                if info is not None:
                    self._apply_power_layers(info, pstate)
            for key, cstate in list(self._clocks.items()):
                cstate.applied = None
                try:
                    self._apply_clock_layers(key, cstate)
                except GPUError as exc:
                    self._warn(f"GPU {key[0]}: {key[1]} clock lock not re-applied: {exc.message}")

    def restore_all(self, *, everything: bool = False) -> list[str]:
        """Fans back to the firmware, power limits back to the default. ``everything``: every
        fan and GPU, not only those this helper touched (the systemd stop hook). Returns the
        failures (empty when all went back)."""
        failures: list[str] = []
        with self._lock:
            try:
                infos = self._infos or self.backend.open()
            except GPUError as exc:
                return [exc.message]
            for info in infos:
                if info.uuid in self._lost:
                    continue
                fans = (
                    range(info.fan_count)
                    if everything
                    else [f for (u, f) in self._fans if u == info.uuid]
                )
                for fan in fans:
                    try:
                        self.backend.set_fan_auto(info.uuid, fan)
                    except GPUError as exc:
                        failures.append(f"GPU {info.index} fan {fan}: {exc.message}")
                touched = info.uuid in self._power and self._power[info.uuid].applied_mw is not None
                if (everything or touched) and info.power_default_mw is not None:
                    try:
                        self.backend.set_power_limit(info.uuid, info.power_default_mw)
                    except GPUError as exc:
                        failures.append(f"GPU {info.index} power limit: {exc.message}")
                failures += self._reset_clocks(info, everything=everything)
            self._fans.clear()
            self._power.clear()
            self._clocks.clear()
        for line in failures:
            log.error("restore: %s", line)
        return failures

    # ----------------------------------------------------------------- status

    def status(self) -> dict[str, Any]:
        with self._lock:
            fans = []
            for info in self._infos:
                snap = self._latest.get(info.uuid)
                for fan in range(info.fan_count):
                    state = self._fans.get((info.uuid, fan))
                    top = _top(state.layers) if state else None
                    if top is not None and state is not None:
                        mode, curve, duty = "curve", top[1].value, state.duty_pct
                        persist = top[0] == "persist"
                    else:
                        foreign = snap is not None and _manual(snap, fan)
                        mode, curve, duty, persist = (
                            ("foreign" if foreign else "auto"),
                            None,
                            None,
                            False,
                        )
                    fans.append(
                        {
                            "uuid": info.uuid,
                            "fan": fan,
                            "mode": mode,
                            "curve": to_plain(curve) if curve is not None else None,
                            "duty_pct": duty,
                            "persist": persist,
                        }
                    )
            power = []
            for uuid, pstate in self._power.items():
                top = _top(pstate.layers)
                if top is not None and pstate.applied_mw is not None:
                    power.append(
                        {
                            "uuid": uuid,
                            "limit_mw": pstate.applied_mw,
                            "source": top[0] if top[0] in OWN_LAYERS else "user",
                            "persist": top[0] == "persist",
                        }
                    )
            clocks = [
                {
                    "uuid": uuid,
                    "domain": domain,
                    "mhz": list(cstate.applied),
                    "persist": "persist" in cstate.layers and "lease" not in cstate.layers,
                }
                for (uuid, domain), cstate in self._clocks.items()
                if cstate.applied is not None
            ]
            return {
                "backend": self.backend.name,
                "simulated": self.backend.simulated,
                "fans": fans,
                "power": power,
                "clocks": clocks,
                "warnings": [*self.warnings, *self._foreign],
            }

    # ----------------------------------------------------------------- internals

    def _resample(self) -> None:
        """Read again after handing fans back, so status does not show them as manual."""
        try:
            self._latest = {s.uuid: s for s in self.backend.sample()}
        except GPUError as exc:
            log.debug("resample failed: %s", exc.message)

    def _info(self, gpu: str) -> GPUInfo:
        if not self._infos:
            self._infos = self.backend.open()
        info = find_info(self._infos, gpu)
        if info.uuid in self._lost:
            raise GPUNotFound(f"GPU {info.index} ({info.uuid}) is lost; reboot the machine")
        return info

    def _info_or_none(self, uuid: str) -> GPUInfo | None:
        try:
            return self._info(uuid)
        except GPUError:
            return None

    def _refresh_fan(self, info: GPUInfo, fan: int, state: _Fan) -> None:
        top = _top(state.layers)
        if top is None:
            self._auto(info.uuid, fan)
            state.controller = None
            return
        curve = top[1].value
        if state.controller is None or state.controller.curve != curve:
            state.controller = FanController(
                curve, min_pct=info.fan_min_pct, max_pct=info.fan_max_pct
            )
            if state.duty_pct is not None:  # keep the current duty as the starting point
                state.controller.duty_pct = state.duty_pct

    def _step_fans(self, uuid: str, *, strict: bool = False) -> None:
        """Run the curves of one GPU's fans now (right after a change)."""
        snap = next((s for s in self.backend.sample() if s.uuid == uuid), None)
        if snap is None or snap.state != GPUState.OK:
            return
        self._latest[uuid] = snap
        keys = [k for k in self._fans if k[0] == uuid]
        if snap.temperature_c is None:
            self._read_failed(uuid, keys)
            return
        for key in keys:
            self._command(key, snap.temperature_c, self._clock(), strict=strict)

    def _command(
        self, key: tuple[str, int], temperature_c: int, now_s: float, *, strict: bool = False
    ) -> None:
        state = self._fans[key]
        if state.controller is None:
            return
        cmd = state.controller.update(float(temperature_c), now_s)
        if cmd is None:
            return
        try:
            if cmd.duty_pct is None:
                self.backend.set_fan_auto(*key)
            else:
                self.backend.set_fan_speed(key[0], key[1], cmd.duty_pct)
            state.duty_pct = cmd.duty_pct
        except GPUError as exc:
            if strict:
                state.controller.reset()
                raise
            self._warn(f"GPU {key[0]} fan {key[1]}: {exc.message}; handing it back to the firmware")
            state.controller.reset()
            self._auto(*key)

    def _read_failed(self, uuid: str, keys: list[tuple[str, int]]) -> None:
        if any(self._fans[k].duty_pct is not None for k in keys):
            self._warn(
                f"GPU {uuid}: temperature unreadable; its fans are back under firmware control "
                "until it reads again"
            )
        for key in keys:
            state = self._fans[key]
            if state.controller is not None:
                state.controller.reset()
            if state.duty_pct is not None:
                self._auto(*key)
            state.duty_pct = None

    def _drop_lost(self, uuid: str) -> None:
        if uuid in self._lost:
            return
        self._lost.add(uuid)
        self._warn(f"GPU {uuid} is lost (fell off the bus); no longer controlled. Reboot")
        for key in [k for k in self._fans if k[0] == uuid]:
            del self._fans[key]
        self._power.pop(uuid, None)
        for clock_key in [k for k in self._clocks if k[0] == uuid]:
            del self._clocks[clock_key]

    def _auto(self, uuid: str, fan: int) -> None:
        try:
            self.backend.set_fan_auto(uuid, fan)
        except GPUError as exc:
            self._warn(f"GPU {uuid} fan {fan}: could not hand back to the firmware: {exc.message}")
        state = self._fans.get((uuid, fan))
        if state is not None:
            state.duty_pct = None

    def _apply_power_layers(self, info: GPUInfo, state: _Power) -> None:
        top = _top(state.layers)
        target = top[1].value if top is not None else info.power_default_mw
        if target is None or target == state.applied_mw:
            return
        self.backend.set_power_limit(info.uuid, int(target))
        state.applied_mw = int(target) if top is not None else None
        if top is None:
            self._power.pop(info.uuid, None)

    def _apply_clock_layers(self, key: tuple[str, str], state: _Clock) -> None:
        top = _top(state.layers)
        target: tuple[int, int] | None = top[1].value if top is not None else None
        if target == state.applied:
            if top is None:
                self._clocks.pop(key, None)
            return
        if target is None:
            self.backend.reset_clocks(key[0], key[1])
            self._clocks.pop(key, None)
            state.applied = None
            return
        self.backend.lock_clocks(key[0], key[1], target[0], target[1])
        state.applied = target

    def _reset_clocks(self, info: GPUInfo, *, everything: bool) -> list[str]:
        """Every clock this helper locked on ``info`` (``everything``: every clock) back to
        the driver. A card that cannot lock clocks has nothing to reset: not a failure."""
        failures = []
        for domain in CLOCK_DOMAINS:
            state = self._clocks.get((info.uuid, domain))
            if not everything and (state is None or state.applied is None):
                continue
            try:
                self.backend.reset_clocks(info.uuid, domain)
            except GPUNotSupported:
                if not everything:
                    failures.append(f"GPU {info.index} {domain} clock: reset not supported")
            except GPUError as exc:
                failures.append(f"GPU {info.index} {domain} clock: {exc.message}")
        return failures

    def _note_foreign(self, snaps: tuple[GPUSnapshot, ...]) -> None:
        """Fans in manual mode that this helper did not set: another program drives them."""
        now = []
        for snap in snaps:
            for reading in snap.fans:
                if reading.manual and (snap.uuid, reading.index) not in self._fans:
                    now.append(
                        f"fan {reading.index} of GPU {snap.index} is in manual mode but "
                        "traylm-gpud did not set it: another program controls it"
                    )
        for text in set(now) - set(self._foreign):
            log.warning("%s", text)
        self._foreign = now

    def _warn(self, text: str) -> None:
        if text not in self.warnings:
            log.warning("%s", text)
            self.warnings.append(text)
            del self.warnings[:-20]

    # ----------------------------------------------------------------- state file

    def _load_state(self) -> list[dict[str, Any]]:
        if self.state_path is None or not self.state_path.exists():
            return []
        try:
            data = json.loads(self.state_path.read_text())
            items = data["items"]
            if not isinstance(items, list):
                raise TypeError("items is not a list")
            return [i for i in items if isinstance(i, dict)]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.error("ignoring unreadable state file %s: %s", self.state_path, exc)
            return []

    def _save_state(self) -> None:
        if self.state_path is None:
            return
        items: list[dict[str, Any]] = []
        for (uuid, fan), fstate in self._fans.items():
            entry = fstate.layers.get("persist")
            if entry is not None:
                curve = to_plain(entry.value)
                items.append({"kind": "fan", "gpu": uuid, "fan": fan, "curve": curve})
        for uuid, pstate in self._power.items():
            entry = pstate.layers.get("persist")
            if entry is not None:
                items.append({"kind": "power", "gpu": uuid, "limit_mw": entry.value})
        for (uuid, domain), cstate in self._clocks.items():
            entry = cstate.layers.get("persist")
            if entry is not None:
                item = {"kind": "clock", "gpu": uuid, "domain": domain, "mhz": list(entry.value)}
                items.append(item)
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"version": 1, "items": items}, indent=1))
        tmp.chmod(0o600)
        tmp.replace(self.state_path)


def _manual(snap: GPUSnapshot, fan: int) -> bool:
    return any(r.index == fan and r.manual for r in snap.fans)
