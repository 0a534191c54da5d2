"""The machine's GPUs, one inventory for the whole daemon.

The GPU feature owns it and builds it on its own backend, so NVML, the simulator
(``--simulate-gpus N``) and a replayed trace all answer the same way. The hub's fit estimate, the
TensorRT-LLM checks and cache key, and (to come) the placement of models on demand read the GPUs
here instead of opening NVML themselves. Each GPU is a ``GPUInfo`` (engines/events/gpu.py); its
compute capability is the string NVIDIA prints ("8.9"), compared through ``capability``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Protocol

from engines.errors import GPUError
from engines.events.gpu import GPUInfo
from engines.gpu.backend import GPUBackend, cuda_order

log = logging.getLogger(__name__)

RTX_4090 = GPUInfo(
    uuid="",
    index=0,
    name="NVIDIA GeForce RTX 4090",
    memory_total_bytes=25_757_220_864,
    compute_capability="8.9",
)
"""The GPU a fit estimate assumes when the machine has none (traylm is built for 2×4090)."""


class Inventory(Protocol):
    """What a part needs to know about the GPUs (tests pass a FAKE one)."""

    async def gpus(self) -> tuple[GPUInfo, ...]: ...


class GPUInventory:
    """The GPUs a backend reports, read once (in a worker thread) and kept."""

    def __init__(self, backend: GPUBackend) -> None:
        self._backend = backend
        self._gpus: tuple[GPUInfo, ...] = ()
        self._lock = asyncio.Lock()

    async def gpus(self) -> tuple[GPUInfo, ...]:
        """Every GPU, NVML index order; () when none answers (asked again next time)."""
        if self._gpus:
            return self._gpus
        async with self._lock:
            if not self._gpus:
                try:
                    self._gpus = await asyncio.to_thread(self._backend.open)
                except GPUError as exc:
                    log.info("no GPUs for the inventory: %s", exc.message)
        return self._gpus


def capability(cc: str) -> tuple[int, int]:
    """ "8.9" → (8, 9), for comparisons; (0, 0) when unknown."""
    major, _, minor = cc.partition(".")
    try:
        return int(major), int(minor or 0)
    except ValueError:
        return 0, 0


def sm_name(cc: str) -> str:
    """ "8.9" → "sm_89" (the name CUDA and TensorRT use)."""
    major, minor = capability(cc)
    return f"sm_{major}{minor}"


def architecture(cc: str) -> str:
    major, minor = capability(cc)
    if major >= 10:
        return "Blackwell"
    if major == 9:
        return "Hopper"
    if (major, minor) == (8, 9):
        return "Ada"
    if major == 8:
        return "Ampere"
    if major == 7 and minor >= 5:
        return "Turing"
    return sm_name(cc)


def major_version(version: str) -> int:
    """ "570.133.07" or "12.8" → the leading number (0 when there is none)."""
    head = version.split(".", 1)[0].strip()
    return int(head) if head.isdigit() else 0


def by_cuda_index(gpus: Sequence[GPUInfo], indices: Sequence[int]) -> list[tuple[int, GPUInfo]]:
    """(CUDA index, GPU) for each of a profile's ``gpus`` the machine has, in the profile's
    order (engines run with CUDA_DEVICE_ORDER=PCI_BUS_ID); missing ones are left out."""
    order = cuda_order(gpus)
    return [(i, order[i]) for i in indices if 0 <= i < len(order)]
