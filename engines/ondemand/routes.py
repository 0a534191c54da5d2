"""The models-on-demand routes under /api (behind the control token; errors in the OpenAI error
shape with traylm's code). Names may contain '/' (repo ids), so they travel in the body or the
query, not in the path.

    GET    /api/servable                 every servable model → {"models": [ServableModel],
                                         "ambiguous": {name: why}, "notes": [...], "broken": [...]}
    GET    /api/setup/proposals          what the first-run setup proposes here → [SetupProposal]
                                         (presets the GPUs run, with their placement; else
                                         the CPU starters: proposals.py)
    GET    /api/loaded                   `traylm ps` → [LoadedModel]
    POST   /api/loaded                   {"model", "gpus"?: [0, 1] | "0,1", "ttl"?: "10m" | 600,
                                         "pin"?: bool, "replicas"?: 2} → LoadedModel (202:
                                         starting)
    DELETE /api/loaded?model=NAME        → {"unloaded", "deferred", "message", ...}
                                         (202 when deferred: requests still run)
    GET    /api/placement?model=NAME&gpus=0,1    where it would load now → Placement
    GET    /api/attached                 → [AttachedServer]
    POST   /api/attached                 {"name", "url", "key_env"?, "key"?} → AttachedServer
    DELETE /api/attached/{name}          → AttachedServer (state "detached"); a name that
                                         is not a profile-style name is refused (400)

Events: ``model.state`` (ModelStateChanged), ``model.loading`` (ModelLoading),
``attached.state`` (AttachedChanged).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from engines.config.fields import parse_duration
from engines.config.profiles import MAX_NAME_CHARS, MAX_REPLICAS, check_name
from engines.core.http import json_body, ok, query_text, traylm_errors
from engines.errors import ConfigError, quoted
from engines.ondemand.actions import load_model, unload_model
from engines.ondemand.service import ModelsOnDemand

ONDEMAND: web.AppKey[ModelsOnDemand] = web.AppKey("ondemand", ModelsOnDemand)
"""``request.app[ONDEMAND]``: the feature these routes act on (mounted by the daemon)."""


def ondemand_routes() -> list[web.RouteDef]:
    return [
        web.get("/api/servable", traylm_errors(servable)),
        web.get("/api/setup/proposals", traylm_errors(setup_proposals)),
        web.get("/api/loaded", traylm_errors(loaded)),
        web.post("/api/loaded", traylm_errors(load)),
        web.delete("/api/loaded", traylm_errors(unload)),
        web.get("/api/placement", traylm_errors(placement)),
        web.get("/api/attached", traylm_errors(attached)),
        web.post("/api/attached", traylm_errors(attach)),
        web.delete("/api/attached/{name}", traylm_errors(detach)),
    ]


async def servable(request: web.Request) -> web.Response:
    feature = request.app[ONDEMAND]
    models = await feature.listing()  # read fresh
    index = feature.catalog.index
    return ok(
        {
            "models": models,
            "ambiguous": index.ambiguous,
            "notes": index.notes,
            "broken": index.broken,
        }
    )


async def setup_proposals(request: web.Request) -> web.Response:
    return ok(await request.app[ONDEMAND].setup_proposals())


async def loaded(request: web.Request) -> web.Response:
    return ok(request.app[ONDEMAND].ps())


async def load(request: web.Request) -> web.Response:
    feature = request.app[ONDEMAND]
    body = await json_body(request)
    name = _model(body.get("model"))
    ttl = None if body.get("ttl") in (None, "") else parse_ttl(body["ttl"])
    pin = body.get("pin", False)
    if not isinstance(pin, bool):
        raise ConfigError("pin must be true or false")
    gpus = feature.placer.check_gpus(parse_gpus(body.get("gpus")))
    replicas = _replicas(body.get("replicas"))
    loaded = await load_model(feature, name, gpus=gpus, ttl_s=ttl, pin=pin, replicas=replicas)
    return ok(loaded, status=202)


def _replicas(value: object) -> int | None:
    """``replicas`` of a load: a whole number from 1 to MAX_REPLICAS, or absent."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_REPLICAS:
        raise ConfigError(f"replicas must be a whole number from 1 to {MAX_REPLICAS}")
    return value


async def unload(request: web.Request) -> web.Response:
    result = await unload_model(
        request.app[ONDEMAND], _model(query_text(request, "model", max_chars=MAX_NAME_CHARS))
    )
    return ok(result, status=202 if result.deferred else 200)


async def placement(request: web.Request) -> web.Response:
    feature = request.app[ONDEMAND]
    gpus = feature.placer.check_gpus(parse_gpus(query_text(request, "gpus", max_chars=4096)))
    return ok(
        await feature.placement(
            _model(query_text(request, "model", max_chars=MAX_NAME_CHARS)), gpus
        )
    )


async def attached(request: web.Request) -> web.Response:
    return ok(list(request.app[ONDEMAND].attached.servers.values()))


async def attach(request: web.Request) -> web.Response:
    feature = request.app[ONDEMAND]
    body = await json_body(request)
    server = await feature.attached.attach(
        str(body.get("name", "")),
        str(body.get("url", "")),
        key_env=str(body.get("key_env") or ""),
        key=str(body.get("key") or ""),
    )
    await feature.catalog.refresh()
    return ok(server, status=201)


async def detach(request: web.Request) -> web.Response:
    feature = request.app[ONDEMAND]
    server = await feature.attached.detach(
        check_name(request.match_info["name"], "attached server")
    )
    await feature.catalog.refresh()
    return ok(server)


def _model(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError("'model' is required: a name `traylm models ls` shows")
    return value


def parse_ttl(value: Any) -> float:
    """A TTL: seconds or a duration ("10m"), 0 meaning never; a negative one is refused."""
    seconds = parse_duration(value, what="ttl")
    if seconds < 0:
        raise ConfigError(
            f"ttl {value!r} is negative; a TTL is a duration of 0 or more (0: never unload), "
            "e.g. 300, 10m or 1h"
        )
    return seconds


def parse_gpus(value: Any) -> tuple[int, ...] | None:
    """``[0, 1]`` or ``"0,1"`` → (0, 1); None or "" or "auto" → None (the planner picks)."""
    if value in (None, "", "auto"):
        return None
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        raise ConfigError("gpus must be GPU indices such as 0, 1 or 0,1")
    try:
        gpus = tuple(int(str(i).strip()) for i in items)
    except ValueError:
        raise ConfigError(f"gpus {quoted(value)} must be GPU indices such as 0, 1 or 0,1") from None
    if not gpus or len(set(gpus)) != len(gpus) or min(gpus) < 0:
        raise ConfigError(f"gpus {quoted(value)} must be distinct GPU indices (0, 1, ...)")
    return gpus
