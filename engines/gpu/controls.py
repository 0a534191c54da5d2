"""The GPU feature's fan and power writes: each goes through traylm-gpud (which alone may
touch the cards), the helper's status is read again, and each change is published as a
``GPUControlChanged`` event. The /api/gpus routes check the request and call these."""

from __future__ import annotations

from collections.abc import Callable

from engines.events.codec import Event, to_plain
from engines.events.gpu import FanCurve, GPUControlChanged, GPUInfo
from engines.gpu.helper_client import HelperClient


class GPUControls:
    """Fan curves and power limits, set and reset through the root helper."""

    def __init__(
        self,
        *,
        require_helper: Callable[[], HelperClient],
        publish: Callable[[Event], None],
        simulated: bool,
    ) -> None:
        """``require_helper``: the running helper, or HelperUnavailable with its install
        steps."""
        self._require_helper = require_helper
        self._publish = publish
        self._simulated = simulated

    async def apply_curve(
        self, info: GPUInfo, curve: FanCurve, fans: tuple[int, ...], *, persist: bool
    ) -> tuple[str, ...]:
        """Put ``curve`` on the GPU's ``fans``; returns the helper's warnings."""
        helper = self._require_helper()
        answer = await helper.request(
            "apply_curve", gpu=info.uuid, curve=to_plain(curve), fans=list(fans), persist=persist
        )
        await helper.refresh()
        detail = f"{curve.name or 'custom'} curve on fans {', '.join(map(str, fans))}"
        self._publish(
            GPUControlChanged(
                uuid=info.uuid, what="fan_curve", detail=detail, simulated=info.simulated
            )
        )
        return tuple(str(w) for w in answer.get("warnings", []))

    async def restore_fans(self, target: str) -> list[str]:
        """Fans back under firmware control on ``target`` (a UUID or "all"); the GPUs
        touched."""
        gpus = await self._all_or_one("restore_fans", target, {})
        for uuid in gpus:
            self._changed(uuid, "fans_auto", "fans back under firmware control")
        return gpus

    async def set_power(
        self, info: GPUInfo, limit_mw: int, *, default: bool, persist: bool
    ) -> None:
        """Set the power limit; ``default``: the default limit asked for by a preset, which
        hands the limit back instead of holding it."""
        helper = self._require_helper()
        if default:
            await helper.request("restore_power", gpu=info.uuid, source="user")
            detail = f"power limit back to the default {limit_mw / 1000:g} W"
        else:
            await helper.request("apply_power", gpu=info.uuid, limit_mw=limit_mw, persist=persist)
            detail = f"power limit set to {limit_mw / 1000:g} W"
        await helper.refresh()
        self._publish(
            GPUControlChanged(
                uuid=info.uuid, what="power_limit", detail=detail, simulated=info.simulated
            )
        )

    async def reset_power(self, target: str) -> list[str]:
        """The default power limit on ``target`` (a UUID or "all"); the GPUs touched."""
        gpus = await self._all_or_one("restore_power", target, {"source": "user"})
        for uuid in gpus:
            self._changed(uuid, "power_reset", "power limit back to the default")
        return gpus

    async def lock_clocks(
        self, info: GPUInfo, domain: str, min_mhz: int, max_mhz: int, *, persist: bool
    ) -> None:
        """Lock the GPU's ``domain`` ("sm" or "memory") clock between the two MHz."""
        helper = self._require_helper()
        await helper.request(
            "apply_clocks",
            gpu=info.uuid,
            clock=domain,
            min_mhz=min_mhz,
            max_mhz=max_mhz,
            persist=persist,
        )
        await helper.refresh()
        detail = f"{domain} clock locked at {min_mhz}-{max_mhz} MHz"
        self._publish(
            GPUControlChanged(
                uuid=info.uuid, what="clock_lock", detail=detail, simulated=info.simulated
            )
        )

    async def reset_clocks(self, target: str, domain: str = "all") -> list[str]:
        """Clock locks on ``target`` (a UUID or "all") back to the driver; the GPUs touched."""
        gpus = await self._all_or_one("restore_clocks", target, {"clock": domain})
        for uuid in gpus:
            self._changed(uuid, "clock_reset", "clocks back under driver control")
        return gpus

    async def _all_or_one(self, op: str, target: str, fields: dict[str, str]) -> list[str]:
        helper = self._require_helper()
        answer = await helper.request(op, gpu=target, **fields)
        await helper.refresh()
        return list(answer.get("gpus", []))

    def _changed(self, uuid: object, what: str, detail: str) -> None:
        self._publish(
            GPUControlChanged(uuid=str(uuid), what=what, detail=detail, simulated=self._simulated)
        )
