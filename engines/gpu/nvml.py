"""``NVMLBackend``: real NVIDIA GPUs through nvidia-ml-py (import name ``pynvml``).

Every NVML call goes through ``NVMLBackend.call``, which turns NVML errors into states:
NotSupported → the field is None; NoPermission → None on reads, ``GPUPermissionDenied`` on writes
(they need traylm-gpud); GpuIsLost → ``GPULost`` and the GPU is no longer queried;
LibraryNotFound / DriverNotLoaded / LibRmVersionMismatch / Uninitialized → ``GPUUnavailable``;
FunctionNotFound → the caller's fallback (an older call); a binding that raises TypeError or
AttributeError (its arguments differ in this nvidia-ml-py) → like NotSupported. NVML is
initialised on first use and device handles are cached by UUID (NVML's index order may change
between boots).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pynvml

from engines.errors import (
    GPUError,
    GPULost,
    GPUNotSupported,
    GPUPermissionDenied,
    GPUUnavailable,
)
from engines.events.gpu import FanReading, GPUInfo, GPUProcess, GPUSnapshot, GPUState
from engines.gpu.backend import decode_clock_event_reasons, find_info

log = logging.getLogger(__name__)

NO_GPU_FIX = (
    "install the NVIDIA driver (`nvidia-smi` must work), or run `traylm serve --simulate-gpus 2` "
    "to try traylm with simulated GPUs; everything else in traylm keeps working"
)
_UNAVAILABLE = {
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: "the NVML library (libnvidia-ml.so) was not found",
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "the NVIDIA driver is not loaded",
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: (
        "the NVIDIA driver and its library do not match (a driver update waits for a reboot)"
    ),
    pynvml.NVML_ERROR_UNINITIALIZED: "NVML is not initialised",
}
_LOCK_CALLS = {
    "sm": ("nvmlDeviceSetGpuLockedClocks", "nvmlDeviceResetGpuLockedClocks"),
    "memory": ("nvmlDeviceSetMemoryLockedClocks", "nvmlDeviceResetMemoryLockedClocks"),
}
"""Clock domain → (lock, reset), as in nvidia-ml-py 13.615.71's pynvml.py: each takes
``(handle, min_mhz, max_mhz)`` / ``(handle)`` and raises NVMLError on a failure. The offset call of
13.x (``nvmlDeviceSetClockOffsets``) ignores the driver's return code, so traylm does not use it
(a refused offset would look applied)."""
_MISSING = object()
"""Returned by ``call`` when the function does not exist in this driver (FunctionNotFound)."""


class NVMLBackend:
    name = "nvml"
    simulated = False

    def __init__(self, lib: Any = None) -> None:
        """``lib``: the pynvml module (tests pass an autospecced one)."""
        self._lib = lib if lib is not None else pynvml
        self._lock = threading.RLock()
        self._initialised = False
        self._handles: dict[str, Any] = {}
        self._infos: tuple[GPUInfo, ...] = ()
        self._lost: set[str] = set()
        self._memory_v1: set[str] = set()
        """GPUs whose driver refused v2 memory (said once in the log)."""

    # ----------------------------------------------------------------- the one call

    def call(self, fn_name: str, *args: Any, uuid: str = "", write: bool = False) -> Any:
        """Call ``pynvml.<fn_name>(*args)`` and map its errors (see the module docstring)."""
        fn: Callable[..., Any] | None = getattr(self._lib, fn_name, None)
        if fn is None:
            return _MISSING
        try:
            return fn(*args)
        except pynvml.NVMLError as exc:
            return self._map_error(exc, fn_name, uuid, write)
        except (TypeError, AttributeError) as exc:
            # A binding whose arguments differ from ours (nvidia-ml-py 12.535-12.560 want the
            # output arguments of some getters) is a call this setup does not support.
            where = f" on GPU {uuid}" if uuid else ""
            if write:
                raise GPUNotSupported(
                    f"{fn_name}{where} cannot be called with this nvidia-ml-py ({exc}); "
                    "upgrade it: pip install -U 'nvidia-ml-py>=12.570'"
                ) from None
            log.debug("NVML binding %s%s is unusable: %s", fn_name, where, exc)
            return None

    def _map_error(self, exc: pynvml.NVMLError, fn_name: str, uuid: str, write: bool) -> Any:
        code = getattr(exc, "value", None)
        where = f" on GPU {uuid}" if uuid else ""
        if code == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
            return _MISSING
        if code == pynvml.NVML_ERROR_NOT_SUPPORTED:
            if write:
                raise GPUNotSupported(f"{fn_name} is not supported{where} by this GPU or driver")
            return None
        if code == pynvml.NVML_ERROR_NO_PERMISSION:
            if write:
                raise GPUPermissionDenied(
                    f"{fn_name}{where} needs root: fan and power changes go through "
                    "traylm-gpud (`traylm doctor` says how to install it)"
                )
            return None
        if code == pynvml.NVML_ERROR_GPU_IS_LOST:
            if uuid:
                self._lost.add(uuid)
            raise GPULost(
                f"GPU {uuid or '?'} is lost (it fell off the bus); traylm stopped controlling "
                "it. Save your work and reboot the machine"
            )
        if code in _UNAVAILABLE:
            self._initialised = False
            raise GPUUnavailable(f"no NVIDIA GPU found: {_UNAVAILABLE[code]}; {NO_GPU_FIX}")
        if write:
            raise GPUError(f"NVML {fn_name}{where} failed: {exc}")
        log.debug("NVML %s%s failed: %s", fn_name, where, exc)
        return None

    def first(self, uuid: str, *calls: tuple[Any, ...]) -> Any:
        """The first of ``(fn_name, *args)`` calls that exists in this driver (fallbacks)."""
        for fn_name, *args in calls:
            value = self.call(fn_name, *args, uuid=uuid)
            if value is not _MISSING:
                return value
        return None

    # ----------------------------------------------------------------- protocol

    def open(self) -> tuple[GPUInfo, ...]:
        with self._lock:
            if self._initialised:
                return self._infos
            if self.call("nvmlInit") is _MISSING:
                raise GPUUnavailable(f"no NVIDIA GPU found: pynvml lacks nvmlInit; {NO_GPU_FIX}")
            self._initialised = True
            count = self.call("nvmlDeviceGetCount") or 0
            if count == 0:
                self._initialised = False
                raise GPUUnavailable(f"no NVIDIA GPU found: NVML sees no GPU; {NO_GPU_FIX}")
            handles: dict[str, Any] = {}
            infos: list[GPUInfo] = []
            driver = _text(self.call("nvmlSystemGetDriverVersion"))
            cuda = _cuda_version(
                self.first(
                    "", ("nvmlSystemGetCudaDriverVersion_v2",), ("nvmlSystemGetCudaDriverVersion",)
                )
            )
            for index in range(int(count)):
                try:
                    handle = self.call("nvmlDeviceGetHandleByIndex", index)
                    uuid = (
                        _text(self.call("nvmlDeviceGetUUID", handle)) if handle is not None else ""
                    )
                    if not uuid:
                        log.warning("GPU %d has no readable UUID; skipping it", index)
                        continue
                    infos.append(self._info(handle, uuid, index, driver, cuda))
                except GPULost as exc:
                    log.error("GPU %d: %s", index, exc.message)
                    continue
                handles[uuid] = handle
            self._handles = handles
            self._infos = tuple(infos)
            self._lost &= set(handles)
            return self._infos

    def infos(self) -> tuple[GPUInfo, ...]:
        return self.open()

    def sample(self, *, slow: bool = False) -> tuple[GPUSnapshot, ...]:
        with self._lock:
            infos = self.open()
            now = time.time()
            out = []
            for info in infos:
                if info.uuid in self._lost:
                    out.append(_lost(info, now))
                    continue
                try:
                    out.append(self._snapshot(info, now, slow))
                except GPULost:
                    log.error("GPU %s (%s) is lost; reboot needed", info.index, info.uuid)
                    out.append(_lost(info, now))
            return tuple(out)

    def set_fan_speed(self, uuid: str, fan: int, speed_pct: int) -> None:
        h = self._writable(uuid)
        self._write("nvmlDeviceSetFanSpeed_v2", h, fan, int(speed_pct), uuid=uuid)

    def set_fan_auto(self, uuid: str, fan: int) -> None:
        h = self._writable(uuid)
        self._write("nvmlDeviceSetDefaultFanSpeed_v2", h, fan, uuid=uuid)

    def set_power_limit(self, uuid: str, limit_mw: int) -> None:
        h = self._writable(uuid)
        self._write("nvmlDeviceSetPowerManagementLimit", h, int(limit_mw), uuid=uuid)

    def lock_clocks(self, uuid: str, domain: str, min_mhz: int, max_mhz: int) -> None:
        fn_name = _LOCK_CALLS[domain][0]
        h = self._writable(uuid)
        try:
            self._write(fn_name, h, int(min_mhz), int(max_mhz), uuid=uuid)
        except GPUNotSupported as exc:
            raise GPUNotSupported(
                f"GPU {uuid} cannot lock its {domain} clock: {exc.message}. Clock locks need a "
                "Volta or newer card and driver 450 or newer (memory clock locks: Ampere or "
                "newer, driver 470 or newer); use a power limit instead"
            ) from None
        except GPUPermissionDenied:
            raise GPUPermissionDenied(
                f"locking the {domain} clock of GPU {uuid} needs root (NVML NoPermission): "
                "clock locks go through traylm-gpud (`traylm doctor` says how to install it)"
            ) from None

    def reset_clocks(self, uuid: str, domain: str) -> None:
        h = self._writable(uuid)
        self._write(_LOCK_CALLS[domain][1], h, uuid=uuid)

    def close(self) -> None:
        with self._lock:
            if self._initialised:
                self._initialised = False
                self._handles = {}
                try:
                    self.call("nvmlShutdown")
                except GPUUnavailable:
                    pass

    # ----------------------------------------------------------------- reads

    def _info(self, h: Any, uuid: str, index: int, driver: str, cuda: str) -> GPUInfo:
        pci = self.first(uuid, ("nvmlDeviceGetPciInfo_v3", h), ("nvmlDeviceGetPciInfo", h))
        memory = self._memory(h, uuid)
        constraints = self.call("nvmlDeviceGetPowerManagementLimitConstraints", h, uuid=uuid)
        fan_range = self.call("nvmlDeviceGetMinMaxFanSpeed", h, uuid=uuid)
        sm_clocks, memory_clocks = self._supported_clocks(h, uuid)
        return GPUInfo(
            uuid=uuid,
            index=index,
            name=_text(self.call("nvmlDeviceGetName", h, uuid=uuid)) or "NVIDIA GPU",
            pci_bus_id=_text(getattr(pci, "busId", "")) if pci is not None else "",
            driver_version=driver,
            cuda_version=cuda,
            memory_total_bytes=_int(getattr(memory, "total", None)),
            memory_reserved_bytes=_int(getattr(memory, "reserved", None)),
            compute_capability=_capability(
                self.call("nvmlDeviceGetCudaComputeCapability", h, uuid=uuid)
            ),
            slowdown_temperature_c=_int(
                self.call(
                    "nvmlDeviceGetTemperatureThreshold",
                    h,
                    pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
                    uuid=uuid,
                )
            ),
            shutdown_temperature_c=_int(
                self.call(
                    "nvmlDeviceGetTemperatureThreshold",
                    h,
                    pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
                    uuid=uuid,
                )
            ),
            power_default_mw=_int(
                self.call("nvmlDeviceGetPowerManagementDefaultLimit", h, uuid=uuid)
            ),
            power_min_mw=_int(_item(constraints, 0)),
            power_max_mw=_int(_item(constraints, 1)),
            fan_count=_int(self.call("nvmlDeviceGetNumFans", h, uuid=uuid)) or 0,
            fan_min_pct=_int(_item(fan_range, 0)),
            fan_max_pct=_int(_item(fan_range, 1)),
            pcie_generation_max=_int(self.call("nvmlDeviceGetMaxPcieLinkGeneration", h, uuid=uuid)),
            pcie_width_max=_int(self.call("nvmlDeviceGetMaxPcieLinkWidth", h, uuid=uuid)),
            sm_clock_min_mhz=min(sm_clocks, default=None),
            sm_clock_max_mhz=max(sm_clocks, default=None),
            memory_clock_min_mhz=min(memory_clocks, default=None),
            memory_clock_max_mhz=max(memory_clocks, default=None),
        )

    def _supported_clocks(self, h: Any, uuid: str) -> tuple[list[int], list[int]]:
        """The supported (SM, memory) clocks; NVML lists the SM ones per memory clock (the
        highest memory clock has the widest SM list). Empty where the card does not say."""
        memory = _ints(self.call("nvmlDeviceGetSupportedMemoryClocks", h, uuid=uuid))
        if not memory:
            return [], []
        sm = _ints(self.call("nvmlDeviceGetSupportedGraphicsClocks", h, max(memory), uuid=uuid))
        return sm, memory

    def _memory(self, h: Any, uuid: str) -> Any:
        """NVML's v2 memory (total = reserved + used + free: ``used`` leaves out what the driver
        reserves), else v1 (``used`` counts it, ``reserved`` unknown) where the driver lacks v2
        or refuses it (NotSupported): the free memory is right either way."""
        found = self.call("nvmlDeviceGetMemoryInfo", h, pynvml.nvmlMemory_v2, uuid=uuid)
        if found is not None and found is not _MISSING:
            return found
        if uuid not in self._memory_v1:
            self._memory_v1.add(uuid)
            log.info(
                "GPU %s does not answer NVML's v2 memory query: reading v1, which counts the "
                "driver's reserved memory as used (free memory is still exact)",
                uuid,
            )
        found = self.call("nvmlDeviceGetMemoryInfo", h, uuid=uuid)
        return None if found is _MISSING else found

    def _snapshot(self, info: GPUInfo, now: float, slow: bool) -> GPUSnapshot:
        h = self._handles[info.uuid]
        u = info.uuid
        sensor = pynvml.NVML_TEMPERATURE_GPU
        temperature = self.first(
            u, ("nvmlDeviceGetTemperatureV", h, sensor), ("nvmlDeviceGetTemperature", h, sensor)
        )
        util = self.call("nvmlDeviceGetUtilizationRates", h, uuid=u)
        memory = self._memory(h, u)
        reasons = self.first(
            u,
            ("nvmlDeviceGetCurrentClocksEventReasons", h),
            ("nvmlDeviceGetCurrentClocksThrottleReasons", h),
        )
        persistence = self.call("nvmlDeviceGetPersistenceMode", h, uuid=u)
        processes: tuple[GPUProcess, ...] | None = None
        tx = rx = None
        if slow:
            processes = self._processes(h, u)
            tx = _int(
                self.call("nvmlDeviceGetPcieThroughput", h, pynvml.NVML_PCIE_UTIL_TX_BYTES, uuid=u)
            )
            rx = _int(
                self.call("nvmlDeviceGetPcieThroughput", h, pynvml.NVML_PCIE_UTIL_RX_BYTES, uuid=u)
            )
        return GPUSnapshot(
            uuid=u,
            index=info.index,
            ts_s=now,
            state=GPUState.OK,
            temperature_c=_int(temperature),
            temperature_margin_c=_int(self.call("nvmlDeviceGetMarginTemperature", h, uuid=u)),
            power_draw_mw=_int(self.call("nvmlDeviceGetPowerUsage", h, uuid=u)),
            power_limit_mw=_int(self.call("nvmlDeviceGetEnforcedPowerLimit", h, uuid=u)),
            energy_mj=_int(self.call("nvmlDeviceGetTotalEnergyConsumption", h, uuid=u)),
            fans=self._fans(h, info),
            sm_clock_mhz=_int(self.call("nvmlDeviceGetClockInfo", h, pynvml.NVML_CLOCK_SM, uuid=u)),
            memory_clock_mhz=_int(
                self.call("nvmlDeviceGetClockInfo", h, pynvml.NVML_CLOCK_MEM, uuid=u)
            ),
            utilization_gpu_pct=_int(getattr(util, "gpu", None)),
            utilization_memory_pct=_int(getattr(util, "memory", None)),
            memory_used_bytes=_int(getattr(memory, "used", None)),
            memory_free_bytes=_int(getattr(memory, "free", None)),
            memory_total_bytes=_int(getattr(memory, "total", None)),
            memory_reserved_bytes=_int(getattr(memory, "reserved", None)),
            clock_event_reasons=decode_clock_event_reasons(_int(reasons)),
            pcie_generation=_int(self.call("nvmlDeviceGetCurrPcieLinkGeneration", h, uuid=u)),
            pcie_width=_int(self.call("nvmlDeviceGetCurrPcieLinkWidth", h, uuid=u)),
            pcie_tx_kbps=tx,
            pcie_rx_kbps=rx,
            persistence_mode=None if persistence is None else persistence == 1,
            processes=processes,
        )

    def _fans(self, h: Any, info: GPUInfo) -> tuple[FanReading, ...]:
        u = info.uuid
        fans = []
        for i in range(info.fan_count):
            calls: list[tuple[Any, ...]] = [("nvmlDeviceGetFanSpeed_v2", h, i)]
            if i == 0:
                calls.append(("nvmlDeviceGetFanSpeed", h))  # old drivers: fan 0 only
            policy = self.call("nvmlDeviceGetFanControlPolicy_v2", h, i, uuid=u)
            fans.append(
                FanReading(
                    index=i,
                    speed_pct=_int(self.first(u, *calls)),
                    target_pct=_int(self.call("nvmlDeviceGetTargetFanSpeed", h, i, uuid=u)),
                    manual=None
                    if policy is None or policy is _MISSING
                    else policy == pynvml.NVML_FAN_POLICY_MANUAL,
                    min_pct=info.fan_min_pct,
                    max_pct=info.fan_max_pct,
                )
            )
        return tuple(fans)

    def _processes(self, h: Any, uuid: str) -> tuple[GPUProcess, ...] | None:
        """Compute processes, then the graphics ones (the desktop: Xorg, the compositor) that
        are not also compute processes."""
        found = self.call("nvmlDeviceGetComputeRunningProcesses", h, uuid=uuid)
        if found is None or found is _MISSING:
            return None
        graphics = self.call("nvmlDeviceGetGraphicsRunningProcesses", h, uuid=uuid)
        listed = list(found)
        if isinstance(graphics, list | tuple):
            pids = {p.pid for p in listed}
            listed += [p for p in graphics if p.pid not in pids]
        return tuple(
            GPUProcess(pid=int(p.pid), used_memory_bytes=_int(getattr(p, "usedGpuMemory", None)))
            for p in listed
        )

    # ----------------------------------------------------------------- writes

    def _writable(self, uuid: str) -> Any:
        self.open()
        info = find_info(self._infos, uuid)
        if info.uuid in self._lost:
            raise GPULost(
                f"GPU {info.uuid} is lost; traylm no longer controls it; reboot the machine"
            )
        return self._handles[info.uuid]

    def _write(self, fn_name: str, *args: Any, uuid: str) -> None:
        with self._lock:
            result = self.call(fn_name, *args, uuid=uuid, write=True)
        if result is _MISSING:
            raise GPUNotSupported(
                f"{fn_name} does not exist in this NVIDIA driver; update the driver (fan control "
                "needs 515 or newer)"
            )


def _lost(info: GPUInfo, now: float) -> GPUSnapshot:
    return GPUSnapshot(uuid=info.uuid, index=info.index, ts_s=now, state=GPUState.LOST)


def _text(value: Any) -> str:
    if value is None or value is _MISSING:
        return ""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def _int(value: Any) -> int | None:
    if value is None or value is _MISSING or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _ints(value: Any) -> list[int]:
    if not isinstance(value, (list, tuple)):
        return []
    return [v for v in (_int(x) for x in value) if v is not None and v > 0]


def _item(value: Any, index: int) -> Any:
    if value is None or value is _MISSING:
        return None
    try:
        return value[index]
    except (TypeError, IndexError, KeyError):
        return None


def _cuda_version(value: Any) -> str:
    number = _int(value)
    if not number:
        return ""
    return f"{number // 1000}.{(number % 1000) // 10}"


def _capability(value: Any) -> str:
    """(major, minor) from NVML as "8.9"; "" when it is not a pair of numbers."""
    try:
        major, minor = (int(x) for x in value)
    except (TypeError, ValueError):
        return ""
    return f"{major}.{minor}"
