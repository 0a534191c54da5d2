"""The /api/tune routes (listed in engines/tune/service.py's docstring)."""

from __future__ import annotations

import asyncio

from aiohttp import web

from engines.core.http import dataclass_body, json_body, ok, traylm_errors
from engines.errors import ConfigError, TuneError
from engines.events.tune import TuneConfig
from engines.tune.report import render_tune
from engines.tune.service import TuneFeature
from engines.tune.targets import tune_targets

routes = web.RouteTableDef()

TUNE: web.AppKey[TuneFeature] = web.AppKey("tune", TuneFeature)
"""``request.app[TUNE]``: the tuner these routes act on (mounted by the daemon)."""


def tune_routes() -> list[web.RouteDef]:
    return list(routes)  # type: ignore[arg-type]


@routes.post("/api/tune")
@traylm_errors
async def start(request: web.Request) -> web.Response:
    config = dataclass_body(TuneConfig(model=""), await json_body(request))
    return ok(await request.app[TUNE].start_tune(config), status=202)


@routes.get("/api/tune")
@traylm_errors
async def current(request: web.Request) -> web.Response:
    return ok({"job": request.app[TUNE].current})


@routes.post("/api/tune/cancel")
@traylm_errors
async def cancel(request: web.Request) -> web.Response:
    return ok(await request.app[TUNE].cancel())


@routes.post("/api/tune/apply")
@traylm_errors
async def apply(request: web.Request) -> web.Response:
    return ok(await request.app[TUNE].apply_last())


@routes.get("/api/tune/targets")
@traylm_errors
async def targets(request: web.Request) -> web.Response:
    can, cannot = await tune_targets(request.app[TUNE].planner.ondemand)
    return ok({"targets": can, "left_out": cannot})


@routes.get("/api/tune/budget")
@traylm_errors
async def least_budget(request: web.Request) -> web.Response:
    model = request.query.get("model", "")
    try:
        repeat = int(request.query.get("repeat", "2"))
    except ValueError:
        raise ConfigError("give ?model=NAME&repeat=N, N a whole number") from None
    return ok(await request.app[TUNE].planner.least_budget(model, repeat))


@routes.get("/api/tune/previous")
@traylm_errors
async def previous(request: web.Request) -> web.Response:
    names = await asyncio.to_thread(request.app[TUNE].previous.names)
    return ok({"profiles": names})


@routes.post("/api/tune/undo")
@traylm_errors
async def undo(request: web.Request) -> web.Response:
    profile = (await json_body(request)).get("profile")
    if not isinstance(profile, str):
        raise ConfigError('give {"profile": NAME}')
    detail = await request.app[TUNE].undo(profile)
    return ok({"profile": profile, "detail": detail})


@routes.get("/api/tune/report")
@traylm_errors
async def report(request: web.Request) -> web.Response:
    job = request.app[TUNE].current
    if job is None:
        raise TuneError("no tune has run since the daemon started; `traylm tune MODEL` runs one")
    html = await asyncio.to_thread(render_tune, job)
    return web.Response(text=html, content_type="text/html", charset="utf-8")
