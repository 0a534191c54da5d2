"""The NVIDIA driver the simulated GPUs report (``traylm serve --simulate-driver``) and the
CUDA version NVML would report for it (engines/core/cuda_drivers.py)."""

from __future__ import annotations

from engines.core.cuda_drivers import BRANCH_CUDA
from engines.errors import ConfigError

DEFAULT_DRIVER = "580.95.05"
"""A current 580-series (CUDA 13.0) driver."""


def driver_cuda(driver: str) -> str:
    """The CUDA version driver ``driver`` ("550.163.01", or its branch "550") runs; raises
    ConfigError for one this table does not know."""
    head = driver.strip().split(".")[0]
    try:
        branch = int(head)
    except ValueError:
        raise ConfigError(
            f"{driver!r} is not an NVIDIA driver version (e.g. {DEFAULT_DRIVER})"
        ) from None
    older = [b for b in BRANCH_CUDA if b <= branch]
    if not older:
        raise ConfigError(
            f"driver {driver} is older than any the simulator knows (from {min(BRANCH_CUDA)})"
        )
    return BRANCH_CUDA[max(older)]
