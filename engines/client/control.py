"""The daemon's engines, profiles, settings, engine environments and API keys
(engines/control/routes.py)."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from engines.client.base import DOCTOR_TIMEOUT_S, JSON, ClientBase, api_path, named_path
from engines.core.waiting import within
from engines.errors import ControlAPIError
from engines.events.codec import from_plain
from engines.events.core import EngineState, EngineStatus

if TYPE_CHECKING:
    pass


class ControlCalls(ClientBase):
    async def engines(self) -> list[EngineStatus]:
        return [from_plain(EngineStatus, e) for e in await self._call("GET", "/api/engines")]

    async def start(self, profile: str | None = None, **adhoc: Any) -> EngineStatus:
        body = {"profile": profile} if profile else adhoc
        return from_plain(EngineStatus, await self._call("POST", "/api/engines", json_body=body))

    async def command(self, profile: str) -> JSON:
        """What a start of ``profile`` would run (argv, env, files, notes); starts nothing."""
        data: JSON = await self._call(
            "POST", "/api/engines/command", json_body={"profile": profile}
        )
        return data

    async def stop(self, engine_id: str) -> EngineStatus:
        path = named_path("/api/engines/{}/stop", engine_id, "engine")
        return from_plain(EngineStatus, await self._call("POST", path))

    async def restart(self, engine_id: str) -> EngineStatus:
        data = await self._call("POST", named_path("/api/engines/{}/restart", engine_id, "engine"))
        return from_plain(EngineStatus, data)

    async def logs(self, engine_id: str, tail: int = 200) -> list[str]:
        data = await self._call(
            "GET",
            named_path("/api/engines/{}/logs", engine_id, "engine"),
            params={"tail": str(tail)},
        )
        return [str(line) for line in data["lines"]]

    async def shutdown(self, *, close_apps: bool = False) -> None:
        """Stop the daemon (it stops its engines first); ``close_apps``: and the tray app."""
        await self._call("POST", "/api/shutdown", json_body={"close_apps": close_apps})

    async def profiles(self) -> JSON:
        data: JSON = await self._call("GET", "/api/profiles")
        return data

    async def profile(self, name: str) -> JSON:
        data: JSON = await self._call("GET", named_path("/api/profiles/{}", name, "profile"))
        return data

    async def save_profile(self, name: str, fields: JSON, *, dry_run: bool = False) -> JSON:
        params = {"dry_run": "1"} if dry_run else None
        data: JSON = await self._call(
            "PUT",
            named_path("/api/profiles/{}", name, "profile"),
            json_body=fields,
            params=params,
        )
        return data

    async def delete_profile(self, name: str) -> None:
        await self._call("DELETE", named_path("/api/profiles/{}", name, "profile"))

    async def settings(self) -> JSON:
        data: JSON = await self._call("GET", "/api/settings")
        return data

    async def update_settings(self, changes: JSON) -> JSON:
        data: JSON = await self._call("PATCH", "/api/settings", json_body=changes)
        return data

    async def envs(self) -> list[JSON]:
        data: list[JSON] = await self._call("GET", "/api/envs")
        return data

    async def install_env(
        self, engine: str, *, device: str = "auto", version: str | None = None
    ) -> JSON:
        """Start an install in the daemon; follow it with ``events(kinds=("env.install",))``."""
        data: JSON = await self._call(
            "POST", "/api/envs", json_body={"engine": engine, "device": device, "version": version}
        )
        return data

    async def cancel_install(self) -> None:
        """Stop the daemon's running install (its half-made environment is removed)."""
        await self._call("POST", "/api/envs/install/cancel")

    async def env_doctor(self, name: str, *, timeout_s: float = DOCTOR_TIMEOUT_S) -> JSON:
        """The env's checks; importing the engine (vLLM, torch) can take minutes on a cold
        disk, hence a timeout of its own."""
        path = api_path("/api/envs/{}/doctor", name)
        data: JSON = await self._call("GET", path, timeout_s=timeout_s)
        return data

    async def wait_for_engine(
        self,
        engine_id: str,
        states: Iterable[EngineState],
        timeout_s: float,
        on_status: Callable[[EngineStatus], None] | None = None,
    ) -> EngineStatus:
        """Wait until the engine reaches one of ``states``; returns its status then.
        ``on_status`` sees every snapshot on the way (start phases, for a progress line)."""
        wanted = frozenset(states)

        async def poll() -> EngineStatus:
            while True:
                for status in await self.engines():
                    if status.engine_id != engine_id:
                        continue
                    if status.state in wanted:
                        return status
                    if on_status is not None:
                        on_status(status)
                await asyncio.sleep(0.5)

        return await within(timeout_s, poll())

    async def gateway_metrics(self) -> str:
        """The gateway's Prometheus text (through the control token, so API keys do not
        matter)."""
        data = await self._call("GET", "/api/metrics")
        return str(data["text"])

    async def add_api_key(self) -> str:
        """Create a gateway API key; returns it (shown once: only its SHA-256 is stored)."""
        key = "tlm-" + secrets.token_urlsafe(32)
        digest = hashlib.sha256(key.encode()).hexdigest()  # as engines.gateway.security.hash_key
        settings = await self.settings()
        current = list(settings["settings"]["gateway"]["api_key_sha256"])
        await self.update_settings({"gateway.api_key_sha256": [*current, digest]})
        return key

    async def remove_api_key(self, digest: str) -> None:
        """Remove a key by its SHA-256 digest (the daemon refuses while LAN sharing needs it)."""
        settings = await self.settings()
        current = list(settings["settings"]["gateway"]["api_key_sha256"])
        if digest not in current:
            raise ControlAPIError(
                "no such API key; the settings page lists the keys",
                code="not_found",
                http_status=404,
            )
        await self.update_settings({"gateway.api_key_sha256": [d for d in current if d != digest]})
