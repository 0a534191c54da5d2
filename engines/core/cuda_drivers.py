"""Which NVIDIA driver runs which CUDA, from NVIDIA's CUDA toolkit release notes (the minimum
Linux driver of each toolkit, and the CUDA each driver branch shipped with). A driver runs the
CUDA of its branch and every older one; NVML's nvmlSystemGetCudaDriverVersion_v2 and
nvidia-smi's "CUDA Version" say which."""

from __future__ import annotations

MIN_DRIVER = {"13.0": "580.65.06", "12.9": "575.51.03", "12.8": "570.26"}
"""The oldest Linux driver that runs each CUDA."""

BRANCH_CUDA = {
    535: "12.2",
    545: "12.3",
    550: "12.4",
    555: "12.5",
    560: "12.6",
    565: "12.7",
    570: "12.8",
    575: "12.9",
    580: "13.0",
    590: "13.1",
    595: "13.2",
}
"""The CUDA each driver branch runs."""


def cuda_from_number(number: int) -> str:
    """CUDA's integer form (NVML's, torch's "found version 12040") as "12.4"."""
    return f"{number // 1000}.{(number % 1000) // 10}"


def min_driver_text(cuda: str) -> str:
    """ "driver 580.65.06 or newer" for CUDA 13.0 (any driver made for it, for one not listed)."""
    found = MIN_DRIVER.get(cuda)
    return f"driver {found} or newer" if found else f"a driver made for CUDA {cuda} or newer"
