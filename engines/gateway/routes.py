"""The gateway's own routes: the OpenAI API (``/v1/models`` and the forwarded POST routes),
``/health`` and ``/metrics``.

Only an allow-list of OpenAI routes is forwarded (engine admin routes such as vLLM's /pause or
/collective_rpc are never reachable). A new OpenAI-style route (another API shape relayed to an
engine) goes here: parse and check the body, ``await ctx.resolve(model)`` (see its contract),
then ``relay``.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from engines.config import parse_duration
from engines.errors import ConfigError
from engines.gateway.admission import QueueFull
from engines.gateway.loading import ColdStream
from engines.gateway.proxy import Upstream, relay
from engines.gateway.service import GATEWAY, GatewayContext
from engines.http import openai_error, parse_json_body

FORWARDED_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
OPEN_ROUTES = frozenset({"/health"})
"""Routes served without an API key."""


async def list_models(request: web.Request) -> web.Response:
    """The OpenAI model list, every servable model (loaded or not) with traylm's extras:
    ``status`` (loaded | loading | unloaded) and ``gpus`` (where it is or would go)."""
    ctx = request.app[GATEWAY]
    data = []
    for m in ctx.routing.listing():
        extras = {
            "engine_id": m.engine_id,
            "engine": m.engine,
            "kind": m.kind,
            "state": m.state,
            "external": m.external,
            "gpus_planned": m.gpus_planned,
        }
        for name in (m.name, *m.aliases):
            data.append(
                {
                    "id": name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "traylm",
                    "status": str(m.status),
                    "gpus": list(m.gpus),
                    "traylm": extras,
                }
            )
    return web.json_response({"object": "list", "data": data})


async def forward(request: web.Request) -> web.StreamResponse:
    ctx = request.app[GATEWAY]
    g = ctx.settings.gateway
    if request.content_length is not None and request.content_length > g.max_body_bytes:
        return openai_error(
            413, f"request body larger than {g.max_body_bytes} bytes (gateway.max_body_bytes)"
        )
    body = await request.read()
    payload, problem = parse_json_body(body)
    if payload is None:
        return openai_error(400, problem or "bad request")
    invalid = _check_payload(payload, ctx)
    if invalid:
        return openai_error(400, invalid[1], param=invalid[0])
    keep_alive = None
    if "keep_alive" in payload:  # Ollama's field: the engines do not know it
        try:
            keep_alive = parse_duration(payload.pop("keep_alive"), what="keep_alive")
        except ConfigError as exc:
            return openai_error(400, exc.message, param="keep_alive")
        body = json.dumps(payload).encode()
    if ctx.pause is not None:
        ctx.log_refused(request.path, payload["model"], 503)
        return openai_error(
            503,
            f"traylm paused new requests: {ctx.pause.reason}",
            type_="paused",
            headers={"Retry-After": str(ctx.pause.retry_after_s)},
        )
    return await _route(request, ctx, payload, body, keep_alive)


async def _route(
    request: web.Request,
    ctx: GatewayContext,
    payload: dict[str, Any],
    body: bytes,
    keep_alive: float | None,
) -> web.StreamResponse:
    """Resolve the model (a cold one loads, a streaming client meanwhile gets SSE comments),
    then relay within the upstream's admission queue."""
    model = payload["model"]
    cold = ColdStream(request) if payload.get("stream") is True else None
    target = await ctx.resolve(model, progress=cold)
    if isinstance(target, web.Response):
        ctx.log_refused(request.path, model, target.status)
        if cold is not None and cold.response is not None:
            return await cold.fail(target)
        return target
    upstream, admission = target
    if keep_alive is not None:
        ctx.routing.keep_alive(upstream, keep_alive)
    if upstream.model_name is not None and upstream.model_name != model:
        body = json.dumps({**payload, "model": upstream.model_name}).encode()
    try:
        async with admission.slot():
            return await _send(request, ctx, upstream, body, model, cold)
    except QueueFull as exc:
        fallback = ctx.fallback(model, "queue_full") if ctx.fallback else None
        if fallback is not None:
            return await _send(request, ctx, fallback, body, model, cold)
        ctx.log_refused(request.path, model, 429, upstream.name)
        refused = openai_error(
            429,
            f"too many requests for {model}: {exc.reason}; retry later",
            type_="rate_limit_exceeded",
            headers={"Retry-After": str(ctx.settings.gateway.retry_after_s)},
        )
        if cold is not None and cold.response is not None:
            return await cold.fail(refused)
        return refused


async def _send(
    request: web.Request,
    ctx: GatewayContext,
    upstream: Upstream,
    body: bytes,
    model: str,
    cold: ColdStream | None,
) -> web.StreamResponse:
    assert ctx.session is not None
    return await relay(
        request,
        session=ctx.session,
        upstream=upstream,
        body=body,
        model=model,
        connect_timeout_s=ctx.settings.gateway.upstream_connect_timeout_s,
        metrics=ctx.metrics,
        usage=ctx.usage_sink(request.path, model, upstream),
        prepared=cold.response if cold is not None else None,
    )


def _check_payload(payload: dict[str, Any], ctx: GatewayContext) -> tuple[str, str] | None:
    g = ctx.settings.gateway
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        return "model", "'model' is required: one of the names GET /v1/models lists"
    messages = payload.get("messages")
    if messages is not None and (not isinstance(messages, list) or len(messages) > g.max_messages):
        return "messages", f"'messages' must be a list of at most {g.max_messages} messages"
    n = payload.get("n")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= g.max_n):
        return "n", f"'n' must be a whole number from 1 to {g.max_n}"
    stream = payload.get("stream")
    if stream is not None and not isinstance(stream, bool):
        return "stream", "'stream' must be true or false"
    return None


async def health(request: web.Request) -> web.Response:
    ctx = request.app[GATEWAY]
    engines = {e.engine_id: str(e.state) for e in ctx.routing.engines.values()}
    return web.json_response({"status": "ok", "engines": engines, "paused": ctx.paused})


async def metrics(request: web.Request) -> web.Response:
    ctx = request.app[GATEWAY]
    return web.Response(
        text=ctx.registry.render(),
        content_type="text/plain",
        charset="utf-8",
        headers={"X-Content-Type-Options": "nosniff"},
    )


def gateway_routes() -> list[web.RouteDef]:
    return [
        web.get("/v1/models", list_models),
        *(web.post(route, forward) for route in FORWARDED_ROUTES),
        web.get("/health", health),
        web.get("/metrics", metrics),
    ]
