"""The gateway's own routes: the OpenAI API (``/v1/models``, chat, completions, embeddings,
responses, audio, rerank, score, tokenize), Anthropic's Messages API, ``/health``, ``/metrics``.

Only this allow-list is forwarded (engine admin routes such as vLLM's /pause or /collective_rpc
are never reachable). A new JSON route relayed to an engine is one more entry in JSON_ROUTES:
its body is checked in its API's terms (checks.py) and dispatched (forward.py), which asks the
engine's capabilities whether it serves the route at all.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from engines.config.fields import parse_duration
from engines.core.http import openai_error, parse_json_body
from engines.errors import ConfigError, quoted
from engines.events.codec import to_plain
from engines.events.models import ServableModel
from engines.gateway.audio import audio
from engines.gateway.checks import check_anthropic, check_openai
from engines.gateway.forward import Outbound, dispatch
from engines.gateway.responses import on_create, stays_here, stored_response
from engines.gateway.service import GatewayContext
from engines.gateway.shapes import api_error, body_too_slow, is_anthropic

Handler = Callable[[GatewayContext, web.Request], Awaitable[web.StreamResponse]]
"""A route's handler: the gateway's context, then the request."""

RESPONSES_ROUTE = "/v1/responses"
JSON_ROUTES = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    RESPONSES_ROUTE,
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/tokenize",
    "/detokenize",
    "/v1/rerank",
    "/v1/score",
)
BOX_ROUTES = frozenset(JSON_ROUTES) - {RESPONSES_ROUTE}
"""The routes a paired box's replica serves (engines/peers/serving.py): every JSON route but the
Responses API, whose stored responses stay on the box that made them."""
AUDIO_ROUTES = ("/v1/audio/transcriptions", "/v1/audio/translations")
SERVED_ROUTES = (
    "GET /v1/models",
    "GET /v1/models/{id}",
    *(f"POST {route}" for route in JSON_ROUTES),
    f"GET {RESPONSES_ROUTE}/{{id}}",
    f"POST {RESPONSES_ROUTE}/{{id}}/cancel",
    f"DELETE {RESPONSES_ROUTE}/{{id}}",
    f"GET {RESPONSES_ROUTE}/{{id}}/input_items",
    *(f"POST {route}" for route in AUDIO_ROUTES),
)
"""What the gateway answers (for the 404 of any other path). Engine admin routes (/pause,
/collective_rpc, /sleep, /reset_prefix_cache, ...) are not in it, so they are unreachable."""
OPEN_ROUTES = frozenset({"/health"})
"""Routes served without an API key."""


PASSING_BLOCKS = frozenset({"hub_unavailable", "gpu_unavailable", "gpu_lost"})
"""Why a model cannot start now that may pass by itself: it stays listed. Any other reason (no
GPU here, too few, an engine env not installed) keeps it out of GET /v1/models (``traylm ps
--all`` and the app show it with the reason): a client that picks a listed model must be able
to use it."""


async def list_models(ctx: GatewayContext, request: web.Request) -> web.Response:
    data, _ = await _model_list(ctx)
    return web.json_response({"object": "list", "data": data})


async def _model_list(ctx: GatewayContext) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Every servable model (loaded or not) with traylm's extras: ``status`` (loaded |
    loading | unloaded), ``gpus`` (where it is, or would go now), and for a model served by
    several engines ``traylm.replicas`` (each one's engine id, state, GPUs, requests); and
    the names left out because they cannot start here, with why."""
    data = []
    hidden: dict[str, str] = {}
    models = await ctx.routing.listing()
    for m in models:
        if m.blocked and m.blocked_code not in PASSING_BLOCKS:
            hidden.update((name, m.blocked) for name in (m.name, *m.aliases))
            continue
        extras = {
            "engine_id": m.engine_id,
            "engine": m.engine,
            "kind": m.kind,
            "state": m.state,
            "external": m.external,
            "gpus_planned": m.gpus_planned,
        }
        if m.replicas:
            extras["replicas"] = to_plain(m.replicas)
        for name in (m.name, *m.aliases):
            data.append(
                {
                    "id": name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "traylm",
                    "status": listed_status(m),
                    "gpus": list(m.gpus),
                    "traylm": extras,
                }
            )
    return data, hidden


def listed_status(m: ServableModel) -> dict[str, Any]:
    """A model's ``status`` as llama.cpp's router lists it, at /v1/models as at /models: ``value``
    loaded | loading | unloaded, ``args`` (none: traylm starts engines from profiles), and
    ``failed`` when its last start failed. Open WebUI's llama.cpp connection reads its loaded
    mark and eject button from it."""
    status: dict[str, Any] = {"value": str(m.status), "args": []}
    if m.state == "failed":
        status["failed"] = True
    return status


async def retrieve_model(ctx: GatewayContext, request: web.Request) -> web.Response:
    """GET /v1/models/{model_id}: the openai SDK's ``models.retrieve``."""
    model_id = request.match_info["model_id"]
    items, hidden = await _model_list(ctx)
    for item in items:
        if item["id"] == model_id:
            return web.json_response(item)
    served = ", ".join(sorted({str(item["id"]) for item in items})) or "none"
    why = f"cannot start on this computer: {hidden[model_id]}" if model_id in hidden else None
    return openai_error(
        404,
        f"the model {quoted(model_id)} {why or 'is not served'}; served models: {served}",
        type_="model_not_found",
        code="model_not_found",
        param="model",
    )


async def forward_json(ctx: GatewayContext, request: web.Request) -> web.StreamResponse:
    """Every JSON POST route: read and check the body in its API's terms, then dispatch."""
    out = await checked_json(ctx, request)
    if isinstance(out, web.Response):
        return out
    watch = None
    if request.path == RESPONSES_ROUTE:
        creating = await on_create(ctx, request, out.payload)
        if isinstance(creating, web.Response):
            return creating
        watch, self_contained = creating
        if self_contained is not None:
            body = json.dumps(self_contained).encode()
            out = dataclasses.replace(out, body=body, payload=self_contained)
    resp = await dispatch(ctx, request, out, watch=watch)
    if request.path == RESPONSES_ROUTE and resp.status == 404 and not resp.prepared:
        return stays_here(ctx, out.model) or resp
    return resp


async def checked_json(ctx: GatewayContext, request: web.Request) -> Outbound | web.Response:
    """A JSON route's body read (bounded in size and time) and checked in its API's terms,
    Ollama's ``keep_alive`` taken out; or the error to answer with."""
    g = ctx.settings.gateway
    path = request.path
    declared = request.content_length
    if declared is not None and declared > g.max_body_bytes:
        return _too_large(path, g.max_body_bytes)
    if request.content.is_eof():  # the whole body came with the head (usual for JSON)
        body = request.content.read_nowait()
        if len(body) > g.max_body_bytes:  # no Content-Length: a chunked body came whole
            return _too_large(path, g.max_body_bytes)
    else:
        try:
            async with asyncio.timeout(g.body_timeout_s):
                body = await request.read()
        except TimeoutError:
            return body_too_slow(path, g.body_timeout_s)
    payload, problem = parse_json_body(body)
    if payload is None:
        return api_error(path, 400, problem or "bad request")
    if is_anthropic(path):
        invalid = check_anthropic(payload, g, count_tokens=path.endswith("/count_tokens"))
    else:
        invalid = check_openai(payload, g)
    if invalid:
        return api_error(path, 400, invalid[1], param=invalid[0])
    keep_alive = None
    if "keep_alive" in payload:  # Ollama's field: how long the model stays loaded after this
        try:
            keep_alive = parse_duration(payload.pop("keep_alive"), what="keep_alive")
        except ConfigError as exc:
            return api_error(path, 400, exc.message, param="keep_alive")
        body = json.dumps(payload).encode()  # the engines do not know it
    boxes = path in BOX_ROUTES
    return Outbound(body, payload["model"], payload, keep_alive_s=keep_alive, boxes=boxes)


def _too_large(path: str, limit: int) -> web.Response:
    return api_error(path, 413, f"request body larger than {limit} bytes (gateway.max_body_bytes)")


async def health(ctx: GatewayContext, request: web.Request) -> web.Response:
    engines = {e.engine_id: str(e.state) for e in ctx.routing.engines.values()}
    return web.json_response({"status": "ok", "engines": engines, "paused": ctx.paused})


async def metrics(ctx: GatewayContext, request: web.Request) -> web.Response:
    return web.Response(
        text=ctx.registry.render(),
        content_type="text/plain",
        charset="utf-8",
        headers={"X-Content-Type-Options": "nosniff"},
    )


def gateway_routes(ctx: GatewayContext) -> list[web.RouteDef]:
    """The routes, each handler bound to ``ctx`` (no lookup of it on each request)."""

    def bound(handler: Handler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        return functools.partial(handler, ctx)

    return [
        web.get("/v1/models", bound(list_models)),
        web.get("/v1/models/{model_id:.+}", bound(retrieve_model)),
        *(web.post(route, bound(forward_json)) for route in JSON_ROUTES),
        web.get(RESPONSES_ROUTE + "/{response_id}", bound(stored_response)),
        web.post(RESPONSES_ROUTE + "/{response_id}/cancel", bound(stored_response)),
        web.delete(RESPONSES_ROUTE + "/{response_id}", bound(stored_response)),
        web.get(RESPONSES_ROUTE + "/{response_id}/input_items", bound(stored_response)),
        *(web.post(route, bound(audio)) for route in AUDIO_ROUTES),
        web.get("/health", bound(health)),
        web.get("/metrics", bound(metrics)),
    ]
