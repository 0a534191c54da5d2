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
import time
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
    memory_reserved_bytes=358 * 1024 * 1024,
    compute_capability="8.9",
)
"""The GPU a fit estimate assumes when the machine has none (traylm is built for 2×4090)."""


RETRY_S = 10.0


def cuda_total_bytes(gpu: GPUInfo) -> int:
    """The memory CUDA (torch, an engine's utilisation share) counts on ``gpu``: NVML's total
    less what the driver reserves (a 4090: 23.99 GiB in NVML, 23.64 GiB in torch)."""
    return max(0, (gpu.memory_total_bytes or 0) - (gpu.memory_reserved_bytes or 0))


class Inventory(Protocol):
    """What a part needs to know about the GPUs (tests pass a FAKE one)."""

    async def gpus(self) -> tuple[GPUInfo, ...]: ...


class GPUInventory:
    """The GPUs a backend reports, read once (in a worker thread) and kept."""

    def __init__(self, backend: GPUBackend) -> None:
        self._backend = backend
        self._gpus: tuple[GPUInfo, ...] = ()
        self._lock = asyncio.Lock()
        self._next_try_s = 0.0
        self._said = ""

    async def gpus(self) -> tuple[GPUInfo, ...]:
        """Every GPU, NVML index order; () when none answers (asked again at most every
        ``RETRY_S``: the servable list asks for every profile that needs a GPU, and a computer
        without one would load NVML again and again). Why there are none is logged once, and
        again only when it changes."""
        if self._gpus or time.monotonic() < self._next_try_s:
            return self._gpus
        async with self._lock:
            if not self._gpus and time.monotonic() >= self._next_try_s:
                try:
                    self._gpus = await asyncio.to_thread(self._backend.open)
                except GPUError as exc:
                    self._next_try_s = time.monotonic() + RETRY_S
                    if exc.message != self._said:
                        self._said = exc.message
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
