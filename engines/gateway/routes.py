"""The gateway's own routes: the OpenAI API (``/v1/models`` and the forwarded POST routes),
``/health`` and ``/metrics``.

Only an allow-list of OpenAI routes is forwarded (engine admin routes such as vLLM's /pause or
/collective_rpc are never reachable). A new OpenAI-style route (another API shape relayed to an
engine) goes here: parse and check the body, ``ctx.resolve(model)``, then ``relay``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web

from engines.gateway.admission import QueueFull
from engines.gateway.proxy import Upstream, relay
from engines.gateway.service import GATEWAY, GatewayContext
from engines.http import openai_error, parse_json_body
from engines.traffic import Flow

FORWARDED_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
OPEN_ROUTES = frozenset({"/health"})
"""Routes served without an API key."""


async def list_models(request: web.Request) -> web.Response:
    ctx = request.app[GATEWAY]
    data = []
    for name, engine in ctx.routing.served_models():
        data.append(
            {
                "id": name,
                "object": "model",
                "created": int(engine.ready_at_s or time.time()),
                "owned_by": "traylm",
                "traylm": {
                    "engine_id": engine.engine_id,
                    "engine": engine.profile.engine,
                    "device": engine.runtime.device,
                },
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
    try:
        async with asyncio.timeout(g.body_timeout_s):
            body = await request.read()
    except TimeoutError:
        return openai_error(
            408,
            f"the request body did not arrive within {g.body_timeout_s:g} s "
            "(gateway.body_timeout_s)",
            type_="timeout",
        )
    payload, problem = parse_json_body(body)
    if payload is None:
        return openai_error(400, problem or "bad request")
    invalid = _check_payload(payload, ctx)
    if invalid:
        return openai_error(400, invalid[1], param=invalid[0])
    model = payload["model"]
    if ctx.pause is not None:
        ctx.log_refused(request.path, model, 503)
        return openai_error(
            503,
            f"traylm paused new requests: {ctx.pause.reason}",
            type_="paused",
            headers={"Retry-After": str(ctx.pause.retry_after_s)},
        )
    target = ctx.resolve(model)
    if isinstance(target, web.Response):
        ctx.log_refused(request.path, model, target.status)
        return target
    upstream, admission = target
    assert ctx.session is not None
    try:
        async with admission.slot():
            flow = _flow(ctx, upstream, streaming=payload.get("stream") is True)
            try:
                return await relay(
                    request,
                    session=ctx.session,
                    upstream=upstream,
                    body=body,
                    model=model,
                    connect_timeout_s=g.upstream_connect_timeout_s,
                    metrics=ctx.metrics,
                    usage=ctx.usage_sink(request.path, model, upstream),
                )
            finally:
                if flow is not None:
                    flow.close()
    except QueueFull as exc:
        fallback = ctx.fallback(model, "queue_full") if ctx.fallback else None
        if fallback is not None:
            return await relay(
                request,
                session=ctx.session,
                upstream=fallback,
                body=body,
                model=model,
                connect_timeout_s=g.upstream_connect_timeout_s,
                metrics=ctx.metrics,
                usage=ctx.usage_sink(request.path, model, fallback),
            )
        ctx.log_refused(request.path, model, 429, upstream.name)
        return openai_error(
            429,
            f"too many requests for {model}: {exc.reason}; retry later",
            type_="rate_limit_exceeded",
            headers={"Retry-After": str(g.retry_after_s)},
        )


def _flow(ctx: GatewayContext, upstream: Upstream, *, streaming: bool) -> Flow | None:
    """Count the request as in flight to its engine (the supervisor's hang check reads it);
    when the engine is declared dead or stopped, the request is ended at once."""
    if upstream.remote:
        return None
    task = asyncio.current_task()
    assert task is not None

    def stop(_why: str) -> None:
        task.cancel()

    return ctx.traffic.open(upstream.name, streaming=streaming, stop=stop)


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
