"""Replicas across boxes, on the box that serves: the peer routes through
which a paired box sends requests to the models ready here, and the list of them.

Peer API (on the listener for paired boxes: mutual TLS, ``request[CALLER]`` the asking box):
GET  /peer/models               BoxServes: the models ready on this box's own engines, its GPUs
POST /v1/chat/completions, ...  (gateway.routes.BOX_ROUTES) the gateway's own path: the body
                                checked as at :8000, then ``forward.dispatch`` with
                                ``Outbound.for_box``, so this box's admission queues, engines
                                and relay serve it, streamed. Only models ready here (a load
                                for a paired box only with peers.load_for_peers), never
                                another paired box, never the remote fallback; its keep_alive
                                is dropped (it would unload this box's model). Recorded
                                by this box's recorder too (client "box", the box's name).

The paths are the gateway's own (the engines' route lists, the API's error shapes and the relay
read the path); they are served only on the peer listener, behind its paired-only middleware.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from engines.core.http import ok
from engines.errors import quoted
from engines.events.gpu import GPUInfo
from engines.events.peers import BoxGPU, BoxModel, BoxServes
from engines.gateway.app import served_for_box
from engines.gateway.forward import dispatch
from engines.gateway.routes import BOX_ROUTES, checked_json
from engines.gateway.service import GatewayContext
from engines.gateway.shapes import api_error
from engines.peers.routes import CALLER, PEERS

log = logging.getLogger(__name__)

Shared = Callable[[], list[BoxModel]]
"""The models ready on this box's own engines (ModelsOnDemand.shared)."""
GPUs = Callable[[], Awaitable[tuple[GPUInfo, ...]]]
OWN_KINDS = frozenset({"profile", "library", "folder"})
"""What this box may load for a paired box (peers.load_for_peers): never an attached server."""


def extend_peer_app(
    app: web.Application, *, ctx: GatewayContext, shared: Shared, gpus: GPUs
) -> None:
    """Add the serving routes to the listener's application (peers.routes.peer_app)."""
    app.router.add_get("/peer/models", functools.partial(models, ctx, shared, gpus))
    for route in sorted(BOX_ROUTES):
        app.router.add_post(route, functools.partial(serve, ctx, shared))


async def models(
    ctx: GatewayContext, shared: Shared, gpus: GPUs, request: web.Request
) -> web.Response:
    """What this box serves to paired boxes now (nothing while peers.share_models is off)."""
    found = shared() if ctx.settings.peers.share_models else []
    cards = tuple(BoxGPU(g.index, g.name, g.memory_total_bytes) for g in await gpus())
    return ok(BoxServes(name=request.app[PEERS].box_name, models=tuple(found), gpus=cards))


async def serve(ctx: GatewayContext, shared: Shared, request: web.Request) -> web.StreamResponse:
    """A paired box's request, served by this box's gateway path (module docstring): only for
    a model /peer/models lists (this box's own ready engines), or, with peers.load_for_peers,
    one of its own models it may load; never an attached server or another box's model."""
    box = request.app[PEERS].box_name
    if not ctx.settings.peers.share_models:
        return api_error(
            request.path,
            503,
            f"box {box!r} does not share its models with paired boxes (peers.share_models is "
            "off there)",
            type_="not_shared",
        )
    # a body as large as the gateway takes (the listener's own limit is for its small routes)
    request = request.clone(client_max_size=ctx.settings.gateway.max_body_bytes)
    out = await checked_json(ctx, request)
    if isinstance(out, web.Response):
        return out
    caller = request[CALLER].name
    ready_here = any(out.model in m.names for m in shared())
    if not ready_here and not (ctx.settings.peers.load_for_peers and await _own(ctx, out.model)):
        return api_error(
            request.path,
            404,
            f"{out.model[:80]!r} is not one of the models box {box!r} shares with paired boxes "
            "(its own engines' models, listed by /peer/models)",
            type_="model_not_found",
        )
    if not ctx.settings.peers.load_for_peers and ctx.routing.upstream(out.model) is None:
        return api_error(
            request.path,
            503,
            f"{quoted(out.model)} is not loaded on box {box!r}, which loads no model for a "
            "paired box (peers.load_for_peers is off there)",
            type_="model_not_loaded",
        )
    out = dataclasses.replace(out, boxes=False, for_box=caller, keep_alive_s=None)
    try:
        return await served_for_box(
            ctx, request, functools.partial(dispatch, ctx, out=out), box=caller
        )
    except Exception:  # boundary (as the gateway's middleware): no traceback to the other box
        log.exception("serving %s for box %s failed", request.path, caller)
        return api_error(request.path, 500, f"box {box!r} failed to serve it; see its log")


async def _own(ctx: GatewayContext, model: str) -> bool:
    """``model`` is one of this box's own (a profile, a library model or a folder it may start),
    not an attached server nor a paired box's."""
    for m in await ctx.routing.listing():
        if model in (m.name, *m.aliases) and m.kind in OWN_KINDS and not m.external:
            return True
    return False
