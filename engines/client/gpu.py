"""GPUs: telemetry, history, fans, power limits, the thermal guard, the programs of simulated
GPUs (engines/gpu/routes.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from engines.client.base import JSON, ClientBase, api_path
from engines.events.codec import from_plain, to_plain
from engines.events.gpu import (
    EfficiencyProfiles,
    FanCurve,
    FanCurveResult,
    GPUFanStatus,
    GPUHistory,
    GPUOverview,
    GPUPresets,
    GuardStatus,
    PowerLimitStatus,
    SimulatedProgram,
)

if TYPE_CHECKING:
    pass


class GPUCalls(ClientBase):
    async def gpus(self) -> GPUOverview:
        return from_plain(GPUOverview, await self._call("GET", "/api/gpus"))

    async def gpu_history(self, seconds: float = 600, points: int = 600) -> list[GPUHistory]:
        params = {"seconds": str(seconds), "points": str(points)}
        data = await self._call("GET", "/api/gpus/history", params=params)
        return [from_plain(GPUHistory, h) for h in data]

    async def gpu_presets(self) -> GPUPresets:
        return from_plain(GPUPresets, await self._call("GET", "/api/gpus/presets"))

    async def fans(self, gpu: str) -> GPUFanStatus:
        return from_plain(GPUFanStatus, await self._call("GET", api_path("/api/gpus/{}/fans", gpu)))

    async def set_fan_curve(
        self,
        gpu: str,
        *,
        preset: str | None = None,
        curve: FanCurve | JSON | None = None,
        fans: Iterable[int] | None = None,
        persist: bool = True,
        dry_run: bool = False,
    ) -> FanCurveResult:
        """Apply a preset or a curve to a GPU's fans (all of them unless ``fans``).
        ``persist=False`` keeps it only while this daemon runs; ``dry_run`` only validates."""
        body: JSON = {"persist": persist}
        if preset is not None:
            body["preset"] = preset
        if curve is not None:
            body["curve"] = to_plain(curve)
        if fans is not None:
            body["fans"] = list(fans)
        params = {"dry_run": "1"} if dry_run else None
        data = await self._call(
            "PUT", api_path("/api/gpus/{}/fans", gpu), json_body=body, params=params
        )
        return from_plain(FanCurveResult, data)

    async def restore_fans(self, gpu: str = "all") -> list[str]:
        data = await self._call("POST", api_path("/api/gpus/{}/fans/auto", gpu))
        return [str(u) for u in data["gpus"]]

    async def power_limit(self, gpu: str) -> PowerLimitStatus:
        return from_plain(
            PowerLimitStatus, await self._call("GET", api_path("/api/gpus/{}/power", gpu))
        )

    async def set_power_limit(
        self,
        gpu: str,
        *,
        watts: float | None = None,
        preset: str | None = None,
        persist: bool = True,
        dry_run: bool = False,
    ) -> PowerLimitStatus:
        body: JSON = {"persist": persist}
        if watts is not None:
            body["watts"] = watts
        if preset is not None:
            body["preset"] = preset
        params = {"dry_run": "1"} if dry_run else None
        data = await self._call(
            "PUT", api_path("/api/gpus/{}/power", gpu), json_body=body, params=params
        )
        return from_plain(PowerLimitStatus, data)

    async def efficiency_profiles(self) -> EfficiencyProfiles:
        """The efficiency profiles (built-in and the user's), the one in force on each GPU and
        the user's files that could not be read."""
        return from_plain(EfficiencyProfiles, await self._call("GET", "/api/gpus/profiles"))

    async def set_efficiency_profile(self, name: str) -> list[str]:
        """Apply an efficiency profile (quiet, eco, max or the user's) to every GPU."""
        data = await self._call("POST", "/api/gpus/profile", json_body={"name": name})
        return [str(u) for u in data.get("gpus", [])]

    async def reset_power_limit(self, gpu: str = "all") -> list[str]:
        data = await self._call("POST", api_path("/api/gpus/{}/power/reset", gpu))
        return [str(u) for u in data["gpus"]]

    async def guard(self) -> GuardStatus:
        return from_plain(GuardStatus, await self._call("GET", "/api/gpus/guard"))

    async def set_guard(self, changes: JSON, *, dry_run: bool = False) -> GuardStatus:
        """``changes``: guard_enabled and any gpu.guard_* threshold (without the section)."""
        params = {"dry_run": "1"} if dry_run else None
        data = await self._call("PUT", "/api/gpus/guard", json_body=changes, params=params)
        return from_plain(GuardStatus, data)

    async def sim_programs(self, gpu: str) -> list[SimulatedProgram]:
        """The other programs on a simulated GPU (409 ``not_simulated`` on real ones)."""
        data = await self._call("GET", api_path("/api/gpus/{}/programs", gpu))
        return [from_plain(SimulatedProgram, p) for p in data]

    async def start_sim_program(self, gpu: str, name: str, memory_gib: float) -> SimulatedProgram:
        """A simulated program appears on ``gpu`` and asks for ``memory_gib``."""
        body: JSON = {"name": name, "memory_gib": memory_gib}
        data = await self._call("POST", api_path("/api/gpus/{}/programs", gpu), json_body=body)
        return from_plain(SimulatedProgram, data)

    async def stop_sim_program(self, gpu: str, program: str) -> list[int]:
        """The simulated programs with that pid or name on ``gpu`` exit; their pids."""
        data = await self._call("DELETE", api_path("/api/gpus/{}/programs/{}", gpu, program))
        return [int(p) for p in data["stopped"]]
