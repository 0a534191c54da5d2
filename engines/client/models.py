"""Models on demand: servable, loaded, load/unload, placement, attached servers
(engines/ondemand/routes.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING

from engines.client.base import JSON, ClientBase, named_path
from engines.core.waiting import within
from engines.errors import ControlAPIError
from engines.events.codec import from_plain
from engines.events.models import (
    AttachedServer,
    LoadedModel,
    Placement,
    ServableModel,
    SetupProposal,
)

if TYPE_CHECKING:
    pass


class ModelCalls(ClientBase):
    async def servable_models(self) -> list[ServableModel]:
        """Every model a request may name (the chat window's picker), loaded or not."""
        data = await self._call("GET", "/api/servable")
        return [from_plain(ServableModel, m) for m in data["models"]]

    async def setup_proposals(self) -> list[SetupProposal]:
        """What the first-run setup proposes on this computer: the presets its GPUs run
        (with the planner's placement now), or the small models for vLLM's CPU build."""
        data = await self._call("GET", "/api/setup/proposals")
        return [from_plain(SetupProposal, p) for p in data]

    async def catalog_problems(self) -> JSON:
        """{"ambiguous": {name: why}, "notes": [...], "broken": [...]} of the catalog."""
        data = await self._call("GET", "/api/servable")
        return {k: data[k] for k in ("ambiguous", "notes", "broken")}

    async def loaded_models(self) -> list[LoadedModel]:
        """`traylm ps`: what holds resources now (the tray menu's Unload list)."""
        return [from_plain(LoadedModel, m) for m in await self._call("GET", "/api/loaded")]

    async def load_model(
        self,
        name: str,
        *,
        gpus: Iterable[int] | None = None,
        ttl: str | float | None = None,
        pin: bool = False,
        replicas: int | None = None,
    ) -> LoadedModel:
        """Place and start a model; returns once it is starting (``wait_for_model`` waits for
        ready). ``ttl``: "10m" or seconds (0: never unload); ``pin``: never unload or evict;
        ``replicas``: engines behind its name (default: its profile's)."""
        body: JSON = {"model": name, "pin": pin}
        if replicas is not None:
            body["replicas"] = replicas
        if gpus is not None:
            body["gpus"] = list(gpus)
        if ttl is not None:
            body["ttl"] = ttl
        return from_plain(LoadedModel, await self._call("POST", "/api/loaded", json_body=body))

    async def unload_model(self, name: str) -> JSON:
        """{"name", "engine_id", "unloaded", "deferred", "message"}: deferred while requests
        still run (it unloads when the last one ends)."""
        data: JSON = await self._call("DELETE", "/api/loaded", params={"model": name})
        return data

    async def wait_for_model(self, name: str, timeout_s: float) -> LoadedModel:
        """Wait until the model serves (its row in `traylm ps` is ready); ControlAPIError
        with the engine's diagnosis when its load failed."""

        async def poll() -> LoadedModel:
            while True:
                rows = {r.engine_id: r for r in await self.loaded_models()}
                rows |= {r.name: r for r in rows.values()}
                row = rows.get(name)
                if row is not None and row.state in ("ready", "sleeping"):
                    return row
                if row is None or row.state in ("failed", "stopped"):
                    models = {m.name: m for m in await self.servable_models()}
                    models |= {n: m for m in models.values() for n in m.names}
                    m = models.get(name)
                    if m is not None and m.state == "failed":
                        raise ControlAPIError(m.detail, code="model_load_failed", http_status=503)
                await asyncio.sleep(0.3)

        return await within(timeout_s, poll())

    async def placement(self, name: str, gpus: Iterable[int] | None = None) -> Placement:
        """Where the planner would load ``name`` now, or exactly why it cannot."""
        params = {"model": name}
        if gpus is not None:
            params["gpus"] = ",".join(str(g) for g in gpus)
        return from_plain(Placement, await self._call("GET", "/api/placement", params=params))

    async def attached_servers(self) -> list[AttachedServer]:
        return [from_plain(AttachedServer, a) for a in await self._call("GET", "/api/attached")]

    async def attach(
        self, name: str, url: str, *, key_env: str = "", key: str = ""
    ) -> AttachedServer:
        """Route ``name`` to an OpenAI-compatible server traylm does not run. ``key_env``: the
        environment variable holding its key (the daemon reads it; ``key`` is its value from
        this process, kept in the daemon's memory only)."""
        body = {"name": name, "url": url, "key_env": key_env, "key": key}
        return from_plain(AttachedServer, await self._call("POST", "/api/attached", json_body=body))

    async def detach(self, name: str) -> AttachedServer:
        return from_plain(
            AttachedServer,
            await self._call("DELETE", named_path("/api/attached/{}", name, "attached server")),
        )
