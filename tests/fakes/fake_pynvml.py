"""FAKE NVML: an autospecced ``pynvml`` module describing one RTX 4090 with two fans.

``create_autospec`` copies the real binding's signatures, so a call with the wrong arguments
fails as it would on a machine with a GPU. The real NVMLBackend code runs on top of it; the real
hardware path is checked by tests/gpu/check_nvml.py against nvidia-smi.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any
from unittest import mock

import pynvml

UUID = "GPU-11111111-2222-3333-4444-555555555555"
HANDLE = object()
GIB = 2**30


def fake_pynvml(count: int = 1) -> Any:
    """``count`` RTX 4090s (the first has ``UUID`` and ``HANDLE``; all read alike)."""
    m = mock.create_autospec(pynvml, instance=False)
    m.nvmlInit.return_value = None
    m.nvmlDeviceGetCount.return_value = count
    m.nvmlDeviceGetHandleByIndex.return_value = HANDLE
    m.nvmlDeviceGetUUID.return_value = UUID
    if count > 1:
        handles = [HANDLE, *(object() for _ in range(count - 1))]
        m.nvmlDeviceGetHandleByIndex.side_effect = lambda i: handles[i]
        m.nvmlDeviceGetUUID.side_effect = lambda h: UUID[:-2] + f"{handles.index(h):02d}"
    m.nvmlDeviceGetCudaComputeCapability.return_value = (8, 9)
    m.nvmlDeviceGetName.return_value = "NVIDIA GeForce RTX 4090"
    m.nvmlSystemGetDriverVersion.return_value = "570.133.07"
    m.nvmlSystemGetCudaDriverVersion_v2.return_value = 12080
    m.nvmlDeviceGetPciInfo_v3.return_value = SimpleNamespace(busId=b"00000000:01:00.0")
    m.nvmlDeviceGetMemoryInfo.return_value = SimpleNamespace(
        total=24 * GIB, used=3 * GIB, free=21 * GIB
    )
    m.nvmlDeviceGetTemperatureThreshold.side_effect = lambda h, t: {
        pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: 90,
        pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: 92,
    }[t]
    m.nvmlDeviceGetPowerManagementDefaultLimit.return_value = 450_000
    m.nvmlDeviceGetPowerManagementLimitConstraints.return_value = [150_000, 600_000]
    m.nvmlDeviceGetNumFans.return_value = 2
    m.nvmlDeviceGetMinMaxFanSpeed.return_value = [30, 100]
    m.nvmlDeviceGetMaxPcieLinkGeneration.return_value = 4
    m.nvmlDeviceGetMaxPcieLinkWidth.return_value = 16
    m.nvmlDeviceGetTemperatureV.return_value = 64
    m.nvmlDeviceGetMarginTemperature.return_value = 26
    m.nvmlDeviceGetPowerUsage.return_value = 312_500
    m.nvmlDeviceGetEnforcedPowerLimit.return_value = 350_000
    m.nvmlDeviceGetTotalEnergyConsumption.return_value = 987_654_321
    m.nvmlDeviceGetFanSpeed_v2.side_effect = lambda h, i: [55, 57][i]
    m.nvmlDeviceGetTargetFanSpeed.side_effect = lambda h, i: [55, 56][i]
    m.nvmlDeviceGetFanControlPolicy_v2.side_effect = lambda h, i: [
        pynvml.NVML_FAN_POLICY_TEMPERATURE_CONTINOUS_SW,
        pynvml.NVML_FAN_POLICY_MANUAL,
    ][i]
    m.nvmlDeviceGetClockInfo.side_effect = lambda h, kind: {
        pynvml.NVML_CLOCK_SM: 2520,
        pynvml.NVML_CLOCK_MEM: 10501,
    }[kind]
    m.nvmlDeviceGetUtilizationRates.return_value = SimpleNamespace(gpu=97, memory=61)
    m.nvmlDeviceGetCurrentClocksEventReasons.return_value = 0x4 | 0x20
    m.nvmlDeviceGetCurrPcieLinkGeneration.return_value = 4
    m.nvmlDeviceGetCurrPcieLinkWidth.return_value = 8
    m.nvmlDeviceGetPersistenceMode.return_value = pynvml.NVML_FEATURE_ENABLED
    m.nvmlDeviceGetComputeRunningProcesses.return_value = [
        SimpleNamespace(pid=4242, usedGpuMemory=20 * GIB),
        SimpleNamespace(pid=4243, usedGpuMemory=None),
    ]
    m.nvmlDeviceGetGraphicsRunningProcesses.return_value = []
    m.nvmlDeviceGetPcieThroughput.side_effect = lambda h, c: {
        pynvml.NVML_PCIE_UTIL_TX_BYTES: 1000,
        pynvml.NVML_PCIE_UTIL_RX_BYTES: 2000,
    }[c]
    m.nvmlDeviceGetSupportedMemoryClocks.return_value = [10501, 10251, 5001, 810, 405]
    m.nvmlDeviceGetSupportedGraphicsClocks.side_effect = lambda h, mem: (
        list(range(3105, 209, -15)) if mem == 10501 else [405, 210]
    )
    return m
