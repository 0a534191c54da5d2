"""GPU snapshots and the telemetry, fan, power and thermal-guard events (engines/gpu/).

Units are in the field names (mW, mJ, °C as _c, %). ``simulated`` is True wherever the numbers
come from the simulator or a replayed trace rather than live hardware: a UI must say so.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import ClassVar

from engines.events.codec import Event


class GPUState(enum.StrEnum):
    """Telemetry state: of the backend as a whole, or of one GPU."""

    OK = "ok"
    UNAVAILABLE = "unavailable"  # no driver / library / NVIDIA GPU: retried with backoff
    LOST = "lost"  # the GPU fell off the bus: needs a reboot; traylm stops controlling it


class GuardLevel(enum.IntEnum):
    """Thermal guard escalation, in the order its actions are taken."""

    NORMAL = 0
    NOTICE = 1
    POWER = 2
    PAUSE = 3
    STOP = 4


@dataclasses.dataclass(frozen=True, kw_only=True)
class FanReading:
    """One fan controller. Speeds are NVML's intended speed in % (may exceed 100)."""

    index: int
    speed_pct: int | None = None
    target_pct: int | None = None
    manual: bool | None = None  # True: a program set a speed; False: firmware (automatic)
    min_pct: int | None = None
    max_pct: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPUProcess:
    pid: int
    used_memory_bytes: int | None = None
    name: str = ""
    engine_id: str | None = None  # set when the pid belongs to a traylm engine


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPUInfo:
    """What does not change while the driver is loaded. ``index`` is NVML's (not CUDA's)."""

    uuid: str
    index: int
    name: str
    simulated: bool = False
    pci_bus_id: str = ""
    driver_version: str = ""
    cuda_version: str = ""
    memory_total_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    """What the driver reserves inside ``memory_total_bytes`` and no program can use (NVML
    v2's reserved); None where only v1 answered."""
    compute_capability: str = ""
    """CUDA compute capability, "8.9" (Ada); "" when the driver did not say."""
    slowdown_temperature_c: int | None = None
    shutdown_temperature_c: int | None = None
    power_default_mw: int | None = None
    power_min_mw: int | None = None
    power_max_mw: int | None = None
    fan_count: int = 0
    fan_min_pct: int | None = None
    fan_max_pct: int | None = None
    pcie_generation_max: int | None = None
    pcie_width_max: int | None = None
    sm_clock_min_mhz: int | None = None
    """Lowest SM (graphics) clock NVML lists as supported; a lock must stay within the range."""
    sm_clock_max_mhz: int | None = None
    memory_clock_min_mhz: int | None = None
    """Lowest and highest memory clock NVML lists as supported (None: not reported)."""
    memory_clock_max_mhz: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPUSnapshot:
    """One reading of one GPU. Each field NVML cannot give on this card is None."""

    uuid: str
    index: int
    ts_s: float
    state: GPUState = GPUState.OK
    simulated: bool = False
    temperature_c: int | None = None
    temperature_margin_c: int | None = None  # degrees left before thermal slowdown
    power_draw_mw: int | None = None
    power_limit_mw: int | None = None  # the enforced limit
    energy_mj: int | None = None  # total since the driver loaded
    fans: tuple[FanReading, ...] = ()
    sm_clock_mhz: int | None = None
    memory_clock_mhz: int | None = None
    utilization_gpu_pct: int | None = None
    utilization_memory_pct: int | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    memory_total_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    """Held by the driver outside ``memory_used_bytes`` (NVML v2's reserved; CUDA's view of
    the total leaves it out); None when the driver does not say (v1 counts it as used)."""
    clock_event_reasons: tuple[str, ...] = ()
    pcie_generation: int | None = None
    pcie_width: int | None = None
    pcie_tx_kbps: int | None = None  # slow path (processes interval)
    pcie_rx_kbps: int | None = None
    persistence_mode: bool | None = None
    processes: tuple[GPUProcess, ...] | None = None  # None: not read yet (slow path)


@dataclasses.dataclass(frozen=True, kw_only=True)
class FanCurve:
    """Temperature (°C) → fan duty (%) points, linear in between. Below the first point the
    fans go back to the firmware; above the last point they stay at its duty."""

    points: tuple[tuple[float, float], ...]
    hysteresis_c: float = 2.0
    min_step_pct: float = 0.0
    spin_down_delay_s: float = 0.0
    name: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class PowerPreset:
    name: str
    description: str = ""
    watts: float | None = None  # None: the card's default (stock) limit


@dataclasses.dataclass(frozen=True, kw_only=True)
class FanControl:
    """What traylm-gpud does with one fan."""

    uuid: str
    fan: int
    mode: str  # "auto" (firmware), "curve" (traylm-gpud), "foreign" (another program's manual)
    curve: FanCurve | None = None
    duty_pct: int | None = None
    persist: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class PowerControl:
    uuid: str
    limit_mw: int
    source: str = "user"  # "user" | "guard" | "tune"
    persist: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClockControl:
    """A clock lock traylm-gpud holds: ``domain`` "sm" or "memory", between the two MHz."""

    uuid: str
    domain: str
    min_mhz: int
    max_mhz: int
    persist: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class HelperStatus:
    """Whether traylm-gpud answers; without it traylm is read-only (and says how to fix it)."""

    available: bool
    socket_path: str = ""
    detail: str = ""
    install_hint: str = ""
    version: str = ""
    backend: str = ""
    simulated: bool = False
    fans: tuple[FanControl, ...] = ()
    power: tuple[PowerControl, ...] = ()
    clocks: tuple[ClockControl, ...] = ()
    warnings: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineEnergy:
    """Energy per generated token of one engine over its last window (≥ 5 s)."""

    engine_id: str
    gpus: tuple[str, ...]  # UUIDs summed
    window_s: float
    energy_j: float
    tokens: int
    power_w: float
    joules_per_token: float | None  # None while no token was generated in the window
    cost_per_mtok: float | None  # at energy.electricity_price_per_kwh
    currency: str = ""
    simulated: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class PSUStatus:
    psu_watts: float
    gpu_power_w: float
    other_watts: float
    load_fraction: float  # (GPU draw + other) / PSU rating
    limits_w: float  # worst case: sum of the enforced GPU power limits
    warning: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPUEntry:
    info: GPUInfo
    snapshot: GPUSnapshot | None = None
    guard_level: GuardLevel = GuardLevel.NORMAL


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPUOverview:
    """GET /api/gpus: everything the dashboard's GPU page shows."""

    backend: str  # "nvml" | "simulated" | "replay"
    simulated: bool
    state: GPUState
    message: str = ""
    gpus: tuple[GPUEntry, ...] = ()
    helper: HelperStatus = dataclasses.field(default_factory=lambda: HelperStatus(available=False))
    energy: tuple[EngineEnergy, ...] = ()
    psu: PSUStatus | None = None
    sample_interval_s: float = 1.0
    paused: str | None = None
    profile: str | None = None
    """The efficiency profile last applied through the daemon (None: none)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPUHistory:
    """Columns of one GPU's telemetry (oldest first), for charts."""

    uuid: str
    index: int
    simulated: bool
    resolution_s: float
    ts_s: tuple[float, ...] = ()
    temperature_c: tuple[float | None, ...] = ()
    power_draw_w: tuple[float | None, ...] = ()
    power_limit_w: tuple[float | None, ...] = ()
    utilization_gpu_pct: tuple[float | None, ...] = ()
    fan_speed_pct: tuple[float | None, ...] = ()
    memory_used_bytes: tuple[float | None, ...] = ()
    sm_clock_mhz: tuple[float | None, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class FanCurveResult:
    """Answer to a fan-curve PUT (also with dry_run: validated, not applied)."""

    uuid: str
    fans: tuple[int, ...]
    curve: FanCurve
    applied: bool
    persist: bool
    preview: tuple[tuple[float, float], ...]  # (°C, % the fans would run at)
    warnings: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPUFanStatus:
    """GET /api/gpus/{gpu}/fans: what each fan reads and who controls it."""

    uuid: str
    index: int
    name: str
    readings: tuple[FanReading, ...]
    controls: tuple[FanControl, ...]  # empty without traylm-gpud
    min_pct: int | None = None
    max_pct: int | None = None
    helper_available: bool = False
    simulated: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPUPresets:
    fans: Mapping[str, FanCurve]
    power: Mapping[str, PowerPreset]


@dataclasses.dataclass(frozen=True, kw_only=True)
class EfficiencyProfileEntry:
    """One efficiency profile a client may apply (engines/gpu/efficiency.py)."""

    name: str
    description: str = ""
    builtin: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class EfficiencyProfiles:
    """GET /api/gpus/profiles: the profiles there are and the one in force on each GPU."""

    profiles: tuple[EfficiencyProfileEntry, ...] = ()
    in_force: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """GPU UUID → the profile in force on it; a GPU absent has none (never set, a step of one
    refused, or one of its controls changed by hand since)."""
    problems: tuple[str, ...] = ()
    """The user's profile files that could not be read, each saying which and why."""
    simulated: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class PowerLimitStatus:
    uuid: str
    index: int
    name: str
    enforced_mw: int | None
    default_mw: int | None
    min_mw: int | None
    max_mw: int | None
    requested_mw: int | None = None
    applied: bool = False
    persist: bool = False
    controlled_by: str = ""  # "" | "user" | "guard" | "tune"
    simulated: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class GuardGPU:
    uuid: str
    index: int
    level: GuardLevel
    temperature_c: int | None
    slowdown_c: int
    since_s: float | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPUGuardAction(Event):
    """The thermal guard acted (or tried to): shown in the dashboard and as a notification."""

    kind: ClassVar[str] = "gpu.guard"
    uuid: str
    gpu_index: int
    level: GuardLevel
    action: str  # "notice" | "lower_power" | "pause" | "stop_engine" | "stand_down" (cooled down)
    detail: str
    temperature_c: int | None = None
    threshold_c: float | None = None
    ok: bool = True
    simulated: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class GuardStatus:
    enabled: bool
    thresholds: Mapping[str, float]  # the gpu.guard_* settings
    gpus: tuple[GuardGPU, ...] = ()
    actions: tuple[GPUGuardAction, ...] = ()  # most recent last
    problem: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPUSampled(Event):
    """One sample of every GPU (one event per sample, all GPUs in it)."""

    kind: ClassVar[str] = "gpu.sample"
    backend: str
    simulated: bool
    gpus: tuple[GPUSnapshot, ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPUStateChanged(Event):
    kind: ClassVar[str] = "gpu.state"
    state: GPUState
    backend: str
    message: str
    uuid: str = ""  # empty: the backend as a whole
    simulated: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPUControlChanged(Event):
    """A fan curve or power limit was applied or handed back."""

    kind: ClassVar[str] = "gpu.control"
    uuid: str
    what: str  # "fan_curve" | "fans_auto" | "power_limit" | "power_reset"
    detail: str
    simulated: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPUHelperChanged(Event):
    kind: ClassVar[str] = "gpu.helper"
    status: HelperStatus


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPUEnergyUpdated(Event):
    kind: ClassVar[str] = "gpu.energy"
    energy: EngineEnergy
    psu: PSUStatus | None = None


@dataclasses.dataclass(frozen=True)
class SimulatedProgram:
    """Another program on a simulated GPU (`traylm gpus program start`): a stand-in for a
    game or Blender that asks for memory and holds what the card has free."""

    gpu_index: int
    uuid: str
    pid: int
    name: str
    wanted_bytes: int
    """What it asked for."""
    held_bytes: int
    """What it holds now (less than ``wanted_bytes`` while the card has no more free)."""
    simulated: bool = True
