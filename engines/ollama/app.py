"""The HTTP application of Ollama's API on its own port: the same defences as :8000
(engines/gateway/security.py's Guard: LAN only with LAN sharing, canonical paths, the Host
allow-list that stops DNS rebinding, the Origin allow-list, API keys where keys are on, sent
as ``Authorization: Bearer``), every error in Ollama's shape ``{"error": "..."}``, the gateway's
request metrics, and the recorder's exchange of each generation (client "ollama"). A refusal
(401, 403, 404, 405) of any method is told in the log once per client and kind and recorded,
as at :8000."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from engines.errors import TraylmError
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
from engines.gateway.security import Guard
from engines.gateway.service import GatewayContext
from engines.ollama.errors import ollama_error
from engines.ollama.parts import OllamaParts
from engines.ollama.routes import SERVED, ollama_routes
from engines.ollama.shapes import BadRequest

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
RECORDED = frozenset({"/api/chat", "/api/generate", "/api/embed", "/api/embeddings"})
CLIENT = "ollama"
"""The recorder's client of the requests made here (shown as the Ollama API)."""


class Guarded:
    """The gateway's Guard for this port (its Host check compares the port): rebuilt only
    when the gateway's changes (keys, hosts, LAN sharing)."""

    def __init__(self, ctx: GatewayContext, port: Callable[[], int]) -> None:
        self._ctx, self._port = ctx, port
        self._of: tuple[Guard, int] | None = None
        self._guard: Guard | None = None

    @property
    def guard(self) -> Guard:
        now = (self._ctx.guard, self._port())
        if self._of != now or self._guard is None:
            self._guard = dataclasses.replace(now[0], port=now[1])
            self._of = now
        return self._guard


def refusal(guard: Guard, request: web.Request) -> web.StreamResponse | None:
    """What this port answers before any route: the gateway's refusals, in Ollama's shape."""
    if not guard.lan and not is_loopback(request.remote):
        return ollama_error(
            403,
            "this traylm serves only this computer: LAN sharing is off (turn it on with "
            "`traylm config set gateway.lan_sharing true` after `traylm keys add`)",
        )
    problem = guard.path_problem(request.raw_path)
    if problem:
        return ollama_error(400, problem)
    host = request.headers.get("Host")
    if not guard.host_ok(host):
        return ollama_error(
            403,
            f"Host {host!r} is not allowed (DNS-rebinding protection); use localhost or "
            "127.0.0.1, or add the name to gateway.allowed_hosts",
        )
    origin = request.headers.get("Origin")
    if not guard.origin_ok(origin):
        return ollama_error(
            403,
            f"Origin {origin!r} is not allowed; add it to gateway.allowed_origins to let that "
            "web page call traylm",
        )
    if request.method == "OPTIONS":
        if origin:
            return _cors(web.Response(status=204), origin, preflight=True)
        return ollama_error(403, "OPTIONS is only answered for an allowed Origin")
    if request.path != "/" and not guard.key_ok(
        request.headers.get("Authorization"), None, loopback=is_loopback(request.remote)
    ):
        return ollama_error(
            401,
            "missing or wrong API key: send 'Authorization: Bearer KEY' (set OLLAMA_API_KEY, "
            "or the app's API key field; keys are managed with `traylm keys`)",
        )
    return None


def _cors(resp: web.StreamResponse, origin: str, *, preflight: bool = False) -> web.StreamResponse:
    if resp.prepared:
        return resp
    resp.headers["Access-Control-Allow-Origin"] = origin
    resp.headers["Vary"] = "Origin"
    if preflight:
        resp.headers["Access-Control-Allow-Methods"] = "GET, POST, DELETE, OPTIONS"
        resp.headers["Access-Control-Allow-Headers"] = "Authorization, Content-Type"
        resp.headers["Access-Control-Max-Age"] = "600"
    return resp


def _exchange(
    ctx: GatewayContext, guard: Guard, request: web.Request, *, refused: bool = False
) -> Exchange | None:
    """The recorder's exchange of a model request here, as the gateway begins its own; with
    ``refused``, of any request this port refused (a wrong key on GET /api/tags)."""
    if ctx.exchanges is None:
        return None
    return begin(
        request,
        request[REQUEST_ID],
        ctx.settings.requests,
        guard,
        local=is_loopback(request.remote),
        client=CLIENT,
        model_route=refused or request.path in RECORDED,
    )


def ollama_middleware(ctx: GatewayContext, guarded: Guarded) -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        request[REQUEST_ID] = new_request_id()
        guard = guarded.guard
        exchange = _exchange(ctx, guard, request)
        try:
            resp = refusal(guard, request) or await _handled(request, handler)
        except asyncio.CancelledError:
            _count(ctx, request, exchange, 200 if request.get(REPLY_COMPLETE) else 499, None)
            raise
        origin = request.headers.get("Origin")
        if origin and guard.origin_ok(origin):
            resp = _cors(resp, origin)
        status = 499 if request.get(CLIENT_GONE) else resp.status
        body = resp.body if isinstance(resp, web.Response) else None
        refusals.note(request, resp)
        if exchange is None and resp.status in REFUSALS:
            exchange = _exchange(ctx, guard, request, refused=True)
        _count(ctx, request, exchange, status, body if isinstance(body, bytes) else None)
        return resp

    refusals = RefusalLog()
    return middleware


async def _handled(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except BadRequest as exc:
        return ollama_error(400, str(exc))
    except TraylmError as exc:
        return ollama_error(exc.http_status, exc.message)
    except web.HTTPNotFound:
        return ollama_error(
            404, f"no route {request.path}; traylm's Ollama API serves {', '.join(SERVED)}"
        )
    except web.HTTPMethodNotAllowed:
        return ollama_error(405, f"method {request.method} not allowed on {request.path}")
    except web.HTTPException as exc:
        return ollama_error(exc.status, exc.reason or "error")
    except Exception:  # boundary: never leak a traceback (or a path) to a client
        log.exception("unhandled error on %s %s", request.method, request.path)
        return ollama_error(500, "internal error (the daemon's log has the details)")


def _count(
    ctx: GatewayContext,
    request: web.Request,
    exchange: Exchange | None,
    status: int,
    body: bytes | None,
) -> None:
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "unmatched"
    if status >= 400:
        ctx.metrics.errors.inc(status=str(status))
    ctx.metrics.requests.inc(route=f"ollama {route}", status=str(status))
    if exchange is not None and ctx.exchanges is not None:
        exchange.answered(status, body)
        ctx.exchanges(exchange)


async def _request_id(request: web.Request, response: web.StreamResponse) -> None:
    rid = request.get(REQUEST_ID)
    if rid is not None:
        response.headers[REQUEST_ID_HEADER] = rid


def build_app(parts: OllamaParts, port: Callable[[], int]) -> web.Application:
    """Ollama's API app; ``port``: the port it serves on now (the Host check compares it)."""
    ctx = parts.gateway
    app = web.Application(
        middlewares=[ollama_middleware(ctx, Guarded(ctx, port))],
        client_max_size=ctx.settings.gateway.max_body_bytes,
    )
    app.router.add_routes(ollama_routes(parts))
    app.on_response_prepare.append(_request_id)
    return app
