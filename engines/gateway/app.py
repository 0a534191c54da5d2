"""The gateway's HTTP application on one port: the middlewares (errors, security) around the
gateway's own routes (engines/gateway/routes.py) and the /api routes the daemon mounts.

Every error is JSON in the shape of the API the path belongs to (Anthropic's on /v1/messages,
OpenAI's everywhere else). The control API (/api) needs the token from daemon.json; the model
routes need an API key once keys are configured (``traylm keys``), sent as
``Authorization: Bearer KEY`` or as Anthropic's ``x-api-key: KEY``.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import TypeVar

from aiohttp import web
from aiohttp.typedefs import Middleware

from engines.gateway.connections import is_loopback
from engines.gateway.exchange import (
    REQUEST_ID,
    REQUEST_ID_HEADER,
    Exchange,
    begin,
    new_request_id,
)
from engines.gateway.proxy import CLIENT_GONE, REPLY_COMPLETE
from engines.gateway.refusals import REFUSALS, RefusalLog
from engines.gateway.routes import OPEN_ROUTES, SERVED_ROUTES, gateway_routes
from engines.gateway.security import Guard, header_bytes
from engines.gateway.service import GATEWAY, TOKEN_HEADER, GatewayContext
from engines.gateway.shapes import INTERNAL_ERROR, api_error

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_R = TypeVar("_R", bound=web.StreamResponse)


# --------------------------------------------------------------------------- middleware


def gateway_middleware(ctx: GatewayContext) -> Middleware:
    """Every request's id, errors, security checks, metrics and record, in one middleware
    bound to ``ctx`` (one layer, not two, on the path of each request and of each of its
    awaits). The id goes out as ``x-request-id`` on every answer (``_request_id``, as the
    answer's headers are sent, streams included)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        resp: web.StreamResponse
        rid = request[REQUEST_ID] = new_request_id()
        exchange = None
        if ctx.exchanges is not None:
            local = is_loopback(request.remote)
            exchange = begin(request, rid, ctx.settings.requests, ctx.guard, local=local)
        try:
            answer = _answer_here(ctx, request)
            if answer is not None:
                resp = answer
            else:
                resp = await handler(request)
                origin = request.headers.get("Origin")
                if origin:
                    resp = _cors(resp, origin)
        except asyncio.CancelledError:
            status = _gone_status(request)
            ctx.metrics.requests.inc(route=_route_label(request), status=str(status))
            if exchange is not None:
                _recorded(ctx, exchange, status, None)
            raise
        except web.HTTPException as exc:
            resp = _http_exception(request, exc, ctx)
        except Exception:  # boundary: never leak a traceback (or a path) to a client
            log.exception("unhandled error on %s %s", request.method, request.path)
            resp = api_error(request.path, 500, INTERNAL_ERROR, type_="server_error")
        if request.get(CLIENT_GONE):  # a write to the client failed: it went away
            ctx.metrics.requests.inc(route=_route_label(request), status="499")
        else:
            if resp.status >= 400:
                ctx.metrics.errors.inc(status=str(resp.status))
            ctx.metrics.requests.inc(route=_route_label(request), status=str(resp.status))
        refusals.note(request, resp)
        if exchange is None and resp.status in REFUSALS and ctx.exchanges is not None:
            local = is_loopback(request.remote)
            settings = ctx.settings.requests
            exchange = begin(request, rid, settings, ctx.guard, local=local, refused=True)
        if exchange is not None:
            _record_answer(ctx, exchange, request, resp)
        return resp

    refusals = RefusalLog()
    return middleware


async def served_for_box(
    ctx: GatewayContext, request: web.Request, handler: Handler, *, box: str
) -> web.StreamResponse:
    """A paired box's request, on this box's peer listener (engines/peers/serving.py): recorded
    as the middleware records this box's own clients' (client "box", ``peer`` the box's name,
    under ``requests.capture_lan``), so that the box that served it has it in its recorder too."""
    rid = request[REQUEST_ID] = new_request_id()
    exchange = None
    if ctx.exchanges is not None:
        exchange = begin(request, rid, ctx.settings.requests, ctx.guard, local=False, box=box)
    try:
        resp = await handler(request)
    except asyncio.CancelledError:
        if exchange is not None:
            _recorded(ctx, exchange, _gone_status(request), None)
        raise
    if exchange is not None:
        _record_answer(ctx, exchange, request, resp)
    return resp


def _gone_status(request: web.Request) -> int:
    """The client went away: a stream whose last byte was already sent still counts as a
    success; anything else is 499 (client closed request, as nginx names it)."""
    return 200 if request.get(REPLY_COMPLETE) else 499


def _record_answer(
    ctx: GatewayContext, exchange: Exchange, request: web.Request, resp: web.StreamResponse
) -> None:
    if request.get(CLIENT_GONE):  # a write to the client failed: it went away
        _recorded(ctx, exchange, 499, None)
        return
    body = resp.body if isinstance(resp, web.Response) else None
    _recorded(ctx, exchange, resp.status, body if isinstance(body, bytes) else None)


def _recorded(ctx: GatewayContext, exchange: Exchange, status: int, body: bytes | None) -> None:
    exchange.answered(status, body)
    if ctx.exchanges is not None:
        ctx.exchanges(exchange)


async def _request_id(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: the request's id on its answer, as the headers go out (a
    stream's at its start, inside the handler; every other answer's after the middleware)."""
    rid = request.get(REQUEST_ID)
    if rid is not None:
        response.headers[REQUEST_ID_HEADER] = rid


def _http_exception(
    request: web.Request, exc: web.HTTPException, ctx: GatewayContext
) -> web.Response:
    path = request.path
    if exc.status == 404:
        return api_error(
            path,
            404,
            f"no route {path}; traylm serves {', '.join(SERVED_ROUTES)}",
            type_="not_found",
        )
    if exc.status == 413:
        return api_error(
            path,
            413,
            f"request body larger than {ctx.settings.gateway.max_body_bytes} "
            "bytes (gateway.max_body_bytes)",
        )
    if exc.status == 405:
        return api_error(path, 405, f"method {request.method} not allowed on {path}")
    return api_error(path, exc.status, exc.reason or "error", headers=dict(exc.headers))


def _route_label(request: web.Request) -> str:
    info = request.match_info.route.resource
    return info.canonical if info is not None else "unmatched"


def _answer_here(ctx: GatewayContext, request: web.Request) -> web.Response | None:
    """What the gateway answers itself before any route sees the request: a refusal (not
    from this computer, a path that is not canonical, a Host or Origin not allowed, a missing
    token or key) or a CORS preflight. None lets the request through."""
    guard = ctx.guard
    path = request.path
    if not guard.lan and not is_loopback(request.remote):
        # whatever the socket is bound to: a connection made while LAN sharing was on, or
        # gateway.host set to a LAN address, never serves another computer once it is off
        return api_error(
            path,
            403,
            "this traylm serves only this computer: LAN sharing is off (turn it on with "
            "`traylm config set gateway.lan_sharing true` after `traylm keys add`)",
            type_="forbidden",
        )
    problem = guard.path_problem(request.raw_path)
    if problem:
        return api_error(path, 400, problem)
    if not guard.host_ok(request.headers.get("Host")):
        return api_error(
            path,
            403,
            f"Host {request.headers.get('Host')!r} is not allowed (DNS-rebinding protection); "
            "use localhost or 127.0.0.1, or add the name to gateway.allowed_hosts",
            type_="forbidden",
        )
    origin = request.headers.get("Origin")
    if not guard.origin_ok(origin):
        return api_error(
            path,
            403,
            f"Origin {origin!r} is not allowed; add it to gateway.allowed_origins to let "
            "that web page call traylm",
            type_="forbidden",
        )
    if request.method == "OPTIONS":  # CORS preflight: only for an allow-listed Origin
        if origin:
            return _cors(web.Response(status=204), origin, preflight=True)
        return api_error(
            path, 403, "OPTIONS is only answered for an allowed Origin", type_="forbidden"
        )
    if path.startswith("/api/") or path == "/api":
        if not _token_ok(request, ctx.control_token):
            return api_error(
                path,
                401,
                "the control API needs the token from daemon.json "
                "(traylm's own tools read it for you)",
                type_="unauthorized",
            )
    elif (
        path not in OPEN_ROUTES
        and not _key_ok(request, guard)
        and not _own_token_ok(request, ctx.control_token)
    ):
        return api_error(
            path,
            401,
            "missing or wrong API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY' "
            "(keys are managed with `traylm keys`)",
            type_="unauthorized",
        )
    return None


def _key_ok(request: web.Request, guard: Guard) -> bool:
    """An API key as OpenAI clients send it (Bearer) or as Anthropic's do (x-api-key)."""
    return guard.key_ok(
        request.headers.get("Authorization"),
        request.headers.get("x-api-key"),
        loopback=is_loopback(request.remote),
    )


def _own_token_ok(request: web.Request, token: str) -> bool:
    """traylm's own chat window sends the control token (daemon.json, readable by this user
    only) in ``X-Traylm-Token``: it keeps working whatever the API keys, and gains nothing the
    token does not already give (the whole control API)."""
    given = request.headers.get(TOKEN_HEADER, "")
    return bool(token and given) and secrets.compare_digest(header_bytes(given), token.encode())


def _token_ok(request: web.Request, token: str) -> bool:
    auth = request.headers.get("Authorization", "")
    given = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
    return bool(token) and secrets.compare_digest(header_bytes(given), token.encode())


def _cors(resp: _R, origin: str, *, preflight: bool = False) -> _R:
    if resp.prepared:
        return resp
    resp.headers["Access-Control-Allow-Origin"] = origin
    resp.headers["Vary"] = "Origin"
    if preflight:
        resp.headers["Access-Control-Allow-Methods"] = "GET, POST, OPTIONS"
        resp.headers["Access-Control-Allow-Headers"] = (
            "Authorization, Content-Type, X-Api-Key, Anthropic-Version"
        )
        resp.headers["Access-Control-Max-Age"] = "600"
    return resp


# --------------------------------------------------------------------------- app


def build_app(ctx: GatewayContext) -> web.Application:
    """The gateway's app with its own routes; the daemon mounts each feature's /api routes on
    it (engines.core.http.mount) before it starts serving."""
    app = web.Application(
        middlewares=[gateway_middleware(ctx)],
        client_max_size=ctx.settings.gateway.max_body_bytes,
    )
    app[GATEWAY] = ctx
    app.router.add_routes(gateway_routes(ctx))
    app.on_response_prepare.append(_request_id)

    sweep: list[asyncio.Task[None]] = []

    async def on_startup(_: web.Application) -> None:
        sweep.append(asyncio.create_task(ctx.sweep_stalled_clients(), name="stalled clients"))

    async def on_cleanup(_: web.Application) -> None:
        for task in sweep:
            task.cancel()
        if ctx.throughput is not None:
            await ctx.throughput.stop()
        await ctx.upstreams.close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app
