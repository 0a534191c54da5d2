"""Pairing's routes: the control API on the gateway (this box's user) and the peer API on the
listener for paired boxes (the other boxes).

Control API (control token):
GET    /api/peers               PeersView (each paired box asked whether it is there)
POST   /api/peers/pairing       {expires_in_s?} → PairingCode; the listener opens
GET    /api/peers/pairing       PairingState
DELETE /api/peers/pairing       cancel → PairingState
POST   /api/peers/join          {address, code} → PeerInfo (pair with the box showing code)
DELETE /api/peers/{name}        Unpaired (here always, there when it answers)

Peer API (the listener; mutual TLS, every route but /peer/pair needs a pinned certificate):
POST   /peer/pair               the pairing exchange (service.accept_pairing)
GET    /peer/hello              {name, version}
POST   /peer/unpair             the calling box unpairs itself
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from engines import __version__
from engines.core.http import (
    Handler,
    json_body,
    ok,
    openai_error,
    query_text,
    refuse_unknown,
    traylm_errors,
)
from engines.errors import ConfigError
from engines.peers import tls
from engines.peers.service import PeersFeature
from engines.peers.store import Peer

PEERS: web.AppKey[PeersFeature] = web.AppKey("peers", PeersFeature)
"""``request.app[PEERS]``: pairing and the paired boxes (mounted by the daemon)."""

CALLER: web.RequestKey[Peer] = web.RequestKey("peer", Peer)
"""``request[CALLER]``: the paired box a peer-API request came from."""


def peers_routes() -> list[web.RouteDef]:
    return [
        web.get("/api/peers", traylm_errors(list_peers)),
        web.post("/api/peers/pairing", traylm_errors(begin_pairing)),
        web.get("/api/peers/pairing", traylm_errors(pairing_state)),
        web.delete("/api/peers/pairing", traylm_errors(cancel_pairing)),
        web.post("/api/peers/join", traylm_errors(join)),
        web.delete("/api/peers/{name}", traylm_errors(unpair)),
    ]


async def list_peers(request: web.Request) -> web.Response:
    check = query_text(request, "check", default="1", max_chars=5) != "0"
    return ok(await request.app[PEERS].view(check=check))


async def begin_pairing(request: web.Request) -> web.Response:
    body = await json_body(request, empty_ok=True)
    refuse_unknown(body, ("expires_in_s",))
    expires = body.get("expires_in_s")
    if expires is not None and (isinstance(expires, bool) or not isinstance(expires, int | float)):
        raise ConfigError("expires_in_s must be a number of seconds")
    return ok(await request.app[PEERS].begin_pairing(expires))


async def pairing_state(request: web.Request) -> web.Response:
    return ok(request.app[PEERS].pairing())


async def cancel_pairing(request: web.Request) -> web.Response:
    return ok(await request.app[PEERS].cancel_pairing())


async def join(request: web.Request) -> web.Response:
    body = await json_body(request)
    refuse_unknown(body, ("address", "code"))
    address, code = body.get("address"), body.get("code")
    if not isinstance(address, str) or not isinstance(code, str):
        raise ConfigError("give the other box's address and the code it shows (both text)")
    return ok(await request.app[PEERS].join(address, code))


async def unpair(request: web.Request) -> web.Response:
    return ok(await request.app[PEERS].unpair(request.match_info["name"]))


# --------------------------------------------------------------------------- the peer API


def peer_app(
    feature: PeersFeature, *, extend: Callable[[web.Application], None] | None = None
) -> web.Application:
    """The listener's application: only the peer API, only for paired boxes. ``extend`` adds
    the routes of the parts that talk to paired boxes (engines/multinode/routes.py), behind
    the same paired-only middleware."""
    app = web.Application(middlewares=[_paired_only], client_max_size=256 * 1024)
    app[PEERS] = feature
    app.router.add_post("/peer/pair", traylm_errors(pair))
    app.router.add_get("/peer/hello", traylm_errors(hello))
    app.router.add_post("/peer/unpair", traylm_errors(unpaired_by_peer))
    if extend is not None:
        extend(app)
    return app


@web.middleware
async def _paired_only(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every route but the pairing one: the client's certificate must be a pinned one (the TLS
    handshake already refused an unknown one; this refuses one unpaired since)."""
    if request.path == "/peer/pair":
        return await handler(request)
    feature = request.app[PEERS]
    ssl_object = request.transport.get_extra_info("ssl_object") if request.transport else None
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    peer = feature.by_fingerprint(tls.fingerprint_der(der)) if der else None
    if peer is None:
        return openai_error(
            403,
            f"this box is not paired with {feature.box_name}; pair them with `traylm pair` on "
            f"{feature.box_name} and `traylm pair ADDRESS CODE` on this one",
            type_="not_paired",
            code="not_paired",
        )
    feature.seen(peer)
    request[CALLER] = peer
    return await handler(request)


async def pair(request: web.Request) -> web.Response:
    feature = request.app[PEERS]
    feature.refuse_without_a_code()  # no code to match: the body is never read
    body = await json_body(request)
    return ok(await feature.accept_pairing(body, request.remote or ""))


async def hello(request: web.Request) -> web.Response:
    feature = request.app[PEERS]
    return ok({"name": feature.box_name, "version": __version__})


async def unpaired_by_peer(request: web.Request) -> web.Response:
    await request.app[PEERS].forget(request[CALLER])
    return ok({"unpaired": True})
