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
import itertools
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

from engines.events.core import EngineState
from engines.gateway.admission import (
    ENGINE_LOW_PRIORITY,
    LOW_PRIORITY_HEADER,
    Admission,
    QueueFull,
)
from engines.gateway.balance import Affinity
from engines.gateway.capabilities import (
    asks_for_tools,
    explain_engine_error,
    planned,
    serve_problem,
    tools_problem,
)
from engines.gateway.exchange import EXCHANGE, ReplyCapture
from engines.gateway.loading import ColdStream
from engines.gateway.proxy import NOT_SENT, ReplySink, Rewrite, UsageSink, relay
from engines.gateway.service import GatewayContext
from engines.gateway.shapes import api_error, as_anthropic, as_openai, is_anthropic
from engines.gateway.upstream import Upstream
from engines.runtime.supervisor import ManagedEngine
from engines.runtime.traffic import RelayedRequest

log = logging.getLogger(__name__)

REROUTES = 2
"""How many times a request that has not started moves to another replica."""


class ReplyWatch(Protocol):
    """What a route watches of a successful reply from one of traylm's engines (the
    Responses API's new responses: responses.py ``Creating``)."""

    def first_events(self, engine_id: str, data: bytes) -> None:
        """A stream's first events."""
        ...

    def whole(self, engine_id: str, body: bytes) -> None:
        """A whole (not streamed) reply."""
        ...

    def tap(self, engine_id: str, inner: ReplySink | None) -> ReplySink | None:
        """The sink that sees a stream's events (wrapping ``inner``)."""
        ...

    def rewriter(self) -> Rewrite | None:
        """What changes the reply before anything sees it (the ids of a kept response)."""
        ...


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
    boxes: bool = False
    """Whether a paired box's replica of the model may take it (routes.BOX_ROUTES)."""
    for_box: str = ""
    """The paired box that sent it (engines/peers/serving.py): only this box's own engines
    serve it, ready ones unless peers.load_for_peers; "" for this box's own clients."""


async def upstream_for(
    ctx: GatewayContext,
    model: str,
    progress: ColdStream | None = None,
    affinity: Affinity | None = None,
    for_box: str = "",
) -> tuple[Upstream, Admission] | web.Response:
    """The upstream for ``model`` or the error to answer with: every route asks here. A model
    that is not loaded loads first; ``progress`` then keeps a streaming client informed;
    ``affinity`` picks among replicas; ``for_box``: a paired box's request (Outbound)."""
    return await ctx.resolve(model, progress=progress, affinity=affinity, for_box=for_box)


def affinity_of(ctx: GatewayContext, out: Outbound) -> Affinity:
    """What ties this request to one replica: its conversation's start, and the engine that
    holds its ``previous_response_id`` (whose caller ``responses.on_create`` checked)."""
    previous = out.payload.get("previous_response_id")
    owner = ctx.responses.engine_of(previous) if isinstance(previous, str) else None
    return Affinity(out.payload, owner, boxes=out.boxes and not out.for_box)


def engine_of(ctx: GatewayContext, upstream: Upstream) -> ManagedEngine | None:
    return None if upstream.remote or upstream.box else ctx.routing.engines.get(upstream.name)


def route_of(request: web.Request) -> str:
    """The route's template ("/v1/responses/{response_id}"), as engines' route lists name it."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else request.path


def shaped(request: web.Request, resp: web.Response) -> web.Response:
    """An error in the request's API's shape and types (the engines' included)."""
    return as_anthropic(resp) if is_anthropic(request.path) else as_openai(resp)


async def dispatch(
    ctx: GatewayContext, request: web.Request, out: Outbound, *, watch: ReplyWatch | None = None
) -> web.StreamResponse:
    """Check and relay ``out``; ``watch`` sees a successful reply from an engine."""
    path, route = request.path, route_of(request)
    exchange = request.get(EXCHANGE)
    if exchange is not None:
        stream = out.payload.get("stream") is True
        exchange.asked(out.model, out.body, out.content_type, stream=stream)
    if ctx.pause is not None:
        ctx.log_refused(path, out.model, 503)
        return api_error(
            path,
            503,
            f"traylm paused new requests: {ctx.pause.reason}",
            type_="paused",
            headers={"Retry-After": str(ctx.pause.retry_after_s)},
        )
    early = await _tools_before_loading(ctx, path, out)
    if early is not None:
        ctx.log_refused(path, out.model, early.status)
        return early
    cold = ColdStream(request) if out.payload.get("stream") is True else None
    affinity = affinity_of(ctx, out)
    target = await upstream_for(ctx, out.model, cold, affinity, out.for_box)
    if not isinstance(target, tuple):  # the error to answer with
        ctx.log_refused(path, out.model, target.status)
        return await _refuse(request, cold, shaped(request, target))
    upstream, admission = target
    if out.keep_alive_s is not None:
        ctx.routing.keep_alive(upstream, out.keep_alive_s)
    engine = engine_of(ctx, upstream)
    if is_low_priority(ctx, request) and engine is not None and out.payload:
        out = _engine_priority(engine, out)
    if upstream.model_name is not None and upstream.model_name != out.model and out.payload:
        renamed = json.dumps({**out.payload, "model": upstream.model_name}).encode()
        out = dataclasses.replace(out, body=renamed)  # an attached server's own model id
    if exchange is not None:
        exchange.engine_id, exchange.remote = upstream.name, upstream.remote
        if engine is not None:
            p = engine.profile
            exchange.gpus = "cpu" if p.device == "cpu" else ",".join(map(str, p.gpus))
    caps = await ctx.capabilities.of(engine) if engine is not None else None
    if caps is not None:
        problem = serve_problem(caps, request.method, route, request.path, out.payload, out.model)
        if problem is not None:
            ctx.log_refused(path, out.model, problem.status, upstream.name)
            return await _refuse(request, cold, problem)
    tap = await ctx.chat_reply(request, out.model)
    if tap is not None and isinstance(tap, web.Response):
        return await _refuse(request, cold, tap)
    watched = watch if watch is not None and engine is not None else None
    routed = Routed(upstream, admission, affinity)
    resp = await _relay_in_slot(request, ctx, routed, out, watched, tap, cold)
    if resp.prepared or not isinstance(resp, web.Response):
        return resp
    if resp.status < 400:
        if watched is not None and isinstance(resp.body, bytes):
            watched.whole(routed.upstream.name, resp.body)
        return resp
    resp = explain_engine_error(
        caps, resp, method=request.method, route=route, path=path, model=out.model
    )
    return shaped(request, resp)


def is_low_priority(ctx: GatewayContext, request: web.Request) -> bool:
    """A line of one of the daemon's own batches: it goes after every other request."""
    return request.headers.get(LOW_PRIORITY_HEADER) == "1" and ctx.guard.internal(
        request.headers.get("Authorization"), request.headers.get("x-api-key")
    )


def _engine_priority(engine: ManagedEngine, out: Outbound) -> Outbound:
    """The body with vLLM's low ``priority`` where the engine schedules by priority (vLLM
    refuses a ``priority`` otherwise)."""
    p = engine.profile
    flags = " ".join(p.extra_flags).replace("=", " ").split()
    by_priority = any(
        a == "--scheduling-policy" and b == "priority" for a, b in itertools.pairwise(flags)
    )
    if p.engine != "vllm" or not by_priority or "priority" in out.payload:
        return out
    payload = {**out.payload, "priority": ENGINE_LOW_PRIORITY}
    return dataclasses.replace(out, body=json.dumps(payload).encode(), payload=payload)


async def _tools_before_loading(
    ctx: GatewayContext, path: str, out: Outbound
) -> web.Response | None:
    """A request with tools for a model that is not loaded and would start without a
    tool-call parser: refused now, not after its cold load (half a minute, for a 400)."""
    if not asks_for_tools(path, out.payload) or ctx.routing.upstream(out.model) is not None:
        return None
    remote = ctx.settings.remote
    if remote.enabled and out.model in remote.aliases:  # may go to the remote API, not load
        return None
    profile = await ctx.routing.start_profile(out.model, fresh=False)
    if profile is not None and (profile.engine != "vllm" or profile.tool_parser):
        return None
    profile = await ctx.routing.start_profile(out.model, fresh=True)  # the settings as they are
    if profile is None or profile.engine != "vllm" or profile.tool_parser:
        return None
    caps = await asyncio.to_thread(planned, profile, ctx.routing.served_as)
    why = tools_problem(caps, path, out.payload, out.model)
    return api_error(path, 400, why, param="tools", code="tool_parser_missing") if why else None


async def _refuse(
    request: web.Request, cold: ColdStream | None, error: web.Response
) -> web.StreamResponse:
    """The error, or, when a cold start already began the stream, its error event."""
    if cold is not None and cold.response is not None:
        return await cold.fail(error)
    return error


@dataclass
class Routed:
    """Where a request goes, updated when it moves to another replica before it started."""

    upstream: Upstream
    admission: Admission
    affinity: Affinity


async def _relay_in_slot(
    request: web.Request,
    ctx: GatewayContext,
    routed: Routed,
    out: Outbound,
    watch: ReplyWatch | None,
    tap: ReplySink | None,
    cold: ColdStream | None,
) -> web.StreamResponse:
    """Relay in the upstream's admission slot. A request that has not started on its engine
    moves to another ready replica of the model (at most ``REROUTES`` times) when the engine
    went down while it waited for a slot, or could not be reached; a request the engine took
    stays (its client gets the engine's error)."""
    g = ctx.settings.gateway
    exchange = request.get(EXCHANGE)
    low = is_low_priority(ctx, request)

    def usage(target: Upstream) -> UsageSink | None:
        sink = ctx.usage_sink(request.path, out.model, target)
        return exchange.counted(sink) if exchange is not None else sink

    async def to(target: Upstream, flow: RelayedRequest | None = None) -> web.StreamResponse:
        mine = flow is not None  # an engine of the model's, not the remote fallback
        seen, sink, rewrite = None, None, None  # what watches the reply: its engine's
        if mine:
            sink = watch.tap(target.name, tap) if watch is not None else tap
            seen = functools.partial(watch.first_events, target.name) if watch else None
            rewrite = watch.rewriter() if watch is not None else None
        if exchange is not None:  # the recorder keeps every reply, the remote fallback's too
            sink = ReplyCapture(exchange, sink)
        return await relay(
            request,
            client=ctx.upstreams,
            upstream=target,
            body=out.body,
            model=out.model,
            connect_timeout_s=g.upstream_connect_timeout_s,
            metrics=ctx.metrics,
            usage=usage(target),
            content_type=out.content_type,
            on_first_events=seen,
            flow=flow,
            tap=sink,
            prepared=cold.response if cold is not None else None,
            rewrite=rewrite,
        )

    try:
        for attempt in range(REROUTES + 1):
            async with routed.admission.slot(low=low):
                last = attempt == REROUTES
                upstream = routed.upstream
                other = None if last else _moved(ctx, upstream, out.model, routed.affinity)
                if other is None:
                    flow = _flow(ctx, upstream, streaming=out.payload.get("stream") is True)
                    flow.client = request.transport
                    try:
                        resp = await to(upstream, flow)
                    finally:
                        flow.close()
                    if last or not resp.get(NOT_SENT):
                        return resp
                    other = _moved(ctx, upstream, out.model, routed.affinity, unreachable=True)
                    if other is None:
                        return resp
            log.warning("%s: a request moved from %s to %s", out.model, upstream.name, other.name)
            avoid = routed.affinity.avoid | {upstream.name}
            routed.affinity = dataclasses.replace(routed.affinity, avoid=avoid)
            routed.upstream, routed.admission = other, ctx.admission(other.name)
            if exchange is not None:
                exchange.engine_id = other.name
        raise AssertionError("unreachable: the last attempt returns")
    except QueueFull as exc:
        fallback = ctx.fallback(out.model, "queue_full") if ctx.fallback else None
        if fallback is not None:
            if exchange is not None:
                exchange.engine_id, exchange.remote = fallback.name, True
            return await to(fallback)
        ctx.log_refused(request.path, out.model, 429, routed.upstream.name)
        refused = api_error(
            request.path,
            429,
            f"too many requests for {out.model}: {exc.reason}; retry later",
            type_="rate_limit_exceeded",
            headers={"Retry-After": str(g.retry_after_s)},
        )
        return await _refuse(request, cold, refused)


def _moved(
    ctx: GatewayContext,
    upstream: Upstream,
    model: str,
    affinity: Affinity,
    *,
    unreachable: bool = False,
) -> Upstream | None:
    """Another ready replica for a request that has not started on ``upstream``: its engine
    went down while the request waited for a slot, or (``unreachable``) did not take the
    connection; None when it is up, or no other replica is ready."""
    if upstream.remote:
        return None
    if not unreachable:
        engine = ctx.routing.engines.get(upstream.name)
        if engine is None or engine.state == EngineState.READY:
            return None
    avoid = dataclasses.replace(affinity, avoid=affinity.avoid | {upstream.name})
    other = ctx.routing.upstream(model, avoid)
    return other if other is not None and other.name != upstream.name else None


def _flow(ctx: GatewayContext, upstream: Upstream, *, streaming: bool) -> RelayedRequest:
    """Count the request as in flight to its engine (the supervisor's hang check reads it, the
    sweep of clients that stopped reading goes through it). When the engine is declared dead or
    stopped, the request is ended at once: its relay is cancelled and tells the client why."""
    task = asyncio.current_task()
    assert task is not None
    key = f"remote:{upstream.name}" if upstream.remote else upstream.name

    def end() -> None:
        task.cancel()

    return ctx.traffic.open(key, streaming=streaming, end=end)
