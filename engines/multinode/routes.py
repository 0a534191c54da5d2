"""Routes of a model across boxes.

Peer API (on the listener for paired boxes: mutual TLS, ``request[CALLER]`` the head box):
POST   /peer/spread/facts            {engine_id, profile, head_host} → Facts of this box
POST   /peer/spread/reach            {host, port} → {reached, error}: can this box open it
POST   /peer/spread/sink             any bytes → {bytes}: the head box times the upload
POST   /peer/spread/ranks            {engine_id, profile, plan, lease_s} → start this box's rank
GET    /peer/spread/ranks/{rank_id}  its state (renews the head's lease)
DELETE /peer/spread/ranks/{rank_id}  end it (every process of it)

Control API (control token):
GET    /api/spread/{profile}         the preflight of a profile with ``boxes``: findings, what
                                     each link means for tokens/s, and the warning that vLLM's
                                     traffic between the boxes is unencrypted
"""

from __future__ import annotations

import asyncio
import dataclasses

from aiohttp import web

from engines.core.http import json_body, ok, traylm_errors
from engines.errors import ConfigError
from engines.multinode.network import host_of
from engines.multinode.service import MultiNode
from engines.peers.routes import CALLER
from engines.peers.store import Peer

SPREAD: web.AppKey[MultiNode] = web.AppKey("spread", MultiNode)
REACH_TIMEOUT_S = 3.0
SINK_MAX_BYTES = 16 << 20


def control_routes() -> list[web.RouteDef]:
    return [web.get("/api/spread/{profile}", traylm_errors(check))]


def extend_peer_app(app: web.Application, feature: MultiNode) -> None:
    """Add the peer routes to the listener's application (peers.routes.peer_app)."""
    app[SPREAD] = feature
    app.router.add_post("/peer/spread/facts", traylm_errors(facts))
    app.router.add_post("/peer/spread/reach", traylm_errors(reach))
    app.router.add_post("/peer/spread/sink", traylm_errors(sink))
    app.router.add_post("/peer/spread/ranks", traylm_errors(start_rank))
    app.router.add_get("/peer/spread/ranks/{rank_id}", traylm_errors(rank_state))
    app.router.add_delete("/peer/spread/ranks/{rank_id}", traylm_errors(stop_rank))


async def check(request: web.Request) -> web.Response:
    return ok(await request.app[SPREAD].check(request.match_info["profile"]))


def _caller(request: web.Request) -> Peer:
    return request[CALLER]


async def facts(request: web.Request) -> web.Response:
    body = await json_body(request)
    head_host = body.get("head_host")
    if not isinstance(head_host, str):
        raise ConfigError("head_host must be the head box's address")
    caller = _caller(request)
    found = await request.app[SPREAD].followers.facts(caller.name, head_host, body)
    return ok(dataclasses.asdict(found))


async def reach(request: web.Request) -> web.Response:
    body = await json_body(request)
    host, port = body.get("host"), body.get("port")
    if not isinstance(host, str) or not isinstance(port, int) or isinstance(port, bool):
        raise ConfigError("give host (text) and port (a number)")
    if host not in (host_of(_caller(request).address), request.remote):
        # only the calling box's own address: the route is no port scanner for anything else
        raise ConfigError("a box may only ask about its own address")
    try:
        async with asyncio.timeout(REACH_TIMEOUT_S):
            _, writer = await asyncio.open_connection(host, port)
        writer.close()
    except (OSError, TimeoutError) as exc:
        return ok({"reached": False, "error": getattr(exc, "strerror", None) or "timed out"})
    return ok({"reached": True, "error": ""})


async def sink(request: web.Request) -> web.Response:
    size = 0
    async for chunk in request.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > SINK_MAX_BYTES:
            raise ConfigError(f"at most {SINK_MAX_BYTES} bytes")
    return ok({"bytes": size})


async def start_rank(request: web.Request) -> web.Response:
    body = await json_body(request)
    return ok(await request.app[SPREAD].followers.start(_caller(request).name, body))


def _rank_id(request: web.Request) -> str:
    rank_id = request.match_info["rank_id"]
    if not rank_id.startswith(_caller(request).name + "."):
        raise ConfigError("a box may only ask about its own ranks")
    return rank_id


async def rank_state(request: web.Request) -> web.Response:
    return ok(request.app[SPREAD].followers.status(_rank_id(request)))


async def stop_rank(request: web.Request) -> web.Response:
    return ok({"stopped": await request.app[SPREAD].followers.stop(_rank_id(request))})
