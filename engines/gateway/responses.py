"""Retrieve and cancel in OpenAI's Responses API: they name only a response id, so they go to
the engine that made it (response_owners.py); an id the gateway never saw gets a clear 404.
Creating a response is an ordinary JSON route (routes.py) whose reply the owners map reads.
"""

from __future__ import annotations

from aiohttp import web

from engines.events.core import EngineState
from engines.gateway.capabilities import explain_engine_error, route_problem
from engines.gateway.forward import route_of
from engines.gateway.proxy import Upstream, relay
from engines.gateway.response_owners import MAX_REMEMBERED
from engines.gateway.service import GatewayContext
from engines.http import openai_error


async def stored_response(ctx: GatewayContext, request: web.Request) -> web.StreamResponse:
    """GET /v1/responses/{response_id} and POST /v1/responses/{response_id}/cancel."""
    response_id = request.match_info["response_id"]
    engine_id = ctx.responses.owner(response_id)
    if engine_id is None:
        return openai_error(
            404,
            f"no response {response_id!r} was made through traylm since it started (it "
            f"remembers the last {MAX_REMEMBERED} response ids); check the id",
            param="response_id",
            code="response_not_found",
        )
    engine = ctx.routing.engines.get(engine_id)
    if engine is None or engine.state != EngineState.READY or not engine.base_url:
        state = engine.state if engine is not None else "gone"
        return openai_error(
            404,
            f"response {response_id!r} was made by engine {engine_id!r}, which is {state}; "
            "an engine keeps its responses in memory only while it runs",
            param="response_id",
            code="response_not_found",
        )
    caps = await ctx.capabilities.of(engine)
    model = engine.served_names[0]
    problem = route_problem(caps, request.method, route_of(request), request.path, model)
    if problem is not None:  # a version with create but without retrieve or cancel
        return problem
    upstream = Upstream(engine.engine_id, engine.base_url, {})
    resp = await _relay_stored(request, ctx, upstream)
    if resp.prepared or not isinstance(resp, web.Response) or resp.status < 400:
        return resp
    return explain_engine_error(
        caps,
        resp,
        method=request.method,
        route=route_of(request),
        path=request.path,
        model=model,
    )


async def _relay_stored(
    request: web.Request, ctx: GatewayContext, upstream: Upstream
) -> web.StreamResponse:
    return await relay(
        request,
        client=ctx.upstreams,
        upstream=upstream,
        body=await request.read(),
        model=upstream.name,
        connect_timeout_s=ctx.settings.gateway.upstream_connect_timeout_s,
        metrics=ctx.metrics,
    )
