"""The GPU feature's fan and power writes: each goes through traylm-gpud (which alone may
touch the cards), the helper's status is read again, and each change is published as a
``GPUControlChanged`` event. The /api/gpus routes check the request and call these."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from engines.errors import GPUError, HelperRefused
from engines.events.codec import Event, to_plain
from engines.events.gpu import FanCurve, GPUControlChanged, GPUInfo
from engines.gpu.efficiency import ProfileTarget
from engines.gpu.fans import preset as fan_preset
from engines.gpu.helper_client import HelperClient

log = logging.getLogger(__name__)

PROFILE_WRITE_WAIT_S = 30.0


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
        self._profile_lock = asyncio.Lock()
        self.in_force: dict[str, str] = {}
        """GPU UUID → the efficiency profile in force on it. A GPU leaves it when a step of a
        profile is refused there (it is back at its defaults) or when one of its controls is
        changed by hand (the profile no longer holds as a whole)."""

    def profile(self, uuids: Sequence[str]) -> str | None:
        """The profile in force on every one of ``uuids``; None when none is, or they differ."""
        names = {self.in_force.get(u) for u in uuids}
        return names.pop() if len(names) == 1 else None

    def _by_hand(self, uuids: Sequence[str]) -> None:
        for uuid in uuids:
            self.in_force.pop(uuid, None)

    async def apply_curve(
        self, info: GPUInfo, curve: FanCurve, fans: tuple[int, ...], *, persist: bool
    ) -> tuple[str, ...]:
        """Put ``curve`` on the GPU's ``fans``; returns the helper's warnings."""
        helper = self._require_helper()
        answer = await self._write(
            "apply_curve", gpu=info.uuid, curve=to_plain(curve), fans=list(fans), persist=persist
        )
        self._by_hand([info.uuid])
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
        self._by_hand(gpus)
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
            await self._write("restore_power", gpu=info.uuid, source="user")
            detail = f"power limit back to the default {limit_mw / 1000:g} W"
        else:
            await self._write("apply_power", gpu=info.uuid, limit_mw=limit_mw, persist=persist)
            detail = f"power limit set to {limit_mw / 1000:g} W"
        self._by_hand([info.uuid])
        await helper.refresh()
        self._publish(
            GPUControlChanged(
                uuid=info.uuid, what="power_limit", detail=detail, simulated=info.simulated
            )
        )

    async def reset_power(self, target: str) -> list[str]:
        """The default power limit on ``target`` (a UUID or "all"); the GPUs touched."""
        gpus = await self._all_or_one("restore_power", target, {"source": "user"})
        self._by_hand(gpus)
        for uuid in gpus:
            self._changed(uuid, "power_reset", "power limit back to the default")
        return gpus

    async def lock_clocks(
        self, info: GPUInfo, domain: str, min_mhz: int, max_mhz: int, *, persist: bool
    ) -> None:
        """Lock the GPU's ``domain`` ("sm" or "memory") clock between the two MHz."""
        helper = self._require_helper()
        await self._write(
            "apply_clocks",
            gpu=info.uuid,
            clock=domain,
            min_mhz=min_mhz,
            max_mhz=max_mhz,
            persist=persist,
        )
        self._by_hand([info.uuid])
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
        self._by_hand(gpus)
        for uuid in gpus:
            self._changed(uuid, "clock_reset", "clocks back under driver control")
        return gpus

    async def apply_profile(self, name: str, targets: Sequence[ProfileTarget]) -> None:
        """Put an efficiency profile on its GPUs: power limit, SM clock lock, fans. Profiles
        switched in quick succession run one after another (the last one wins). A step the
        helper refuses hands that GPU back to its defaults (a known state), then re-raises."""
        async with self._profile_lock:
            for target in targets:
                uuid = target.info.uuid
                self.in_force.pop(uuid, None)
                try:
                    await self._apply_target(target)
                except GPUError:
                    await self._defaults(target.info)
                    raise
                self.in_force[uuid] = name
                self._changed(uuid, "profile", f"efficiency profile {name}")

    async def _apply_target(self, t: ProfileTarget) -> None:
        uuid = t.info.uuid
        if t.limit_mw is None:
            await self._write("restore_power", gpu=uuid, source="user")
        else:
            await self._write("apply_power", gpu=uuid, limit_mw=t.limit_mw, persist=False)
        if t.sm_lock_mhz is None:
            await self._write("restore_clocks", gpu=uuid, clock="sm")
        else:
            low, high = t.sm_lock_mhz
            fields = {"clock": "sm", "min_mhz": low, "max_mhz": high, "persist": False}
            await self._write("apply_clocks", gpu=uuid, **fields)
        if t.fans is None:
            await self._write("restore_fans", gpu=uuid)
        else:
            curve = to_plain(fan_preset(t.fans))
            await self._write("apply_curve", gpu=uuid, curve=curve, persist=False)
        await self._require_helper().refresh()

    async def _defaults(self, info: GPUInfo) -> None:
        for op, fields in (
            ("restore_power", {"source": "user"}),
            ("restore_clocks", {"clock": "all"}),
            ("restore_fans", {}),
        ):
            try:
                await self._write(op, gpu=info.uuid, **fields)
            except GPUError as exc:
                log.error("GPU %s: %s after a failed profile step: %s", info.uuid, op, exc)
        await self._require_helper().refresh()

    async def _write(self, op: str, **fields: Any) -> dict[str, Any]:
        """One helper write, its answer. A profile is several, and the helper allows a few a
        second, so a ``rate_limited`` refusal is waited out (up to PROFILE_WRITE_WAIT_S), never
        dropped: a change by hand right after a profile switch waits its turn too."""
        deadline = asyncio.get_running_loop().time() + PROFILE_WRITE_WAIT_S
        while True:
            try:
                return await self._require_helper().request(op, **fields)
            except HelperRefused as exc:
                if exc.code != "rate_limited" or asyncio.get_running_loop().time() > deadline:
                    raise
            await asyncio.sleep(0.25)

    async def _all_or_one(self, op: str, target: str, fields: dict[str, str]) -> list[str]:
        helper = self._require_helper()
        answer = await self._write(op, gpu=target, **fields)
        await helper.refresh()
        return list(answer.get("gpus", []))

    def _changed(self, uuid: object, what: str, detail: str) -> None:
        self._publish(
            GPUControlChanged(uuid=str(uuid), what=what, detail=detail, simulated=self._simulated)
        )
