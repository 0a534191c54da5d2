"""Guarded engine upgrades (engines/upgrade/service.py): one at a time, in the daemon; follow
one with ``events(kinds=("upgrade", "env.install", "tune"))``: the install's lines, the
measurement's steps, UpgradeFinished at the end."""

from __future__ import annotations

from engines.client.base import ClientBase
from engines.events.codec import from_plain, to_plain
from engines.events.upgrade import UpgradeConfig, UpgradeJob


class UpgradeCalls(ClientBase):
    async def upgrade_start(self, config: UpgradeConfig) -> UpgradeJob:
        """Start a guarded upgrade (bad input is refused here, before anything is installed);
        a job of state ``current`` when nothing newer exists (the package index is asked)."""
        data = await self._call("POST", "/api/upgrade", json_body=to_plain(config), timeout_s=180)
        return from_plain(UpgradeJob, data)

    async def upgrade_current(self) -> UpgradeJob | None:
        """The running upgrade, else the last one since the daemon started, else None."""
        data = await self._call("GET", "/api/upgrade")
        return from_plain(UpgradeJob, data["job"]) if data.get("job") else None

    async def upgrade_cancel(self, *, timeout_s: float = 300) -> UpgradeJob:
        """Stop the running upgrade; returns once what ran before runs again."""
        data = await self._call("POST", "/api/upgrade/cancel", timeout_s=timeout_s)
        return from_plain(UpgradeJob, data)

    async def upgrade_undo(self, engine: str, device: str = "auto") -> str:
        """Go back to the version the last upgrade of ``engine`` replaced; the daemon's words."""
        body = {"engine": engine, "device": device}
        data = await self._call("POST", "/api/upgrade/undo", json_body=body)
        return str(data["detail"])
