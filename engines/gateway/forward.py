"""One request, checked and relayed: the path every forwarded route takes after reading its
body (OpenAI and Anthropic JSON routes, the Responses routes, multipart audio).

pause → upstream for the model (``upstream_for``, the one call of ``GatewayContext.resolve``) →
what the engine can serve (capabilities.py) → admission slot → ``relay`` → the engine's terse
errors explained, in the API's shape. Remote fallbacks are relayed as they are.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from engines.gateway.admission import Admission, QueueFull
from engines.gateway.capabilities import (
    Capabilities,
    explain_engine_error,
    route_problem,
    tools_problem,
)
from engines.gateway.proxy import ReplySink, Upstream, relay
from engines.gateway.service import GATEWAY, GatewayContext
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


async def upstream_for(
    ctx: GatewayContext, model: str
) -> tuple[Upstream, Admission] | web.Response:
    """The upstream for ``model`` or the error to answer with: every route asks here."""
    return ctx.resolve(model)


def engine_of(ctx: GatewayContext, upstream: Upstream) -> ManagedEngine | None:
    return None if upstream.remote else ctx.routing.engines.get(upstream.name)


def route_of(request: web.Request) -> str:
    """The route's template ("/v1/responses/{response_id}"), as engines' route lists name it."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else request.path


def shaped(request: web.Request, resp: web.Response) -> web.Response:
    return as_anthropic(resp) if is_anthropic(request.path) else resp


async def dispatch(
    request: web.Request, out: Outbound, *, on_reply: ReplyHook | None = None
) -> web.StreamResponse:
    """Check and relay ``out``; ``on_reply`` sees the first bytes of a successful reply."""
    ctx = request.app[GATEWAY]
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
    target = await upstream_for(ctx, out.model)
    if isinstance(target, web.Response):
        ctx.log_refused(path, out.model, target.status)
        return shaped(request, target)
    upstream, admission = target
    engine = engine_of(ctx, upstream)
    caps = await ctx.capabilities.of(engine) if engine is not None else None
    if caps is not None:
        problem = _problem(caps, request, route, out)
        if problem is not None:
            ctx.log_refused(path, out.model, problem.status, upstream.name)
            return problem
    tap = await ctx.chat_reply(request, out.model)
    if isinstance(tap, web.Response):
        return tap
    seen = functools.partial(on_reply, upstream.name) if on_reply and engine else None
    resp = await _relay_in_slot(request, ctx, upstream, admission, out, seen, tap)
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


def _problem(
    caps: Capabilities, request: web.Request, route: str, out: Outbound
) -> web.Response | None:
    found = route_problem(caps, request.method, route, request.path, out.model)
    if found is not None:
        return found
    why = tools_problem(caps, request.path, out.payload, out.model)
    if why:
        return api_error(request.path, 400, why, param="tools", code="tool_parser_missing")
    return None


async def _relay_in_slot(
    request: web.Request,
    ctx: GatewayContext,
    upstream: Upstream,
    admission: Admission,
    out: Outbound,
    on_reply: Callable[[bytes], None] | None,
    tap: ReplySink | None,
) -> web.StreamResponse:
    g = ctx.settings.gateway

    async def to(target: Upstream, flow: Flow | None = None) -> web.StreamResponse:
        assert ctx.session is not None
        return await relay(
            request,
            session=ctx.session,
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
        return api_error(
            request.path,
            429,
            f"too many requests for {out.model}: {exc.reason}; retry later",
            type_="rate_limit_exceeded",
            headers={"Retry-After": str(g.retry_after_s)},
        )


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
