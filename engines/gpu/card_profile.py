"""A card's memory as it measured itself: the JSON profile ``tests/gpu/truth.py`` writes on a
real NVIDIA machine, read back for the simulator (``SimulatedBackend(card=...)``).

Only the figures the simulator uses are read; the profile holds more (the energy counter against
integrated power, clock-event reasons, the cost of each NVML call) for people to read. The
format, in short::

    {"kind": "traylm-card-profile", "version": 1, "measured": true,
     "gpus": [{"name": "...", "driver_version": "...",
               "memory": {"v1": {"total": B, "free": B, "used": B},
                          "v2": {"total": B, "reserved": B, "free": B, "used": B},
                          "torch": {"total": B, "free": B}},
               "cuda_context_bytes": B, ...}, ...]}

``measured`` is false in a profile written by hand (a test fixture); the simulator's cards say
which kind they came from.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from engines.errors import ConfigError

PROFILE_KIND = "traylm-card-profile"
PROFILE_VERSION = 1
_FIX = "write one with `python tests/gpu/truth.py --out DIR` on a machine with an NVIDIA GPU"


@dataclasses.dataclass(frozen=True, kw_only=True)
class CardProfile:
    """One GPU of a card profile: what the simulator takes for its card's memory."""

    name: str
    """The card's NVML name, e.g. "NVIDIA GeForce RTX 4090"."""
    memory_total_bytes: int
    """NVML's total (v2 where the driver has it, else v1): what nvidia-smi shows."""
    memory_reserved_bytes: int
    """The driver's reserve, in NVML v2's total but never free; 0 where only v1 was read."""
    torch_total_bytes: int | None = None
    """The total torch reports (``torch.cuda.mem_get_info``); None without torch."""
    cuda_context_bytes: int | None = None
    """NVML free memory lost when one process created its CUDA context."""
    driver_version: str = ""
    measured: bool
    """True when truth.py measured it; False for a hand-written profile."""
    source: str = ""
    """The file it was read from."""


def load(path: Path, *, gpu: int = 0) -> CardProfile:
    """GPU number ``gpu`` (its position in the profile) of the profile at ``path``.

    Raises ConfigError, naming the file and what is wrong, for a file that cannot be read, is
    not JSON, is another kind or version, or lacks the memory totals."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read card profile {path}: {exc.strerror}; {_FIX}") from None
    except ValueError as exc:
        raise ConfigError(f"card profile {path} is not JSON ({exc}); {_FIX}") from None
    if not isinstance(data, dict) or data.get("kind") != PROFILE_KIND:
        raise ConfigError(f"{path} is not a traylm card profile (no kind {PROFILE_KIND!r}); {_FIX}")
    if data.get("version") != PROFILE_VERSION:
        raise ConfigError(
            f"card profile {path} has version {data.get('version')!r}; this traylm reads "
            f"version {PROFILE_VERSION}: {_FIX}"
        )
    gpus = data.get("gpus")
    if not isinstance(gpus, list) or not 0 <= gpu < len(gpus) or not isinstance(gpus[gpu], dict):
        count = len(gpus) if isinstance(gpus, list) else 0
        raise ConfigError(f"card profile {path} has {count} GPU(s); there is no GPU {gpu}")
    return _card(gpus[gpu], path, measured=data.get("measured") is True)


def _card(entry: dict[str, Any], path: Path, *, measured: bool) -> CardProfile:
    memory = _section(entry, "memory")
    v2, v1, torch = (_section(memory, key) for key in ("v2", "v1", "torch"))
    total = _bytes(v2.get("total")) or _bytes(v1.get("total"))
    if not total:
        raise ConfigError(
            f"card profile {path}: GPU {entry.get('name', '?')!r} has no memory total "
            "(memory.v2.total or memory.v1.total, in bytes)"
        )
    reserved = _bytes(v2.get("reserved")) or 0
    if reserved >= total:
        raise ConfigError(
            f"card profile {path}: memory.v2.reserved ({reserved}) is not below the total ({total})"
        )
    return CardProfile(
        name=str(entry.get("name") or "NVIDIA GPU"),
        memory_total_bytes=total,
        memory_reserved_bytes=reserved,
        torch_total_bytes=_bytes(torch.get("total")),
        cuda_context_bytes=_bytes(entry.get("cuda_context_bytes")),
        driver_version=str(entry.get("driver_version") or ""),
        measured=measured,
        source=str(path),
    )


def _section(parent: dict[str, Any], key: str) -> dict[str, Any]:
    value = parent.get(key)
    return value if isinstance(value, dict) else {}


def _bytes(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value
