"""Contract tests of NVMLBackend against an autospecced ``pynvml`` module.

``create_autospec`` copies the real binding's signatures, so a call with the wrong arguments fails
here exactly as it would on a machine with a GPU. Each NVML error code is driven through the one
call path and must map to the state the notes prescribe (tests/gpu/check_nvml.py checks the same
reads against nvidia-smi on real hardware).
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from engines.errors import (
    GPUError,
    GPULost,
    GPUNotSupported,
    GPUPermissionDenied,
    GPUUnavailable,
)
from engines.events import GPUState
from engines.gpu.nvml import NVMLBackend
from tests.fakes.fake_pynvml import GIB, HANDLE, UUID, fake_pynvml


def nvml_error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


@pytest.fixture
def lib() -> Any:
    return fake_pynvml()


def test_lazy_init_and_every_field_mapped_with_units(lib: Any) -> None:
    backend = NVMLBackend(lib)
    lib.nvmlInit.assert_not_called()  # constructors do no I/O
    (info,) = backend.open()
    assert (info.uuid, info.index, info.name) == (UUID, 0, "NVIDIA GeForce RTX 4090")
    assert info.pci_bus_id == "00000000:01:00.0" and info.cuda_version == "12.8"
    assert (info.slowdown_temperature_c, info.shutdown_temperature_c) == (90, 92)
    assert (info.power_default_mw, info.power_min_mw, info.power_max_mw) == (
        450_000,
        150_000,
        600_000,
    )
    assert (info.fan_count, info.fan_min_pct, info.fan_max_pct) == (2, 30, 100)
    assert info.memory_total_bytes == 24 * GIB and not info.simulated
    (s,) = backend.sample(slow=True)
    assert s.state == GPUState.OK and not s.simulated
    assert (s.temperature_c, s.temperature_margin_c) == (64, 26)
    assert (s.power_draw_mw, s.power_limit_mw, s.energy_mj) == (312_500, 350_000, 987_654_321)
    assert [(f.speed_pct, f.target_pct, f.manual) for f in s.fans] == [
        (55, 55, False),
        (57, 56, True),
    ]
    assert (s.sm_clock_mhz, s.memory_clock_mhz) == (2520, 10501)
    assert (s.utilization_gpu_pct, s.utilization_memory_pct) == (97, 61)
    assert (s.memory_used_bytes, s.memory_free_bytes) == (3 * GIB, 21 * GIB)
    assert s.clock_event_reasons == ("power cap", "software thermal slowdown")
    assert (s.pcie_generation, s.pcie_width, s.pcie_tx_kbps, s.pcie_rx_kbps) == (4, 8, 1000, 2000)
    assert s.persistence_mode is True
    assert s.processes is not None
    assert [(p.pid, p.used_memory_bytes) for p in s.processes] == [(4242, 20 * GIB), (4243, None)]
    lib.nvmlDeviceGetMemoryInfo.assert_any_call(HANDLE, pynvml.nvmlMemory_v2)


def test_fast_sample_skips_the_slow_reads_and_handles_are_cached(lib: Any) -> None:
    backend = NVMLBackend(lib)
    for _ in range(3):
        (s,) = backend.sample()
        assert s.processes is None and s.pcie_tx_kbps is None
    lib.nvmlDeviceGetComputeRunningProcesses.assert_not_called()
    lib.nvmlDeviceGetPcieThroughput.assert_not_called()
    assert lib.nvmlInit.call_count == 1
    assert lib.nvmlDeviceGetHandleByIndex.call_count == 1  # handles cached by UUID


READS = [
    ("nvmlDeviceGetTemperatureV", "temperature_c"),
    ("nvmlDeviceGetMarginTemperature", "temperature_margin_c"),
    ("nvmlDeviceGetPowerUsage", "power_draw_mw"),
    ("nvmlDeviceGetEnforcedPowerLimit", "power_limit_mw"),
    ("nvmlDeviceGetTotalEnergyConsumption", "energy_mj"),
    ("nvmlDeviceGetClockInfo", "sm_clock_mhz"),
    ("nvmlDeviceGetUtilizationRates", "utilization_gpu_pct"),
    ("nvmlDeviceGetMemoryInfo", "memory_used_bytes"),
    ("nvmlDeviceGetCurrPcieLinkGeneration", "pcie_generation"),
    ("nvmlDeviceGetPersistenceMode", "persistence_mode"),
    ("nvmlDeviceGetComputeRunningProcesses", "processes"),
    ("nvmlDeviceGetPcieThroughput", "pcie_tx_kbps"),
]


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_NO_PERMISSION])
@pytest.mark.parametrize(("fn", "field"), READS)
def test_unsupported_or_forbidden_read_is_none_and_the_rest_stays(
    lib: Any, fn: str, field: str, code: int
) -> None:
    getattr(lib, fn).side_effect = nvml_error(code)
    (s,) = NVMLBackend(lib).sample(slow=True)
    assert getattr(s, field) is None
    assert s.state == GPUState.OK
    if field != "power_draw_mw":
        assert s.power_draw_mw == 312_500
    if field != "temperature_c":
        assert s.temperature_c == 64


def test_fan_reads_not_supported(lib: Any) -> None:
    lib.nvmlDeviceGetNumFans.side_effect = nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    lib.nvmlDeviceGetMinMaxFanSpeed.side_effect = nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    backend = NVMLBackend(lib)
    (info,) = backend.open()
    assert info.fan_count == 0 and info.fan_min_pct is None
    (s,) = backend.sample()
    assert s.fans == ()  # a datacenter card without fans


@pytest.mark.parametrize(
    ("code", "why"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "libnvidia-ml.so"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "driver is not loaded"),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "do not match"),
        (pynvml.NVML_ERROR_UNINITIALIZED, "not initialised"),
    ],
)
def test_missing_driver_is_unavailable_with_the_fix(lib: Any, code: int, why: str) -> None:
    lib.nvmlInit.side_effect = nvml_error(code)
    backend = NVMLBackend(lib)
    with pytest.raises(GPUUnavailable) as err:
        backend.sample()
    assert "no NVIDIA GPU found" in err.value.message and why in err.value.message
    assert "--simulate-gpus" in err.value.message  # says what to do
    lib.nvmlInit.side_effect = None  # the driver is back: the next try works (retry)
    assert backend.sample()[0].temperature_c == 64


def test_driver_vanishing_mid_run_becomes_unavailable_then_recovers(lib: Any) -> None:
    backend = NVMLBackend(lib)
    backend.sample()
    lib.nvmlDeviceGetTemperatureV.side_effect = nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)
    with pytest.raises(GPUUnavailable):
        backend.sample()
    lib.nvmlDeviceGetTemperatureV.side_effect = None
    assert backend.sample()[0].temperature_c == 64
    assert lib.nvmlInit.call_count == 2  # initialised again


def test_no_gpu_at_all(lib: Any) -> None:
    lib.nvmlDeviceGetCount.return_value = 0
    with pytest.raises(GPUUnavailable, match="NVML sees no GPU"):
        NVMLBackend(lib).open()


def test_lost_gpu_becomes_a_placeholder_and_is_left_alone(lib: Any) -> None:
    backend = NVMLBackend(lib)
    backend.sample()
    lib.nvmlDeviceGetPowerUsage.side_effect = nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
    (s,) = backend.sample()
    assert s.state == GPUState.LOST and s.temperature_c is None and s.uuid == UUID
    calls = lib.nvmlDeviceGetTemperatureV.call_count
    (s,) = backend.sample()
    assert s.state == GPUState.LOST
    assert lib.nvmlDeviceGetTemperatureV.call_count == calls  # no longer queried
    with pytest.raises(GPULost, match="reboot"):
        backend.set_fan_auto(UUID, 0)
    lib.nvmlDeviceSetDefaultFanSpeed_v2.assert_not_called()


@pytest.mark.parametrize(
    ("new", "old", "field", "value"),
    [
        ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature", "temperature_c", 61),
        (
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetCurrentClocksThrottleReasons",
            "clock_event_reasons",
            ("hardware thermal slowdown",),
        ),
    ],
)
def test_function_not_found_falls_back_to_the_older_call(
    lib: Any, new: str, old: str, field: str, value: Any
) -> None:
    getattr(lib, new).side_effect = nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    getattr(lib, old).return_value = 61 if field == "temperature_c" else 0x40
    (s,) = NVMLBackend(lib).sample()
    assert getattr(s, field) == value


def test_fan_and_memory_fallbacks(lib: Any) -> None:
    lib.nvmlDeviceGetFanSpeed_v2.side_effect = nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    lib.nvmlDeviceGetFanSpeed.return_value = 44
    versions: list[Any] = []

    def memory(handle: Any, version: Any = None) -> Any:
        versions.append(version)
        if version:
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return SimpleNamespace(total=24 * GIB, used=GIB, free=23 * GIB)

    lib.nvmlDeviceGetMemoryInfo.side_effect = memory
    (s,) = NVMLBackend(lib).sample()
    assert [f.speed_pct for f in s.fans] == [44, None]  # the old call reads fan 0 only
    assert s.memory_used_bytes == GIB and None in versions


def test_writes_map_errors(lib: Any) -> None:
    backend = NVMLBackend(lib)
    backend.set_fan_speed(UUID, 1, 70)
    lib.nvmlDeviceSetFanSpeed_v2.assert_called_once_with(HANDLE, 1, 70)
    backend.set_power_limit(UUID, 300_000)
    lib.nvmlDeviceSetPowerManagementLimit.assert_called_once_with(HANDLE, 300_000)
    backend.set_fan_auto(UUID, 0)
    lib.nvmlDeviceSetDefaultFanSpeed_v2.assert_called_once_with(HANDLE, 0)
    lib.nvmlDeviceSetFanSpeed_v2.side_effect = nvml_error(pynvml.NVML_ERROR_NO_PERMISSION)
    with pytest.raises(GPUPermissionDenied, match="traylm-gpud"):
        backend.set_fan_speed(UUID, 0, 50)
    lib.nvmlDeviceSetPowerManagementLimit.side_effect = nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    with pytest.raises(GPUNotSupported):
        backend.set_power_limit(UUID, 300_000)
    lib.nvmlDeviceSetDefaultFanSpeed_v2.side_effect = nvml_error(
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    )
    with pytest.raises(GPUNotSupported, match="515"):
        backend.set_fan_auto(UUID, 0)
    lib.nvmlDeviceSetFanSpeed_v2.side_effect = nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    with pytest.raises(GPUError, match="Invalid Argument"):
        backend.set_fan_speed(UUID, 0, 5)


ALL_CODES = sorted(
    v for k, v in vars(pynvml).items() if k.startswith("NVML_ERROR_") and isinstance(v, int)
)
EXPECTED_READ = {
    pynvml.NVML_ERROR_GPU_IS_LOST: "lost",
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: "unavailable",
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "unavailable",
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: "unavailable",
    pynvml.NVML_ERROR_UNINITIALIZED: "unavailable",
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: "fallback",
}


@pytest.mark.parametrize("code", ALL_CODES)
def test_every_error_code_on_a_read(lib: Any, code: int) -> None:
    """Every NVML error code has a defined outcome on a read: N/A, fallback, lost or
    unavailable. None escapes as a raw NVMLError."""
    lib.nvmlDeviceGetPowerUsage.side_effect = nvml_error(code)
    backend = NVMLBackend(lib)
    expected = EXPECTED_READ.get(code, "none")
    if expected == "unavailable":
        with pytest.raises(GPUUnavailable):
            backend.sample()
        return
    (s,) = backend.sample()
    if expected == "lost":
        assert s.state == GPUState.LOST
    else:  # no fallback exists for the power reading: both read as N/A
        assert s.state == GPUState.OK and s.power_draw_mw is None


@pytest.mark.parametrize("code", ALL_CODES)
def test_every_error_code_on_a_write(lib: Any, code: int) -> None:
    lib.nvmlDeviceSetPowerManagementLimit.side_effect = nvml_error(code)
    with pytest.raises(GPUError):  # every failure of a write is reported, never swallowed
        NVMLBackend(lib).set_power_limit(UUID, 300_000)


def test_the_real_gpu_scripts_comparison_rules() -> None:
    """tests/gpu/check_nvml.py compares NVML reads with nvidia-smi; its rules are checked here
    so the script works when it finally meets a GPU."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "gpu" / "check_nvml.py"
    spec = importlib.util.spec_from_file_location("check_nvml", path)
    assert spec is not None and spec.loader is not None
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    assert check.compare("temperature.gpu", 64, "65", 2, 0) is None
    assert "tolerance" in check.compare("temperature.gpu", 60, "65", 2, 0)
    assert check.compare("fan.speed", None, "[N/A]", 3, 0) is None
    assert "N/A" in check.compare("fan.speed", 40, "[N/A]", 3, 0)
    assert check.compare("power.draw", 312.5, "330.1", 25, 0.15) is None
    assert check.compare("pci.bus_id", "00000000:01:00.0", "00000000:01:00.0", 0, 0) is None
    assert check.compare("persistence_mode", "Enabled", "Enabled", 0, 0) is None
    backend = NVMLBackend(fake_pynvml())
    (info,) = backend.open()
    (snap,) = backend.sample(slow=True)
    reads = {field: read(info, snap) for field, (read, _, _) in check.FIELDS.items()}
    assert reads["power.draw"] == 312.5 and reads["memory.total"] == 24 * 1024
    assert reads["persistence_mode"] == "Enabled" and reads["fan.speed"] == 55


def as_nvml_12550(lib: Any) -> Any:
    """The fake module with nvidia-ml-py 12.550's signatures for the bindings that changed."""
    from unittest import mock

    from tests.fakes import pynvml_12550

    for name, spec in pynvml_12550.CHANGED.items():
        setattr(lib, name, mock.create_autospec(spec))
    for name in pynvml_12550.ABSENT:
        delattr(lib, name)
    return lib


def test_bindings_of_nvidia_ml_py_12550_do_not_take_nvml_down(lib: Any) -> None:
    backend = NVMLBackend(as_nvml_12550(lib))
    (info,) = backend.open()  # the TypeError of the 3-argument binding is caught
    assert info.name == "NVIDIA GeForce RTX 4090"
    assert info.fan_count == 2 and info.fan_min_pct is None and info.fan_max_pct is None
    (s,) = backend.sample(slow=True)
    assert s.state == GPUState.OK
    assert s.power_draw_mw == 312_500
    assert [f.speed_pct for f in s.fans] == [55, 57]
    assert [f.manual for f in s.fans] == [None, None]  # policy unreadable, not a crash


def test_binding_type_or_attribute_error_on_a_write_is_not_supported(lib: Any) -> None:
    lib.nvmlDeviceSetFanSpeed_v2.side_effect = TypeError("takes 4 positional arguments")
    with pytest.raises(GPUNotSupported, match="nvidia-ml-py"):
        NVMLBackend(lib).call("nvmlDeviceSetFanSpeed_v2", HANDLE, 0, 50, uuid=UUID, write=True)
    lib.nvmlDeviceGetPowerUsage.side_effect = AttributeError("c_nvmlDevice_t has no field")
    assert NVMLBackend(lib).call("nvmlDeviceGetPowerUsage", HANDLE, uuid=UUID) is None


def test_pyproject_requires_a_binding_with_the_defaults() -> None:
    import re
    import tomllib
    from pathlib import Path

    meta = tomllib.loads((Path(__file__).parents[3] / "pyproject.toml").read_text())
    (req,) = [d for d in meta["project"]["dependencies"] if d.startswith("nvidia-ml-py")]
    floor = re.search(r">=\s*(\d+)\.(\d+)", req)
    assert floor is not None and (int(floor[1]), int(floor[2])) >= (12, 570)


def v2_memory(handle: Any, version: Any = None) -> Any:
    """A 4090 driving a desktop, as NVML v2 says it: the driver's reserve outside "used"."""
    mib = 2**20
    if version:
        return SimpleNamespace(
            total=24564 * mib, reserved=358 * mib, used=1102 * mib, free=23104 * mib
        )
    return SimpleNamespace(total=24564 * mib, used=1460 * mib, free=23104 * mib)


def test_v2_memory_gives_the_driver_s_reserve_and_the_desktop_is_listed(lib: Any) -> None:
    lib.nvmlDeviceGetMemoryInfo.side_effect = v2_memory
    lib.nvmlDeviceGetGraphicsRunningProcesses.return_value = [
        SimpleNamespace(pid=2101, usedGpuMemory=612 * 2**20),
        SimpleNamespace(pid=4242, usedGpuMemory=20 * GIB),  # also a compute process
    ]
    (s,) = NVMLBackend(lib).sample(slow=True)
    assert s.memory_reserved_bytes == 358 * 2**20
    assert s.memory_used_bytes == 1102 * 2**20 and s.memory_free_bytes == 23104 * 2**20
    assert [p.pid for p in s.processes or ()] == [4242, 4243, 2101]


def test_a_card_that_refuses_v2_memory_falls_back_to_v1_and_says_so(
    lib: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """NotSupported for v2 is not "no memory reading": v1 still gives the free memory (its
    "used" counts the driver's reserve, which is then unknown)."""

    def refuse_v2(handle: Any, version: Any = None) -> Any:
        if version:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return v2_memory(handle)

    lib.nvmlDeviceGetMemoryInfo.side_effect = refuse_v2
    backend = NVMLBackend(lib)
    with caplog.at_level(logging.INFO, logger="engines.gpu.nvml"):
        (s,) = backend.sample()
        backend.sample()
    assert s.memory_free_bytes == 23104 * 2**20 and s.memory_used_bytes == 1460 * 2**20
    assert s.memory_reserved_bytes is None
    said = [r.getMessage() for r in caplog.records if "v2 memory" in r.getMessage()]
    assert len(said) == 1 and "reading v1" in said[0]


def test_clock_ranges_come_from_the_supported_clocks(lib: Any) -> None:
    (info,) = NVMLBackend(lib).open()
    assert (info.sm_clock_min_mhz, info.sm_clock_max_mhz) == (210, 3105)
    assert (info.memory_clock_min_mhz, info.memory_clock_max_mhz) == (405, 10501)
    lib.nvmlDeviceGetSupportedGraphicsClocks.assert_called_with(HANDLE, 10501)


def test_no_supported_clocks_means_no_range(lib: Any) -> None:
    lib.nvmlDeviceGetSupportedMemoryClocks.side_effect = nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    (info,) = NVMLBackend(lib).open()
    assert info.sm_clock_max_mhz is None and info.memory_clock_max_mhz is None


def test_clock_locks_and_resets_call_the_real_signatures(lib: Any) -> None:
    backend = NVMLBackend(lib)
    backend.lock_clocks(UUID, "sm", 210, 1800)
    lib.nvmlDeviceSetGpuLockedClocks.assert_called_once_with(HANDLE, 210, 1800)
    backend.lock_clocks(UUID, "memory", 405, 5001)
    lib.nvmlDeviceSetMemoryLockedClocks.assert_called_once_with(HANDLE, 405, 5001)
    backend.reset_clocks(UUID, "sm")
    lib.nvmlDeviceResetGpuLockedClocks.assert_called_once_with(HANDLE)
    backend.reset_clocks(UUID, "memory")
    lib.nvmlDeviceResetMemoryLockedClocks.assert_called_once_with(HANDLE)


def test_autospec_refuses_a_lock_with_the_wrong_arguments(lib: Any) -> None:
    with pytest.raises(TypeError):  # the fake really carries pynvml's signature
        lib.nvmlDeviceSetGpuLockedClocks(HANDLE, 1800)


def test_clock_lock_refusals_say_which_and_what_to_do(lib: Any) -> None:
    backend = NVMLBackend(lib)
    lib.nvmlDeviceSetGpuLockedClocks.side_effect = nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    with pytest.raises(GPUNotSupported, match="cannot lock its sm clock.*Volta.*power limit"):
        backend.lock_clocks(UUID, "sm", 210, 1800)
    lib.nvmlDeviceSetMemoryLockedClocks.side_effect = nvml_error(pynvml.NVML_ERROR_NO_PERMISSION)
    with pytest.raises(GPUPermissionDenied, match="memory clock.*needs root.*traylm-gpud"):
        backend.lock_clocks(UUID, "memory", 405, 5001)
    lib.nvmlDeviceResetGpuLockedClocks.side_effect = nvml_error(pynvml.NVML_ERROR_UNKNOWN)
    with pytest.raises(GPUError):  # a failed reset is reported, never swallowed
        backend.reset_clocks(UUID, "sm")
