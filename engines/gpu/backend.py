"""The GPU backend protocol and the frozen types it returns.

Three backends implement it: ``NVMLBackend`` (real GPUs through nvidia-ml-py), ``SimulatedBackend``
(two RTX 4090s with a thermal model and injectable faults) and ``ReplayBackend`` (a recorded JSONL
trace). The snapshot types live in engines.events.gpu (they cross to the UI); this module
re-exports them.

Calls are blocking; the daemon makes them from the sampler thread or through
``asyncio.to_thread``. Errors: ``GPUUnavailable`` (no driver or GPU), ``GPULost`` (fell off the
bus), ``GPUPermissionDenied`` (a write needs root: traylm-gpud), ``GPUNotSupported``,
``GPUNotFound`` (no GPU with that UUID).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from engines.errors import GPUNotFound, quoted
from engines.events.gpu import FanReading, GPUInfo, GPUProcess, GPUSnapshot, GPUState

__all__ = [
    "CLOCK_DOMAINS",
    "CLOCK_EVENT_REASONS",
    "FanReading",
    "GPUBackend",
    "GPUInfo",
    "GPUProcess",
    "GPUSnapshot",
    "GPUState",
    "cuda_order",
    "decode_clock_event_reasons",
    "find_info",
]

CLOCK_DOMAINS = ("sm", "memory")
"""Clocks traylm can lock: the SM (graphics) clock and the memory clock."""

CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x1, "idle"),
    (0x2, "applications clocks setting"),
    (0x4, "power cap"),  # expected while a power limit is set: not an alarm
    (0x8, "hardware slowdown"),
    (0x10, "sync boost"),
    (0x20, "software thermal slowdown"),
    (0x40, "hardware thermal slowdown"),
    (0x80, "power brake"),
    (0x100, "display clock setting"),
)
"""NVML clock-event (throttle) reason bits, decoded to words."""

THERMAL_REASONS = frozenset({"software thermal slowdown", "hardware thermal slowdown"})


def decode_clock_event_reasons(mask: int | None) -> tuple[str, ...]:
    if not mask:
        return ()
    return tuple(word for bit, word in CLOCK_EVENT_REASONS if mask & bit)


class GPUBackend(Protocol):
    """A source of GPU snapshots that may also accept fan and power writes."""

    name: str
    """"nvml", "simulated" or "replay"."""
    simulated: bool
    """True when the numbers are not live hardware readings."""

    def open(self) -> tuple[GPUInfo, ...]:
        """Initialise (idempotent) and return the GPUs. Raises GPUUnavailable."""
        ...

    def infos(self) -> tuple[GPUInfo, ...]: ...

    def sample(self, *, slow: bool = False) -> tuple[GPUSnapshot, ...]:
        """Read every GPU. ``slow`` adds the expensive reads (processes, PCIe throughput).
        A lost GPU comes back as a snapshot with state LOST, never as an exception."""
        ...

    def set_fan_speed(self, uuid: str, fan: int, speed_pct: int) -> None: ...

    def set_fan_auto(self, uuid: str, fan: int) -> None:
        """Hand the fan back to the firmware (the restore primitive)."""
        ...

    def set_power_limit(self, uuid: str, limit_mw: int) -> None: ...

    def lock_clocks(self, uuid: str, domain: str, min_mhz: int, max_mhz: int) -> None:
        """Lock the ``domain`` ("sm" or "memory") clock between ``min_mhz`` and ``max_mhz``.
        Raises GPUNotSupported or GPUPermissionDenied with what to do."""
        ...

    def reset_clocks(self, uuid: str, domain: str) -> None:
        """Give the ``domain`` clock back to the driver (the restore primitive)."""
        ...

    def close(self) -> None: ...


def find_info(infos: Sequence[GPUInfo], gpu: str) -> GPUInfo:
    """A GPU by UUID, NVML index ("0") or UUID prefix; GPUNotFound names the valid ones."""
    for info in infos:
        if gpu in (info.uuid, str(info.index)):
            return info
    matches = [i for i in infos if len(gpu) >= 8 and i.uuid.startswith(gpu)]
    if len(matches) == 1:
        return matches[0]
    known = ", ".join(f"{i.index} ({i.uuid})" for i in infos) or "none"
    raise GPUNotFound(f"no GPU {quoted(gpu)}; GPUs: {known}")


def cuda_order(infos: Sequence[GPUInfo]) -> list[GPUInfo]:
    """GPUs in CUDA order. Engines run with CUDA_DEVICE_ORDER=PCI_BUS_ID, so a profile's
    ``gpus = [1]`` is the second GPU by PCI bus id (NVML's index may differ)."""
    return sorted(infos, key=lambda i: (i.pci_bus_id.lower(), i.index))
