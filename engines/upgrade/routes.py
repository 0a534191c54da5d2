"""The /api/upgrade routes (listed in engines/upgrade/service.py's docstring)."""

from __future__ import annotations

from aiohttp import web

from engines.core.http import dataclass_body, json_body, ok, traylm_errors
from engines.errors import ConfigError
from engines.events.upgrade import UpgradeConfig, UpgradeState
from engines.upgrade.service import UpgradeFeature

routes = web.RouteTableDef()

UPGRADE: web.AppKey[UpgradeFeature] = web.AppKey("upgrade", UpgradeFeature)
"""``request.app[UPGRADE]``: the guarded upgrades these routes act on (mounted by the daemon)."""


def upgrade_routes() -> list[web.RouteDef]:
    return list(routes)  # type: ignore[arg-type]


@routes.post("/api/upgrade")
@traylm_errors
async def start(request: web.Request) -> web.Response:
    config = dataclass_body(UpgradeConfig(engine=""), await json_body(request))
    job = await request.app[UPGRADE].start_upgrade(config)
    return ok(job, status=202 if job.state == UpgradeState.RUNNING else 200)


@routes.get("/api/upgrade")
@traylm_errors
async def current(request: web.Request) -> web.Response:
    return ok({"job": request.app[UPGRADE].current})


@routes.post("/api/upgrade/cancel")
@traylm_errors
async def cancel(request: web.Request) -> web.Response:
    return ok(await request.app[UPGRADE].cancel())


@routes.post("/api/upgrade/undo")
@traylm_errors
async def undo(request: web.Request) -> web.Response:
    body = await json_body(request)
    engine, device = body.get("engine"), body.get("device", "auto")
    if not isinstance(engine, str) or not isinstance(device, str):
        raise ConfigError('give {"engine": NAME, "device": "cpu" | "cuda" | "auto"}')
    return ok({"detail": await request.app[UPGRADE].undo(engine, device)})
