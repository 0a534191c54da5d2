"""Routes for the model folders in the library (engines/hub/folders.py), part of the hub feature.

    GET    /api/models/local                 → [LocalFolder]
    POST   /api/models/local                 {"path": "/abs/folder", "name"?} → LocalFolder (201)
    DELETE /api/models/local/{name}          → LocalFolder (409 while an engine serves it)

They are registered before ``/api/models/{org}/{name}``, which would otherwise take them.
Each change publishes ``library.changed`` (reason ``added`` or ``removed``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from engines.config import ProfileStore
from engines.errors import ConfigError, ModelInUse
from engines.events import Event, LibraryChanged
from engines.gateway.control import json_body, ok, traylm_errors
from engines.hub.folders import FolderRegistry

Served = Callable[[], dict[str, list[str]]]  # model reference → engine ids serving it


class FolderRoutes:
    def __init__(
        self,
        registry: FolderRegistry,
        *,
        profiles: ProfileStore,
        publish: Callable[[Event], None],
        served: Served,
    ) -> None:
        self.registry = registry
        self._profiles = profiles
        self._publish = publish
        self._served = served

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/api/models/local", traylm_errors(self._list)),
            web.post("/api/models/local", traylm_errors(self._add)),
            web.delete("/api/models/local/{name}", traylm_errors(self._remove)),
        ]

    async def _list(self, request: web.Request) -> web.Response:
        return ok(await asyncio.to_thread(self.registry.list))

    async def _add(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        raw = body.get("path")
        if not isinstance(raw, str) or not raw.strip():
            raise ConfigError('name the folder: {"path": "/path/to/model"}')
        if not raw.startswith(("/", "~")):
            raise ConfigError(f"{raw!r} is not an absolute path; the daemon has no current folder")
        name = body.get("name")
        if name is not None and not isinstance(name, str):
            raise ConfigError("name must be a string")
        if name and name in await asyncio.to_thread(self._profiles.names):
            raise ConfigError(f"a profile is named {name!r}; pick another name for the folder")
        folder = await asyncio.to_thread(self.registry.add, Path(raw), name=name or None)
        self._publish(LibraryChanged(repo_id=folder.name, commit_sha="", reason="added"))
        return ok(folder, status=201)

    async def _remove(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        folder = await asyncio.to_thread(self.registry.get, name)
        users = self._served().get(folder.path, []) + self._served().get(name, [])
        if users:
            raise ModelInUse(
                f"{name} is being served by engine {', '.join(users)}; stop it first "
                f"(`traylm stop {users[0]}`)"
            )
        await asyncio.to_thread(self.registry.remove, name)
        self._publish(LibraryChanged(repo_id=name, commit_sha="", reason="removed"))
        return ok(folder)
