"""One request, checked and relayed: the path every forwarded route takes after reading its
body (OpenAI and Anthropic JSON routes, the Responses routes, multipart audio).

pause → upstream for the model (``upstream_for``, the one call of ``GatewayContext.resolve``;
a model that is not loaded loads there, and a streaming client meanwhile gets SSE comments
from ``ColdStream``) → Ollama's keep_alive → what the engine can serve (capabilities.py) →
admission slot → ``relay`` → the engine's terse errors explained, in the API's shape. Remote
fallbacks are relayed as they are.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from engines.gateway.admission import Admission, QueueFull
from engines.gateway.capabilities import explain_engine_error, serve_problem
from engines.gateway.loading import ColdStream
from engines.gateway.proxy import ReplySink, Upstream, relay
from engines.gateway.service import GatewayContext
from engines.gateway.shapes import api_error, as_anthropic, is_anthropic
from engines.supervisor import ManagedEngine
from engines.traffic import Flow

ReplyHook = Callable[[str, bytes], None]
"""(engine id, the first bytes of a successful reply from that engine)."""


@dataclass(frozen=True)
class Outbound:
    """What goes to the engine: the body as received and the model it names."""

    body: bytes
    model: str
    payload: Mapping[str, Any] = field(default_factory=dict)
    """The parsed JSON body (empty for multipart)."""
    content_type: str = "application/json"
    keep_alive_s: float | None = None
    """Ollama's ``keep_alive`` the request carried (already taken out of ``body``)."""


async def upstream_for(
    ctx: GatewayContext, model: str, progress: ColdStream | None = None
) -> tuple[Upstream, Admission] | web.Response:
    """The upstream for ``model`` or the error to answer with: every route asks here. A model
    that is not loaded loads first; ``progress`` then keeps a streaming client informed."""
    return await ctx.resolve(model, progress=progress)


def engine_of(ctx: GatewayContext, upstream: Upstream) -> ManagedEngine | None:
    return None if upstream.remote else ctx.routing.engines.get(upstream.name)


def route_of(request: web.Request) -> str:
    """The route's template ("/v1/responses/{response_id}"), as engines' route lists name it."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else request.path


def shaped(request: web.Request, resp: web.Response) -> web.Response:
    return as_anthropic(resp) if is_anthropic(request.path) else resp


async def dispatch(
    ctx: GatewayContext, request: web.Request, out: Outbound, *, on_reply: ReplyHook | None = None
) -> web.StreamResponse:
    """Check and relay ``out``; ``on_reply`` sees the first bytes of a successful reply."""
    path, route = request.path, route_of(request)
    if ctx.pause is not None:
        ctx.log_refused(path, out.model, 503)
        return api_error(
            path,
            503,
            f"traylm paused new requests: {ctx.pause.reason}",
            type_="paused",
            headers={"Retry-After": str(ctx.pause.retry_after_s)},
        )
    cold = ColdStream(request) if out.payload.get("stream") is True else None
    target = await upstream_for(ctx, out.model, cold)
    if not isinstance(target, tuple):  # the error to answer with
        ctx.log_refused(path, out.model, target.status)
        return await _refuse(request, cold, shaped(request, target))
    upstream, admission = target
    if out.keep_alive_s is not None:
        ctx.routing.keep_alive(upstream, out.keep_alive_s)
    if upstream.model_name is not None and upstream.model_name != out.model and out.payload:
        renamed = json.dumps({**out.payload, "model": upstream.model_name}).encode()
        out = dataclasses.replace(out, body=renamed)  # an attached server's own model id
    engine = engine_of(ctx, upstream)
    caps = await ctx.capabilities.of(engine) if engine is not None else None
    if caps is not None:
        problem = serve_problem(caps, request.method, route, request.path, out.payload, out.model)
        if problem is not None:
            ctx.log_refused(path, out.model, problem.status, upstream.name)
            return await _refuse(request, cold, problem)
    tap = await ctx.chat_reply(request, out.model)
    if tap is not None and isinstance(tap, web.Response):
        return await _refuse(request, cold, tap)
    seen = functools.partial(on_reply, upstream.name) if on_reply and engine else None
    resp = await _relay_in_slot(request, ctx, upstream, admission, out, seen, tap, cold)
    if resp.prepared or not isinstance(resp, web.Response):
        return resp
    if resp.status < 400:
        if seen is not None and isinstance(resp.body, bytes):
            seen(resp.body)
        return resp
    resp = explain_engine_error(
        caps, resp, method=request.method, route=route, path=path, model=out.model
    )
    return shaped(request, resp)


async def _refuse(
    request: web.Request, cold: ColdStream | None, error: web.Response
) -> web.StreamResponse:
    """The error, or, when a cold start already began the stream, its error event."""
    if cold is not None and cold.response is not None:
        return await cold.fail(error)
    return error


async def _relay_in_slot(
    request: web.Request,
    ctx: GatewayContext,
    upstream: Upstream,
    admission: Admission,
    out: Outbound,
    on_reply: Callable[[bytes], None] | None,
    tap: ReplySink | None,
    cold: ColdStream | None,
) -> web.StreamResponse:
    g = ctx.settings.gateway

    async def to(target: Upstream, flow: Flow | None = None) -> web.StreamResponse:
        return await relay(
            request,
            client=ctx.upstreams,
            upstream=target,
            body=out.body,
            model=out.model,
            connect_timeout_s=g.upstream_connect_timeout_s,
            metrics=ctx.metrics,
            usage=ctx.usage_sink(request.path, out.model, target),
            content_type=out.content_type,
            on_first_events=on_reply if target is upstream else None,
            flow=flow,
            tap=tap if target is upstream else None,
            prepared=cold.response if cold is not None else None,
        )

    try:
        async with admission.slot():
            flow = _flow(ctx, upstream, streaming=out.payload.get("stream") is True)
            flow.client = request.transport
            try:
                return await to(upstream, flow)
            finally:
                flow.close()
    except QueueFull as exc:
        fallback = ctx.fallback(out.model, "queue_full") if ctx.fallback else None
        if fallback is not None:
            return await to(fallback)
        ctx.log_refused(request.path, out.model, 429, upstream.name)
        refused = api_error(
            request.path,
            429,
            f"too many requests for {out.model}: {exc.reason}; retry later",
            type_="rate_limit_exceeded",
            headers={"Retry-After": str(g.retry_after_s)},
        )
        return await _refuse(request, cold, refused)


def _flow(ctx: GatewayContext, upstream: Upstream, *, streaming: bool) -> Flow:
    """Count the request as in flight to its engine (the supervisor's hang check reads it, the
    sweep of clients that stopped reading goes through it). When the engine is declared dead or
    stopped, the request is ended at once: its relay is cancelled and tells the client why."""
    task = asyncio.current_task()
    assert task is not None
    key = f"remote:{upstream.name}" if upstream.remote else upstream.name

    def end() -> None:
        task.cancel()

    return ctx.traffic.open(key, streaming=streaming, end=end)
