"""``SimulatedBackend``: N simulated RTX 4090s with a simple thermal model and injectable faults.

Not a test double: it is the backend ``traylm serve --simulate-gpus N`` runs on machines without
an NVIDIA GPU, and every snapshot it makes says ``simulated=True``. The model:

- power follows load: ``idle + load × (450 W - idle)``, capped by the power limit ("power cap"
  in the clock-event reasons when the cap bites), cut by 20 % in thermal slowdown;
- temperature approaches ``ambient + power × R(fan)`` with a first-order time constant, where the
  thermal resistance R falls as the fans speed up;
- fans follow the firmware's curve (0 RPM below 50 °C) unless a program set a speed (manual), and
  spin up or down at a finite rate;
- the energy counter integrates power (mJ), like NVML's.

The card's figures are a stock RTX 4090's: 450 W default limit (150-600 W), 24 GB, slowdown at
90 °C, two fan controllers with a 30 % floor.

Its memory is the card's as NVML v2 and CUDA see it, not a kind one: the driver reserves
``RESERVED_BYTES`` outside "used" (NVML's total is 24564 MiB, CUDA's 23.64 GiB), an idle card
shows ``IDLE_USED_BYTES`` used, and GPU 0 drives the desktop: Xorg and gnome-shell hold
``DESKTOP_BYTES`` (1.07 GiB, within the 0.8-1.5 GiB a desktop takes), listed in its process list
like any other program (``release_memory`` takes them off). ``desktop=False`` and
``reserved_bytes=0`` give the kind card of a headless box with a driver that reserves nothing.

Other programs (``hold_memory``, ``start_program``: a game, Blender) get the memory they ask
for only as far as the card has it free, as cudaMalloc would: one that starts on a full card
holds what is left and takes the rest as the memory frees (an engine asleep or stopped), the
way a program that retries its allocations does. A simulated program's process list entry
shows what it holds, not what it asked for.

Faults (``inject``): unsupported fields, writes refused (NoPermission), a lost GPU, a stuck fan,
a forced temperature reading, a fan held in manual mode by another program, and the whole driver
missing.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engines.errors import (
    GPUError,
    GPULost,
    GPUNotSupported,
    GPUPermissionDenied,
    GPUUnavailable,
)
from engines.events.gpu import FanReading, GPUInfo, GPUProcess, GPUSnapshot, GPUState
from engines.gpu.backend import find_info
from engines.gpu.card_profile import CardProfile
from engines.gpu.sim_driver import DEFAULT_DRIVER, driver_cuda

MIB = 1024 * 1024
NAME = "NVIDIA GeForce RTX 4090 (simulated)"
MEMORY_TOTAL_BYTES = 24564 * MIB
DEFAULT_LIMIT_MW = 450_000
MIN_LIMIT_MW = 150_000
MAX_LIMIT_MW = 600_000
IDLE_W = 22.0
SLOWDOWN_C = 90
SHUTDOWN_C = 92
FAN_MIN_PCT = 30
FAN_MAX_PCT = 100
FAN_SLEW_PCT_PER_S = 25.0
AMBIENT_C = 25.0
RESERVED_BYTES = 358 * MIB
"""NVML v2 "reserved" on an RTX 4090: what CUDA's total leaves out (24564 MiB against the
23.64 GiB torch reports)."""
IDLE_USED_BYTES = 2 * MIB
"""NVML v2 "used" of an idle headless card (nvidia-smi's "1MiB / 24564MiB" on a 4090)."""
DESKTOP = ((4_194_401, "Xorg", 612 * MIB), (4_194_402, "gnome-shell", 488 * MIB))
"""The desktop session on GPU 0: (pid, name, bytes). The pids are above Linux's largest
(2^22), so that no real process on the machine running the simulator has them."""
DESKTOP_BYTES = sum(held for _, _, held in DESKTOP)
TIME_CONSTANT_S = 20.0
SM_CLOCK_MIN_MHZ = 210
SM_CLOCK_MAX_MHZ = 2520
MEMORY_CLOCK_MIN_MHZ = 405
MEMORY_CLOCK_MAX_MHZ = 10501
SM_POWER_SHARE = 0.7
"""Of the load-dependent power, the share that scales with the SM clock (as clock x voltage²,
taken as clock²); the rest follows the memory clock. A made-up but monotone model: a lock
lowers power, and decode (memory-bound) barely notices an SM lock."""
SIM_FIELDS = frozenset(f.name for f in dataclasses.fields(GPUSnapshot)) - {
    "uuid",
    "index",
    "ts_s",
    "state",
    "simulated",
}


class ManualClock:
    """A clock that moves only when told (deterministic closed-loop tests and replays)."""

    def __init__(self, start_s: float = 1_000.0) -> None:
        self.now_s = start_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


@dataclass
class SimFaults:
    not_supported: frozenset[str] = frozenset()
    """Snapshot fields that read as N/A (None), e.g. {"temperature_c", "fans"}."""
    no_permission_writes: bool = False
    lost: bool = False
    stuck_fans: dict[int, int] = field(default_factory=dict)
    """Fan index → the % it is stuck at whatever it is told."""
    force_temperature_c: float | None = None
    foreign_manual: frozenset[int] = frozenset()
    """Fans another program holds in manual mode (they read as manual)."""
    clocks_not_supported: bool = False
    """Clock locks answer NotSupported (a pre-Volta card, or a driver that refuses them)."""


@dataclass
class _Fan:
    manual: bool = False
    commanded_pct: int = 0
    actual_pct: float = 0.0


@dataclass
class _GPU:
    info: GPUInfo
    temperature_c: float = AMBIENT_C + 6
    energy_mj: float = 0.0
    load: float = 0.0
    memory_used_bytes: int = IDLE_USED_BYTES
    power_limit_mw: int = DEFAULT_LIMIT_MW
    power_w: float = IDLE_W
    fans: list[_Fan] = field(default_factory=lambda: [_Fan(), _Fan()])
    faults: SimFaults = field(default_factory=SimFaults)
    processes: tuple[GPUProcess, ...] = ()
    foreign: tuple[GPUProcess, ...] = ()
    """Processes of other programs holding memory (``hold_memory``): listed and counted."""
    wanted: dict[int, int] = field(default_factory=dict)
    """pid → the bytes each other program asked for (it holds them once they are free)."""
    load_set_by_hand: bool = False
    clock_locks: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Clock domain ("sm", "memory") → the locked (min, max) MHz."""


PROGRAM_PID_BASE = 4_194_500
"""The first pid ``start_program`` gives (above Linux's largest, like the desktop's)."""


def sim_uuid(index: int) -> str:
    return f"GPU-00000000-5151-4090-8000-{index:012d}"


class SimulatedBackend:
    name = "simulated"
    simulated = True

    def __init__(
        self,
        count: int = 2,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        time_scale: float = 1.0,
        time_constant_s: float = TIME_CONSTANT_S,
        ambient_c: float = AMBIENT_C,
        state_path: Path | None = None,
        card: CardProfile | None = None,
        desktop: bool = True,
        reserved_bytes: int = RESERVED_BYTES,
        driver: str | None = None,
    ) -> None:
        """``state_path``: write the control state (fan modes, power limits) there after every
        write, so that another process can check what this one left behind. ``card``: a card
        profile (engines.gpu.card_profile) whose name, memory total and driver reserve the
        simulated cards take instead of a stock RTX 4090's. ``desktop``: GPU 0 drives a
        desktop (Xorg and a compositor hold memory there); ``reserved_bytes``: what the driver
        reserves on each card (NVML v2) without a card profile. ``driver``: the NVIDIA driver
        version the GPUs report (it sets their CUDA version); else the card profile's, else a
        current 580-series one."""
        self.reserved_bytes = card.memory_reserved_bytes if card else reserved_bytes
        driver = driver or (card.driver_version if card else "") or DEFAULT_DRIVER
        self._clock = clock
        self._wall = wall
        self.time_scale = time_scale
        self.time_constant_s = time_constant_s
        self.ambient_c = ambient_c
        self.unavailable = False
        self._state_path = state_path
        self._locks_loaded = False
        self._lock = threading.RLock()
        self._last_s = clock()
        self.memory_total_bytes = card.memory_total_bytes if card else MEMORY_TOTAL_BYTES
        self.memory_reserved_bytes = self.reserved_bytes
        infos = (
            dataclasses.replace(
                _sim_info(i, driver, card), memory_reserved_bytes=self.reserved_bytes
            )
            for i in range(count)
        )
        self._gpus = {g.info.uuid: g for g in (_GPU(info) for info in infos)}
        if desktop and count:
            first = self._gpus[sim_uuid(0)]
            first.foreign = tuple(
                GPUProcess(pid=pid, used_memory_bytes=held, name=name)
                for pid, name, held in DESKTOP
            )
            first.wanted = {pid: held for pid, _, held in DESKTOP}
        self._next_pid = PROGRAM_PID_BASE
        self.writes: list[tuple[str, str, int, int | None]] = []
        """Every accepted write: (op, uuid, fan or -1, value): tests read the control history."""

    # ----------------------------------------------------------------- control of the model

    def set_load(
        self,
        gpu: str,
        load: float,
        memory_used_bytes: int | None = None,
        *,
        from_traffic: bool = False,
    ) -> None:
        """Set a GPU's load (0..1). The daemon derives load from engine traffic
        (``from_traffic``); a load set by hand (tests, demos) wins over that from then on."""
        with self._lock:
            self._advance()
            g = self._gpu(gpu)
            if from_traffic and g.load_set_by_hand:
                return
            g.load_set_by_hand = g.load_set_by_hand or not from_traffic
            g.load = min(1.0, max(0.0, load))
            if memory_used_bytes is not None:
                g.memory_used_bytes = memory_used_bytes

    def set_processes(self, gpu: str, processes: Iterable[GPUProcess]) -> None:
        with self._lock:
            self._gpu(gpu).processes = tuple(processes)

    def hold_memory(self, gpu: str, *, pid: int, used_memory_bytes: int, name: str) -> None:
        """Simulate another program (a desktop session, a game, a second inference server)
        asking for memory on a GPU: it shows in the process list and in the memory used, with
        as much of ``used_memory_bytes`` as the card has free (the rest as it frees)."""
        with self._lock:
            g = self._gpu(gpu)
            others = tuple(p for p in g.foreign if p.pid != pid)
            g.foreign = (*others, GPUProcess(pid=pid, used_memory_bytes=0, name=name))
            g.wanted[pid] = used_memory_bytes
            self._settle(g)

    def release_memory(self, gpu: str, pid: int) -> None:
        with self._lock:
            g = self._gpu(gpu)
            g.foreign = tuple(p for p in g.foreign if p.pid != pid)
            g.wanted.pop(pid, None)

    def start_program(self, gpu: str, *, name: str, used_memory_bytes: int) -> GPUProcess:
        """A simulated program appears on ``gpu`` and asks for ``used_memory_bytes``; returns
        its process as listed now (its pid is new)."""
        with self._lock:
            pid = self._next_pid
            self._next_pid += 1
            self.hold_memory(gpu, pid=pid, used_memory_bytes=used_memory_bytes, name=name)
            return next(p for p in self._gpu(gpu).foreign if p.pid == pid)

    def programs(self, gpu: str) -> list[tuple[GPUProcess, int]]:
        """The other programs on ``gpu``: each as listed now, with the bytes it asked for."""
        with self._lock:
            g = self._gpu(gpu)
            self._settle(g)
            return [(p, g.wanted.get(p.pid, p.used_memory_bytes or 0)) for p in g.foreign]

    def inject(self, gpu: str, **faults: Any) -> None:
        """Set fault fields of ``SimFaults`` on one GPU (e.g. ``lost=True``)."""
        with self._lock:
            self._advance()
            g = self._gpu(gpu)
            g.faults = dataclasses.replace(g.faults, **faults)

    def temperature_c(self, gpu: str) -> float:
        with self._lock:
            self._advance()
            return self._gpu(gpu).temperature_c

    # ----------------------------------------------------------------- protocol

    def open(self) -> tuple[GPUInfo, ...]:
        if self.unavailable:
            raise GPUUnavailable(
                "no NVIDIA GPU found: the simulated driver is switched off (fault injection)"
            )
        self._load_clock_locks()
        return tuple(g.info for g in self._gpus.values())

    def _load_clock_locks(self) -> None:
        """Clock locks outlive the process that set them (the driver keeps them until a reset,
        as on a real card): the first open takes those the last writer of ``state_path`` left."""
        if self._state_path is None or self._locks_loaded:
            return
        self._locks_loaded = True
        try:
            state = json.loads(self._state_path.read_text())
        except (OSError, ValueError):
            return
        for uuid, g in self._gpus.items():
            found = state.get(uuid, {}).get("clock_locks", {}) if isinstance(state, dict) else {}
            for domain, mhz in found.items():
                g.clock_locks[domain] = (int(mhz[0]), int(mhz[1]))

    def infos(self) -> tuple[GPUInfo, ...]:
        return self.open()

    def sample(self, *, slow: bool = False) -> tuple[GPUSnapshot, ...]:
        infos = self.open()
        with self._lock:
            self._advance()
            now = self._wall()
            return tuple(self._snapshot(self._gpus[i.uuid], now, slow) for i in infos)

    def set_fan_speed(self, uuid: str, fan: int, speed_pct: int) -> None:
        with self._lock:
            self._advance()
            g = self._writable(uuid)
            f = self._fan(g, fan)
            if not FAN_MIN_PCT <= speed_pct <= FAN_MAX_PCT:
                raise GPUError(
                    f"NVML nvmlDeviceSetFanSpeed_v2 on GPU {uuid} failed: Invalid Argument "
                    f"({speed_pct} % is outside {FAN_MIN_PCT}-{FAN_MAX_PCT} %)"
                )
            f.manual, f.commanded_pct = True, int(speed_pct)
            self._record("fan_speed", uuid, fan, int(speed_pct))

    def set_fan_auto(self, uuid: str, fan: int) -> None:
        with self._lock:
            self._advance()
            g = self._writable(uuid)
            f = self._fan(g, fan)
            f.manual = False
            self._record("fan_auto", uuid, fan, None)

    def set_power_limit(self, uuid: str, limit_mw: int) -> None:
        with self._lock:
            self._advance()
            g = self._writable(uuid)
            if not MIN_LIMIT_MW <= limit_mw <= MAX_LIMIT_MW:
                raise GPUError(
                    f"NVML nvmlDeviceSetPowerManagementLimit on GPU {uuid} failed: Invalid "
                    f"Argument ({limit_mw} mW is outside {MIN_LIMIT_MW}-{MAX_LIMIT_MW} mW)"
                )
            g.power_limit_mw = int(limit_mw)
            self._record("power_limit", uuid, -1, int(limit_mw))

    def lock_clocks(self, uuid: str, domain: str, min_mhz: int, max_mhz: int) -> None:
        with self._lock:
            self._advance()
            g = self._writable(uuid)
            if g.faults.clocks_not_supported:
                raise GPUNotSupported(
                    f"GPU {uuid} cannot lock its {domain} clock (simulated NotSupported); "
                    "use a power limit instead"
                )
            low, high = _clock_range(domain)
            if not low <= min_mhz <= max_mhz <= high:
                raise GPUError(
                    f"NVML lock of the {domain} clock on GPU {uuid} failed: Invalid Argument "
                    f"({min_mhz}-{max_mhz} MHz is outside {low}-{high} MHz)"
                )
            g.clock_locks[domain] = (int(min_mhz), int(max_mhz))
            self._record(f"lock_{domain}", uuid, min_mhz, max_mhz)

    def reset_clocks(self, uuid: str, domain: str) -> None:
        with self._lock:
            self._advance()
            g = self._writable(uuid)
            if g.faults.clocks_not_supported:
                raise GPUNotSupported(f"GPU {uuid} has no clock locks to reset (simulated)")
            g.clock_locks.pop(domain, None)
            self._record(f"reset_{domain}", uuid, -1, None)

    def close(self) -> None:
        pass

    def control_state(self) -> dict[str, Any]:
        """What a driver would report about control: fan modes and power limits, by UUID."""
        with self._lock:
            return {
                uuid: {
                    "fans": [
                        {"manual": f.manual or i in g.faults.foreign_manual, "pct": f.commanded_pct}
                        for i, f in enumerate(g.fans)
                    ],
                    "power_limit_mw": g.power_limit_mw,
                    "clock_locks": {d: list(r) for d, r in g.clock_locks.items()},
                }
                for uuid, g in self._gpus.items()
            }

    # ----------------------------------------------------------------- the model

    def _advance(self) -> None:
        now = self._clock()
        elapsed = max(0.0, now - self._last_s) * self.time_scale
        self._last_s = now
        while elapsed > 1e-9:
            dt = min(elapsed, 0.5)
            elapsed -= dt
            for g in self._gpus.values():
                self._step(g, dt)

    def _step(self, g: _GPU, dt: float) -> None:
        demand_w = _demand_w(g)
        power_w = min(demand_w, g.power_limit_mw / 1000)
        if g.temperature_c >= SLOWDOWN_C:
            power_w *= 0.8
        g.power_w = power_w
        g.energy_mj += power_w * dt * 1000
        for i, f in enumerate(g.fans):
            target = self._fan_target(g, i, f)
            step = FAN_SLEW_PCT_PER_S * dt
            f.actual_pct += max(-step, min(step, target - f.actual_pct))
        duty = sum(f.actual_pct for f in g.fans) / max(1, len(g.fans))
        resistance = 0.19 - 0.085 * duty / 100  # °C per W: 0.19 fans off, 0.105 at 100 %
        steady_c = self.ambient_c + power_w * resistance
        decay = math.exp(-dt / max(0.01, self.time_constant_s))
        g.temperature_c = steady_c + (g.temperature_c - steady_c) * decay

    def _fan_target(self, g: _GPU, index: int, f: _Fan) -> float:
        if index in g.faults.stuck_fans:
            return float(g.faults.stuck_fans[index])
        if f.manual:
            return float(f.commanded_pct)
        t = g.temperature_c
        if t < 50:
            return 0.0  # firmware: 0 RPM at idle
        return float(min(FAN_MAX_PCT, max(FAN_MIN_PCT, 30 + (t - 50) * 1.75)))

    def _snapshot(self, g: _GPU, now: float, slow: bool) -> GPUSnapshot:
        info = g.info
        if g.faults.lost:
            return GPUSnapshot(
                uuid=info.uuid, index=info.index, ts_s=now, state=GPUState.LOST, simulated=True
            )
        temperature = (
            g.faults.force_temperature_c
            if g.faults.force_temperature_c is not None
            else g.temperature_c
        )
        reasons = _reasons(g, temperature)
        fans = tuple(
            FanReading(
                index=i,
                speed_pct=round(f.actual_pct),
                target_pct=round(self._fan_target(g, i, f)),
                manual=f.manual or i in g.faults.foreign_manual,
                min_pct=FAN_MIN_PCT,
                max_pct=FAN_MAX_PCT,
            )
            for i, f in enumerate(g.fans)
        )
        self._settle(g)
        foreign_bytes = sum(p.used_memory_bytes or 0 for p in g.foreign)
        usable = self.memory_total_bytes - self.reserved_bytes
        used = min(usable, g.memory_used_bytes + foreign_bytes)
        sm_clock = min(
            _sm_clock_mhz(g),
            SM_CLOCK_MIN_MHZ
            + round(
                g.load
                * (SM_CLOCK_MAX_MHZ - SM_CLOCK_MIN_MHZ)
                * (0.85 if "software thermal slowdown" in reasons else 1)
            ),
        )
        values: dict[str, Any] = {
            "temperature_c": round(temperature),
            "temperature_margin_c": SLOWDOWN_C - round(temperature),
            "power_draw_mw": round(g.power_w * 1000),
            "power_limit_mw": g.power_limit_mw,
            "energy_mj": round(g.energy_mj),
            "fans": fans,
            "sm_clock_mhz": sm_clock,
            "memory_clock_mhz": _memory_clock_mhz(g) if g.load > 0.02 else MEMORY_CLOCK_MIN_MHZ,
            "utilization_gpu_pct": round(g.load * 100),
            "utilization_memory_pct": round(g.load * 60),
            "memory_used_bytes": used,
            "memory_free_bytes": usable - used,
            "memory_total_bytes": self.memory_total_bytes,
            "memory_reserved_bytes": self.reserved_bytes,
            "clock_event_reasons": reasons,
            "pcie_generation": 4 if g.load > 0.02 else 1,
            "pcie_width": 16,
            "pcie_tx_kbps": round(g.load * 900_000) if slow else None,
            "pcie_rx_kbps": round(g.load * 1_200_000) if slow else None,
            "persistence_mode": True,
            "processes": (*g.processes, *g.foreign) if slow else None,
        }
        for name in g.faults.not_supported & SIM_FIELDS:
            values[name] = () if name in ("fans", "clock_event_reasons") else None
        return GPUSnapshot(
            uuid=info.uuid,
            index=info.index,
            ts_s=now,
            state=GPUState.OK,
            simulated=True,
            **values,
        )

    # ----------------------------------------------------------------- helpers

    def _settle(self, g: _GPU) -> None:
        """Each other program takes what it asked for as far as the card has it free, in the
        order they started; what one holds it keeps (called under the lock)."""
        usable = self.memory_total_bytes - self.reserved_bytes
        free = usable - g.memory_used_bytes - sum(p.used_memory_bytes or 0 for p in g.foreign)
        settled = []
        for p in g.foreign:
            held = p.used_memory_bytes or 0
            more = max(0, min(g.wanted.get(p.pid, held) - held, free))
            free -= more
            settled.append(dataclasses.replace(p, used_memory_bytes=held + more) if more else p)
        g.foreign = tuple(settled)

    def _gpu(self, gpu: str) -> _GPU:
        return self._gpus[find_info([g.info for g in self._gpus.values()], gpu).uuid]

    def _writable(self, uuid: str) -> _GPU:
        if self.unavailable:
            raise GPUUnavailable("no NVIDIA GPU found: the simulated driver is switched off")
        g = self._gpu(uuid)
        if g.faults.lost:
            raise GPULost(f"GPU {uuid} is lost (simulated); traylm no longer controls it. Reboot")
        if g.faults.no_permission_writes:
            raise GPUPermissionDenied(
                f"writes on GPU {uuid} need root (simulated NoPermission): fan and power changes "
                "go through traylm-gpud"
            )
        return g

    @staticmethod
    def _fan(g: _GPU, fan: int) -> _Fan:
        if not 0 <= fan < len(g.fans):
            raise GPUError(f"GPU {g.info.uuid} has fans 0-{len(g.fans) - 1}, not {fan}")
        return g.fans[fan]

    def _record(self, op: str, uuid: str, fan: int, value: int | None) -> None:
        self.writes.append((op, uuid, fan, value))
        if self._state_path is not None:
            tmp = self._state_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.control_state()))
            tmp.replace(self._state_path)


def _reasons(g: _GPU, temperature_c: float) -> tuple[str, ...]:
    """Clock-event reasons the way NVML words them (see backend.CLOCK_EVENT_REASONS)."""
    reasons = []
    demand_w = _demand_w(g)
    if g.load < 0.02:
        reasons.append("idle")
    if demand_w > g.power_limit_mw / 1000:
        reasons.append("power cap")
    if temperature_c >= SLOWDOWN_C:
        reasons.append("software thermal slowdown")
    return tuple(reasons)


def _clock_range(domain: str) -> tuple[int, int]:
    if domain == "sm":
        return SM_CLOCK_MIN_MHZ, SM_CLOCK_MAX_MHZ
    return MEMORY_CLOCK_MIN_MHZ, MEMORY_CLOCK_MAX_MHZ


def _sm_clock_mhz(g: _GPU) -> int:
    """The highest SM clock the card may run at now: the lock's top, else the boost clock."""
    return g.clock_locks.get("sm", (0, SM_CLOCK_MAX_MHZ))[1]


def _memory_clock_mhz(g: _GPU) -> int:
    return g.clock_locks.get("memory", (0, MEMORY_CLOCK_MAX_MHZ))[1]


def _demand_w(g: _GPU) -> float:
    """What the load draws at the clocks allowed (before the power limit)."""
    sm = _sm_clock_mhz(g) / SM_CLOCK_MAX_MHZ
    memory = _memory_clock_mhz(g) / MEMORY_CLOCK_MAX_MHZ
    scale = SM_POWER_SHARE * sm * sm + (1 - SM_POWER_SHARE) * memory
    return IDLE_W + g.load * (DEFAULT_LIMIT_MW / 1000 - IDLE_W) * scale


def throughput_share(g_locks: dict[str, tuple[int, int]], *, phase: str) -> float:
    """The share of full speed a simulated engine gets under ``g_locks``: decode follows the
    memory clock (bandwidth) and barely the SM clock; prefill follows the SM clock."""
    sm = g_locks.get("sm", (0, SM_CLOCK_MAX_MHZ))[1] / SM_CLOCK_MAX_MHZ
    memory = g_locks.get("memory", (0, MEMORY_CLOCK_MAX_MHZ))[1] / MEMORY_CLOCK_MAX_MHZ
    if phase == "prefill":
        return min(1.0, sm) * (0.9 + 0.1 * memory)
    return min(1.0, memory) * (0.95 + 0.05 * min(1.0, sm))


def _sim_info(index: int, driver: str = DEFAULT_DRIVER, card: CardProfile | None = None) -> GPUInfo:
    return GPUInfo(
        uuid=sim_uuid(index),
        index=index,
        name=f"{card.name} (simulated)" if card else NAME,
        simulated=True,
        pci_bus_id=f"00000000:{index + 1:02X}:00.0",
        driver_version=f"{driver} (simulated)",
        cuda_version=driver_cuda(driver),
        memory_total_bytes=card.memory_total_bytes if card else MEMORY_TOTAL_BYTES,
        compute_capability="8.9",
        slowdown_temperature_c=SLOWDOWN_C,
        shutdown_temperature_c=SHUTDOWN_C,
        power_default_mw=DEFAULT_LIMIT_MW,
        power_min_mw=MIN_LIMIT_MW,
        power_max_mw=MAX_LIMIT_MW,
        fan_count=2,
        fan_min_pct=FAN_MIN_PCT,
        fan_max_pct=FAN_MAX_PCT,
        pcie_generation_max=4,
        pcie_width_max=16,
        sm_clock_min_mhz=SM_CLOCK_MIN_MHZ,
        sm_clock_max_mhz=SM_CLOCK_MAX_MHZ,
        memory_clock_min_mhz=MEMORY_CLOCK_MIN_MHZ,
        memory_clock_max_mhz=MEMORY_CLOCK_MAX_MHZ,
    )
