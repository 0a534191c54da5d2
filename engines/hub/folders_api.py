"""Routes for the model folders in the library (engines/hub/folders.py), part of the hub's:

    GET    /api/models/local                 → [LocalFolder]
    POST   /api/models/local                 {"path": "/abs/folder", "name"?, "tool_parser"?,
                                              "reasoning_parser"?} → LocalFolder (201)
    PATCH  /api/models/local/{name}          {"tool_parser"?, "reasoning_parser"?} → LocalFolder
    DELETE /api/models/local/{name}          → LocalFolder (409 while an engine serves it)

hub_routes() puts them before ``/api/models/{org}/{name}``, which would otherwise take them.
Each change publishes ``library.changed`` (reason ``added``, ``changed`` or ``removed``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from engines.config.profiles import check_name
from engines.core.http import json_body, ok, traylm_errors
from engines.errors import ConfigError, ModelInUse
from engines.events.hub import LibraryChanged
from engines.hub.folders import SETTINGS

if TYPE_CHECKING:
    from engines.hub.service import HubFeature


def folder_routes(key: web.AppKey[HubFeature]) -> list[web.RouteDef]:
    """The routes, reading the hub feature as ``request.app[key]``."""

    async def list_folders(request: web.Request) -> web.Response:
        return ok(await asyncio.to_thread(request.app[key].folders.list))

    async def add_folder(request: web.Request) -> web.Response:
        hub = request.app[key]
        body = await json_body(request)
        raw = body.get("path")
        if not isinstance(raw, str) or not raw.strip():
            raise ConfigError('name the folder: {"path": "/path/to/model"}')
        if not raw.startswith(("/", "~")):
            raise ConfigError(f"{raw!r} is not an absolute path; the daemon has no current folder")
        name = body.get("name")
        if name is not None and not isinstance(name, str):
            raise ConfigError("name must be a string")
        if name:  # the name DELETE /api/models/local/{name} will take
            check_name(name, "model folder")
        if name and name in await asyncio.to_thread(hub.profile_names):
            raise ConfigError(f"a profile is named {name!r}; pick another name for the folder")
        settings = {k: v for k, v in body.items() if k in SETTINGS}
        folder = await asyncio.to_thread(
            hub.folders.add, Path(raw), name=name or None, settings=settings
        )
        hub.publish(LibraryChanged(repo_id=folder.name, commit_sha="", reason="added"))
        return ok(folder, status=201)

    async def change_folder(request: web.Request) -> web.Response:
        hub = request.app[key]
        name = check_name(request.match_info["name"], "model folder")
        body = await json_body(request)
        if not body:
            raise ConfigError(f"name what to change: {' and/or '.join(SETTINGS)}")
        folder = await asyncio.to_thread(hub.folders.update, name, dict(body))
        hub.publish(LibraryChanged(repo_id=name, commit_sha="", reason="changed"))
        return ok(folder)

    async def remove_folder(request: web.Request) -> web.Response:
        hub = request.app[key]
        name = check_name(request.match_info["name"], "model folder")
        folder = await asyncio.to_thread(hub.folders.get, name)
        # only the name's own engines: another name for the same folder (its files stay)
        # serves on when this one is forgotten
        users = hub.serving_name(name)
        if users:
            raise ModelInUse(
                f"{name} is being served by engine {', '.join(users)}; stop it first "
                f"(`traylm stop {users[0]}`)"
            )
        await asyncio.to_thread(hub.folders.remove, name)
        hub.publish(LibraryChanged(repo_id=name, commit_sha="", reason="removed"))
        return ok(folder)

    return [
        web.get("/api/models/local", traylm_errors(list_folders)),
        web.post("/api/models/local", traylm_errors(add_folder)),
        web.patch("/api/models/local/{name}", traylm_errors(change_folder)),
        web.delete("/api/models/local/{name}", traylm_errors(remove_folder)),
    ]
