"""The GPU inventory on a computer without an NVIDIA GPU (this one): the real NVML backend
finds no library; asking again and again (the servable list asks for every profile that needs
a GPU) neither loads NVML each time nor logs the same reason each time."""

from __future__ import annotations

import logging

import pytest

from engines.errors import GPUError
from engines.events.gpu import GPUInfo
from engines.gpu.inventory import GPUInventory
from engines.gpu.nvml import NVMLBackend


class CountingOpens:
    """The real NVML backend, with its opens counted."""

    def __init__(self) -> None:
        self.real = NVMLBackend()
        self.opens = 0

    def open(self) -> tuple[GPUInfo, ...]:
        self.opens += 1
        return self.real.open()


async def test_without_a_gpu_the_inventory_asks_nvml_and_says_why_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = CountingOpens()
    try:
        backend.real.open()
    except GPUError:  # what matters: this computer has no GPU
        pass
    else:
        pytest.skip("this computer has an NVIDIA GPU")
    inventory = GPUInventory(backend)  # type: ignore[arg-type]
    caplog.set_level(logging.INFO, logger="engines.gpu.inventory")
    for _ in range(20):
        assert await inventory.gpus() == ()
    assert backend.opens == 1
    said = [r for r in caplog.records if "no GPUs for the inventory" in r.getMessage()]
    assert len(said) == 1 and "NVIDIA" in said[0].getMessage()
