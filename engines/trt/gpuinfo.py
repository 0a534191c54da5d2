"""The GPU facts a TensorRT engine depends on: name, compute capability, memory, driver, CUDA.

Read from NVML (one function, errors become "no GPU"), or from the simulated RTX 4090s when
``gpu.simulate_gpus`` is set (the same switch the telemetry simulator uses), so that everything
above this module runs on machines without a GPU.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

RTX_4090_MEMORY_BYTES = 25_757_220_864


@dataclass(frozen=True)
class GPUFacts:
    index: int
    name: str
    compute_capability: tuple[int, int]
    memory_total_bytes: int
    driver_version: str  # "570.133.07"
    cuda_driver_version: str  # highest CUDA the driver supports, "12.8"
    simulated: bool = False

    @property
    def sm(self) -> str:
        major, minor = self.compute_capability
        return f"sm_{major}{minor}"

    @property
    def driver_major(self) -> int:
        return int(self.driver_version.split(".", 1)[0] or 0)

    @property
    def cuda_major(self) -> int:
        return int(self.cuda_driver_version.split(".", 1)[0] or 0)

    @property
    def architecture(self) -> str:
        return architecture_name(self.compute_capability)


def architecture_name(cc: tuple[int, int]) -> str:
    major, minor = cc
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
    return f"sm_{major}{minor}"


def simulated_gpus(count: int) -> list[GPUFacts]:
    return [
        GPUFacts(i, "NVIDIA GeForce RTX 4090", (8, 9), RTX_4090_MEMORY_BYTES, "570.133.07", "12.8")
        for i in range(count)
    ]


def probe_gpus(simulate: int = 0) -> list[GPUFacts]:
    """Every visible GPU (blocking: call from a thread). Empty when NVML is unavailable."""
    if simulate:
        return simulated_gpus(simulate)
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        log.info("NVML unavailable (%s): no NVIDIA GPU facts", exc)
        return []
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda = int(pynvml.nvmlSystemGetCudaDriverVersion_v2())
        cuda_text = f"{cuda // 1000}.{(cuda % 1000) // 10}"
        found = []
        for i in range(int(pynvml.nvmlDeviceGetCount())):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            found.append(
                GPUFacts(
                    i,
                    _text(pynvml.nvmlDeviceGetName(handle)),
                    (int(major), int(minor)),
                    int(memory.total),
                    driver,
                    cuda_text,
                )
            )
        return found
    except pynvml.NVMLError as exc:
        log.warning("NVML query failed: %s", exc)
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def select(gpus: Sequence[GPUFacts], indices: Sequence[int]) -> list[GPUFacts]:
    """The profile's GPUs, in its order; missing indices are left out (the caller says so)."""
    by_index = {g.index: g for g in gpus}
    return [by_index[i] for i in indices if i in by_index]


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
