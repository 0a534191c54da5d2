"""The remote fallback's routes (control API):

GET    /api/remote                RemoteStatus
POST   /api/remote/refresh-key    read the OS keyring again → RemoteStatus
"""

from __future__ import annotations

from aiohttp import web

from engines.core.http import ok, traylm_errors
from engines.remote.service import RemoteFallback

REMOTE: web.AppKey[RemoteFallback] = web.AppKey("remote", RemoteFallback)
"""``request.app[REMOTE]``: the remote fallback (mounted by the daemon)."""


def remote_routes() -> list[web.RouteDef]:
    return [
        web.get("/api/remote", traylm_errors(remote_status)),
        web.post("/api/remote/refresh-key", traylm_errors(refresh_key)),
    ]


async def remote_status(request: web.Request) -> web.Response:
    return ok(request.app[REMOTE].status())


async def refresh_key(request: web.Request) -> web.Response:
    remote = request.app[REMOTE]
    await remote.refresh_key()
    return ok(remote.status())
