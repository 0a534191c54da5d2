"""The TensorRT-LLM routes (control API):

GET    /api/trt/cache             cached engines (TRTCacheEntry list, LRU first)
DELETE /api/trt/cache/{id}        remove one (refused while an engine serves from it)
POST   /api/trt/cache/prune       {"stale": bool, "budget_gib": float|null} → removed list
GET    /api/trt/builds            running builds (TRTBuildProgress list)
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from engines.core.http import json_body, ok, traylm_errors
from engines.errors import ConfigError
from engines.trt.launcher import GIB, current_environment
from engines.trt.service import TRTFeature

TRT: web.AppKey[TRTFeature] = web.AppKey("trt", TRTFeature)
"""``request.app[TRT]``: the TensorRT-LLM feature these routes act on (mounted by the daemon)."""


def trt_routes() -> list[web.RouteDef]:
    return [
        web.get("/api/trt/cache", traylm_errors(list_cache)),
        web.delete("/api/trt/cache/{entry_id}", traylm_errors(remove_entry)),
        web.post("/api/trt/cache/prune", traylm_errors(prune)),
        web.get("/api/trt/builds", traylm_errors(list_builds)),
    ]


async def list_cache(request: web.Request) -> web.Response:
    return ok(await request.app[TRT].entries())


async def remove_entry(request: web.Request) -> web.Response:
    trt = request.app[TRT]
    entry_id = request.match_info["entry_id"]
    removed = await asyncio.to_thread(trt.cache.remove, entry_id, trt.launcher.in_use())
    return ok(removed)


async def prune(request: web.Request) -> web.Response:
    trt = request.app[TRT]
    body = await json_body(request, empty_ok=True)
    stale = bool(body.get("stale", False))
    budget = body.get("budget_gib")
    if budget is not None and (not isinstance(budget, int | float) or budget < 0):
        raise ConfigError("budget_gib must be a number of GiB (0 or more)")
    environment = await current_environment(trt.envs, trt.inventory) if stale else None
    if stale and environment is None:
        raise ConfigError(
            "--stale needs the installed TensorRT-LLM and an NVIDIA GPU to compare engines "
            "against; neither answered"
        )
    budget_gib = budget if budget is not None else trt.settings.current.trt.cache_budget_gib
    removed = await asyncio.to_thread(
        trt.cache.prune,
        in_use=trt.launcher.in_use(),
        environment=environment,
        budget_bytes=int(budget_gib * GIB),
    )
    return ok(removed)


async def list_builds(request: web.Request) -> web.Response:
    return ok(request.app[TRT].builds())
