"""The log lines of an engine that dies in CUDA init because the NVIDIA driver is older than the
CUDA its torch (or its own kernels) were built for, and the diagnosis each means. The strings
are torch's (c10/cuda: "The NVIDIA driver on your system is too old (found version 12080)",
also printed as torch.cuda's "CUDA initialization:" warning), the CUDA runtime's error string
for cudaErrorInsufficientDriver, and the loader's for a CUDA 13 library on a machine without
one (vLLM's ``_C`` needs libcudart.so.13)."""

from __future__ import annotations

import re

from engines.core.cuda_drivers import MIN_DRIVER, cuda_from_number
from engines.runtime.adapters.base import LogRule

REINSTALL = (
    "Update the NVIDIA driver ({needed}), or install the engine's build for this driver: "
    "`traylm engines remove ENGINE --version V`, then `traylm engines install ENGINE --version "
    "V` picks the build this driver runs (`--dry-run` shows which), or refuses and names the "
    "driver it needs."
)


def _found(match: re.Match[str]) -> dict[str, str]:
    number = int(match.group("found"))
    return {"found_cuda": cuda_from_number(number)}


def _needed() -> str:
    return ", ".join(f"CUDA {c} builds need {d} or newer" for c, d in MIN_DRIVER.items())


DRIVER_TOO_OLD = LogRule(
    "cuda_driver_too_old",
    re.compile(r"The NVIDIA driver on your system is too old \(found version (?P<found>\d+)\)"),
    "The NVIDIA driver is too old for this engine build: it runs CUDA {found_cuda} at most",
    REINSTALL.replace("{needed}", _needed()),
    suggest=_found,
)
DRIVER_INSUFFICIENT = LogRule(
    "cuda_driver_too_old",
    re.compile(
        r"CUDA driver version is insufficient for CUDA runtime version|"
        r"cudaErrorInsufficientDriver|libcudart\.so\.(?P<major>\d+): cannot open shared object"
    ),
    "The NVIDIA driver is too old for the CUDA this engine build was made for",
    REINSTALL.replace("{needed}", _needed()),
)
RULES = (DRIVER_TOO_OLD, DRIVER_INSUFFICIENT)
