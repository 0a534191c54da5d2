"""The gateway's HTTP application: OpenAI routes, /health, /metrics and /api on one port.

Only an allow-list of OpenAI routes is forwarded (engine admin routes such as vLLM's /pause or
/collective_rpc are never reachable). Every error is OpenAI-shaped JSON.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from engines.config import Settings
from engines.events.core import EngineState
from engines.gateway.admission import Admission, QueueFull
from engines.gateway.metrics import GatewayMetrics, MetricsRegistry
from engines.gateway.proxy import (
    REPLY_COMPLETE,
    Upstream,
    UsageSink,
    relay,
)
from engines.gateway.security import Guard
from engines.gateway.usage import UsageRecord
from engines.http import openai_error, parse_json_body
from engines.supervisor import Supervisor

if TYPE_CHECKING:
    from engines.daemon import Daemon

log = logging.getLogger(__name__)

FORWARDED_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
OPEN_ROUTES = frozenset({"/health"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
CONTEXT: web.AppKey[GatewayContext] = web.AppKey("gateway", object)  # type: ignore[arg-type]


@dataclass
class Pause:
    """Set by the thermal guard: new requests get 503 until it is lifted."""

    reason: str
    retry_after_s: int = 30


@dataclass
class GatewayContext:
    settings: Settings
    supervisor: Supervisor
    registry: MetricsRegistry
    control_token: str
    daemon: Daemon | None = None
    metrics: GatewayMetrics = field(init=False)
    guard: Guard = field(init=False)
    session: aiohttp.ClientSession | None = None
    admissions: dict[str, Admission] = field(default_factory=dict)
    pause: Pause | None = None
    started_at_s: float = field(default_factory=time.time)
    fallback: Callable[[str, str], Upstream | None] | None = None
    """Remote fallback hook: (model, why) → an upstream, or None. Installed by the daemon."""
    usage: Callable[[UsageRecord], None] | None = None
    """Usage-log hook: one record per relayed request (engines/gateway/usage.py)."""

    def __post_init__(self) -> None:
        self.metrics = GatewayMetrics(self.registry)
        self.apply_settings(self.settings)
        self.registry.gauge(
            "traylm_queue_depth",
            "Requests waiting for an engine.",
            lambda: {(("engine", k),): float(a.waiting) for k, a in self.admissions.items()},
        )
        self.registry.gauge(
            "traylm_requests_in_flight",
            "Requests being served by an engine.",
            lambda: {(("engine", k),): float(a.in_flight) for k, a in self.admissions.items()},
        )

    def apply_settings(self, settings: Settings) -> None:
        self.settings = settings
        g = settings.gateway
        # the Host check keeps the port the gateway listens on: a new gateway.port applies at
        # the next start (checking it now locked every client out of the running daemon)
        listening = self.guard.port if hasattr(self, "guard") else g.port
        self.guard = Guard.build(
            hosts=g.allowed_hosts,
            origins=g.allowed_origins,
            key_digests=g.api_key_sha256,
            port=listening,
            lan=g.lan_sharing,
        )
        for adm in self.admissions.values():
            adm.max_concurrent, adm.max_queue = g.max_concurrent, g.max_queue
            adm.queue_timeout_s = g.queue_timeout_s

    def admission(self, engine_id: str) -> Admission:
        adm = self.admissions.get(engine_id)
        if adm is None:
            g = self.settings.gateway
            adm = self.admissions[engine_id] = Admission(
                max_concurrent=g.max_concurrent,
                max_queue=g.max_queue,
                queue_timeout_s=g.queue_timeout_s,
            )
        return adm


# --------------------------------------------------------------------------- middlewares


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    ctx = request.app[CONTEXT]
    try:
        resp = await handler(request)
    except asyncio.CancelledError:
        # The client went away. A stream whose last byte was already sent still counts as a
        # success; anything else is 499 (client closed request, as nginx names it).
        status = "200" if request.get(REPLY_COMPLETE) else "499"
        ctx.metrics.requests.inc(route=_route_label(request), status=status)
        raise
    except web.HTTPException as exc:
        resp = _http_exception(request, exc, ctx)
    except Exception:  # boundary: never leak a traceback (or a path) to a client
        log.exception("unhandled error on %s %s", request.method, request.path)
        resp = openai_error(
            500, "internal error in the traylm gateway; see the daemon log", type_="server_error"
        )
    if resp.status >= 400:
        ctx.metrics.errors.inc(status=str(resp.status))
    ctx.metrics.requests.inc(route=_route_label(request), status=str(resp.status))
    return resp


def _http_exception(
    request: web.Request, exc: web.HTTPException, ctx: GatewayContext
) -> web.Response:
    if exc.status == 404:
        return openai_error(
            404,
            f"no route {request.path}; traylm serves "
            f"{', '.join(('/v1/models', *FORWARDED_ROUTES))}",
            type_="not_found",
        )
    if exc.status == 413:
        return openai_error(
            413,
            f"request body larger than {ctx.settings.gateway.max_body_bytes} "
            "bytes (gateway.max_body_bytes)",
            type_="invalid_request_error",
        )
    if exc.status == 405:
        return openai_error(405, f"method {request.method} not allowed on {request.path}")
    return openai_error(exc.status, exc.reason or "error", headers=dict(exc.headers))


def _route_label(request: web.Request) -> str:
    info = request.match_info.route.resource
    return info.canonical if info is not None else "unmatched"


@web.middleware
async def security_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    ctx = request.app[CONTEXT]
    guard = ctx.guard
    problem = guard.path_problem(request.raw_path)
    if problem:
        return openai_error(400, problem, type_="invalid_request_error")
    if not guard.host_ok(request.headers.get("Host")):
        return openai_error(
            403,
            f"Host {request.headers.get('Host')!r} is not allowed (DNS-rebinding protection); "
            "use localhost or 127.0.0.1, or add the name to gateway.allowed_hosts",
            type_="forbidden",
        )
    origin = request.headers.get("Origin")
    if not guard.origin_ok(origin):
        return openai_error(
            403,
            f"Origin {origin!r} is not allowed; add it to gateway.allowed_origins to let "
            "that web page call traylm",
            type_="forbidden",
        )
    if request.method == "OPTIONS":  # CORS preflight: only for an allow-listed Origin
        if origin:
            return _cors(web.Response(status=204), origin, preflight=True)
        return openai_error(
            403, "OPTIONS is only answered for an allowed Origin", type_="forbidden"
        )
    path = request.path
    if path.startswith("/api/") or path == "/api":
        if not _token_ok(request, ctx.control_token):
            return openai_error(
                401,
                "the control API needs the token from daemon.json "
                "(traylm's own tools read it for you)",
                type_="unauthorized",
            )
    elif path not in OPEN_ROUTES and not guard.key_ok(request.headers.get("Authorization")):
        return openai_error(
            401,
            "missing or wrong API key: send 'Authorization: Bearer KEY' "
            "(keys are managed with `traylm keys`)",
            type_="unauthorized",
        )
    resp = await handler(request)
    return _cors(resp, origin) if origin else resp


def _token_ok(request: web.Request, token: str) -> bool:
    import secrets

    auth = request.headers.get("Authorization", "")
    given = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
    return bool(token) and secrets.compare_digest(given.encode(), token.encode())


def _cors(resp: web.StreamResponse, origin: str, *, preflight: bool = False) -> web.StreamResponse:
    if resp.prepared:
        return resp
    resp.headers["Access-Control-Allow-Origin"] = origin
    resp.headers["Vary"] = "Origin"
    if preflight:
        resp.headers["Access-Control-Allow-Methods"] = "GET, POST, OPTIONS"
        resp.headers["Access-Control-Allow-Headers"] = "Authorization, Content-Type"
        resp.headers["Access-Control-Max-Age"] = "600"
    return resp


# --------------------------------------------------------------------------- OpenAI routes


async def list_models(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    data = []
    for name, engine in ctx.supervisor.served_models():
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
    ctx = request.app[CONTEXT]
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
    model = payload["model"]
    if ctx.pause is not None:
        _log_refused(ctx, request, model, 503)
        return openai_error(
            503,
            f"traylm paused new requests: {ctx.pause.reason}",
            type_="paused",
            headers={"Retry-After": str(ctx.pause.retry_after_s)},
        )
    target = _resolve(ctx, model)
    if isinstance(target, web.Response):
        _log_refused(ctx, request, model, target.status)
        return target
    upstream, admission = target
    assert ctx.session is not None
    try:
        async with admission.slot():
            return await relay(
                request,
                session=ctx.session,
                upstream=upstream,
                body=body,
                model=model,
                connect_timeout_s=g.upstream_connect_timeout_s,
                metrics=ctx.metrics,
                usage=_usage_sink(ctx, request, model, upstream),
            )
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
                usage=_usage_sink(ctx, request, model, fallback),
            )
        _log_refused(ctx, request, model, 429, upstream.name)
        return openai_error(
            429,
            f"too many requests for {model}: {exc.reason}; retry later",
            type_="rate_limit_exceeded",
            headers={"Retry-After": str(g.retry_after_s)},
        )


def _usage_sink(
    ctx: GatewayContext, request: web.Request, model: str, upstream: Upstream
) -> UsageSink | None:
    record = ctx.usage
    if record is None:
        return None

    def sink(status: int, prompt: int | None, completion: int | None, duration_s: float) -> None:
        record(
            UsageRecord(
                model,
                upstream.name,
                request.path,
                upstream.remote,
                status,
                prompt,
                completion,
                duration_s,
            )
        )

    return sink


def _log_refused(
    ctx: GatewayContext, request: web.Request, model: str, status: int, engine_id: str = ""
) -> None:
    """Requests the gateway answered itself (not served, starting, paused, queue full)."""
    if ctx.usage is not None:
        ctx.usage(UsageRecord(model, engine_id, request.path, False, status, None, None, 0.0))


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


def _resolve(ctx: GatewayContext, model: str) -> tuple[Upstream, Admission] | web.Response:
    retry = str(ctx.settings.gateway.retry_after_s)
    engine = ctx.supervisor.route(model)
    if engine is not None and engine.state == EngineState.READY and engine.base_url:
        upstream = Upstream(engine.engine_id, engine.base_url, {})
        return upstream, ctx.admission(engine.engine_id)
    why = "not_served" if engine is None else str(engine.state)
    fallback = ctx.fallback(model, why) if ctx.fallback else None
    if fallback is not None:
        return fallback, ctx.admission(f"remote:{fallback.name}")
    if engine is None:
        served = sorted({name for name, _ in ctx.supervisor.served_models()})
        listing = ", ".join(served) if served else "none (start one with `traylm start PROFILE`)"
        return openai_error(
            404,
            f"the model {model!r} is not served; served models: {listing}",
            type_="model_not_found",
            code="model_not_found",
            param="model",
        )
    if engine.state == EngineState.STARTING:
        return openai_error(
            503,
            f"{model!r} is starting ({engine.detail}); retry in {retry} s",
            type_="engine_starting",
            headers={"Retry-After": retry},
        )
    return openai_error(
        503,
        f"the engine for {model!r} is {engine.state}: {engine.detail}. Start it with "
        f"`traylm start {engine.engine_id}`",
        type_="engine_unavailable",
        headers={"Retry-After": retry},
    )


async def health(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    engines = {e.engine_id: str(e.state) for e in ctx.supervisor.engines.values()}
    return web.json_response(
        {"status": "ok", "engines": engines, "paused": ctx.pause.reason if ctx.pause else None}
    )


async def metrics(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    return web.Response(
        text=ctx.registry.render(),
        content_type="text/plain",
        charset="utf-8",
        headers={"X-Content-Type-Options": "nosniff"},
    )


# --------------------------------------------------------------------------- app


def build_app(
    ctx: GatewayContext, *, control_routes: list[web.RouteDef] | None = None
) -> web.Application:
    app = web.Application(
        middlewares=[error_middleware, security_middleware],
        client_max_size=ctx.settings.gateway.max_body_bytes,
    )
    app[CONTEXT] = ctx
    app.router.add_get("/v1/models", list_models)
    for route in FORWARDED_ROUTES:
        app.router.add_post(route, forward)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    if control_routes:
        app.router.add_routes(control_routes)

    async def on_startup(_: web.Application) -> None:
        if ctx.session is None:
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None, force_close=False)
            ctx.session = aiohttp.ClientSession(connector=connector, auto_decompress=False)

    async def on_cleanup(_: web.Application) -> None:
        if ctx.session is not None:
            await ctx.session.close()
            ctx.session = None

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app
