"""FAKE torch: just the ``torch.cuda`` calls tests/gpu/truth.py makes, on GPUs that share their
memory books with a FAKE pynvml (``FakeCards``), so that creating a CUDA context and allocating a
tensor show in NVML's free memory and process list as they would on a real card. No computing:
``matmul`` only counts."""

from __future__ import annotations

import os
import threading
import time
from types import SimpleNamespace
from typing import Any

MIB = 2**20


class FakeCards:
    """The memory books of ``count`` cards: total, the driver's reserve, and what each process
    holds; ``nvml_memory`` and ``nvml_processes`` answer pynvml's calls from them."""

    def __init__(self, count: int, *, total: int, reserved: int, context: int) -> None:
        self.total, self.reserved, self.context = total, reserved, context
        self.held = [dict[int, int]() for _ in range(count)]

    def used(self, card: int) -> int:
        return sum(self.held[card].values())

    def nvml_memory(self, card: int, version: object = None) -> Any:
        used = self.used(card)
        if version:
            free = self.total - self.reserved - used
            return SimpleNamespace(total=self.total, reserved=self.reserved, free=free, used=used)
        return SimpleNamespace(
            total=self.total, free=self.total - self.reserved - used, used=used + self.reserved
        )

    def nvml_processes(self, card: int) -> list[Any]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=b) for pid, b in self.held[card].items()]


def fake_torch(cards: FakeCards, uuids: list[str], order: list[int]) -> Any:
    """A ``torch`` module whose device i is card ``order[i]``, whose UUID is ``uuids[order[i]]``
    (NVML's UUID without its "GPU-" prefix, as torch gives it)."""
    pid = os.getpid()
    lock = threading.Lock()
    counted = {"matmuls": 0}

    def open_context(device: int) -> int:
        card = order[device]
        cards.held[card].setdefault(pid, cards.context)
        return card

    def mem_get_info(device: int) -> tuple[int, int]:
        card = open_context(device)
        return cards.total - cards.reserved - cards.used(card), cards.total - cards.reserved

    reserved = [0] * len(order)

    def allocate(size: int, device: str) -> object:
        index = int(device.split(":")[1])
        card = open_context(index)
        rounded = -(-size // (2 * MIB)) * 2 * MIB
        reserved[index] += rounded
        cards.held[card][pid] += rounded
        return SimpleNamespace(device=index, size=size)

    def matmul(a: object, b: object) -> object:
        with lock:
            counted["matmuls"] += 1
        return a

    cuda = SimpleNamespace(
        is_available=lambda: True,
        device_count=lambda: len(order),
        get_device_properties=lambda i: SimpleNamespace(uuid=uuids[order[i]]),
        init=lambda: None,
        mem_get_info=mem_get_info,
        synchronize=lambda device=None: time.sleep(0.001),  # as if waiting for the GPU
        memory_allocated=lambda device: reserved[device],
        memory_reserved=lambda device: reserved[device],
        empty_cache=lambda: None,
    )
    return SimpleNamespace(
        __version__="2.14.0+fake",
        version=SimpleNamespace(cuda="13.0"),
        cuda=cuda,
        uint8="uint8",
        float16="float16",
        empty=lambda size, dtype, device: allocate(size, device),
        randn=lambda n, m, dtype, device: allocate(n * m * 2, device),
        matmul=matmul,
        matmuls=counted,
    )
