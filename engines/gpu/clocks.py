"""Clock locks: checking a requested lock against the range the card reports.

NVML locks the SM (graphics) clock with ``nvmlDeviceSetGpuLockedClocks`` and the memory clock with
``nvmlDeviceSetMemoryLockedClocks``; both need root, so they go through traylm-gpud, which gives
them back (``reset``) on every exit path like fans and power limits. Decode is bound by memory
bandwidth, so an SM lock below the boost clock saves power there at little cost in tokens/s.
"""

from __future__ import annotations

from engines.errors import ConfigError
from engines.events.gpu import GPUInfo
from engines.gpu.backend import CLOCK_DOMAINS


class ClockLockError(ConfigError):
    """A clock lock outside what the card accepts (or on a card that reports no range)."""

    code = "clock_lock_invalid"


def clock_range(info: GPUInfo, domain: str) -> tuple[int | None, int | None]:
    if domain == "sm":
        return info.sm_clock_min_mhz, info.sm_clock_max_mhz
    return info.memory_clock_min_mhz, info.memory_clock_max_mhz


def check_lock(info: GPUInfo, domain: str, min_mhz: int, max_mhz: int) -> None:
    """Raise ClockLockError unless ``min_mhz``-``max_mhz`` lies in the card's supported range."""
    if domain not in CLOCK_DOMAINS:
        raise ClockLockError(f"clock must be one of {', '.join(CLOCK_DOMAINS)}, not {domain!r}")
    lo, hi = clock_range(info, domain)
    if lo is None or hi is None:
        raise ClockLockError(
            f"GPU {info.index} ({info.name}) does not report its supported {domain} clocks, so "
            "traylm will not lock them; use a power limit instead"
        )
    if min_mhz > max_mhz:
        raise ClockLockError(
            f"the lowest {domain} clock ({min_mhz} MHz) is above the highest ({max_mhz} MHz); "
            "give them as MIN-MAX"
        )
    if not lo <= min_mhz <= max_mhz <= hi:
        raise ClockLockError(
            f"{min_mhz}-{max_mhz} MHz is outside the {domain} clocks GPU {info.index} "
            f"({info.name}) supports: {lo}-{hi} MHz"
        )
