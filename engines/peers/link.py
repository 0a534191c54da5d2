"""HTTP to a paired box: mutual TLS, this box's certificate presented, only the peer's pinned
certificate trusted (the peer features talk to peers through ``open_session``).

aiohttp's ``Fingerprint`` cannot carry a client certificate (aiohttp pairs it with its own
unverified context), so the pin is the context's trust store: it holds the one pinned
certificate, and the fingerprint was checked against it when it was stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Any

import aiohttp
import yarl

from engines.errors import ConfigError, PairingRefused, PeerError, PeerUnreachable
from engines.peers import tls
from engines.peers.store import Peer


def base_url(address: str) -> yarl.URL:
    return yarl.URL(f"https://{address}")


def split_address(address: str, default_port: int) -> tuple[str, int]:
    """``host``, ``host:port``, ``[v6]:port`` → (host, port); ConfigError says the form."""
    try:
        url = yarl.URL(f"https://{address.strip()}")
        host, port = url.host, url.explicit_port
    except ValueError:
        host, port = None, None
    if not host or url.path not in ("", "/") or url.user or url.query_string:
        raise ConfigError(
            f"{address!r} is not a box's address: give HOST or HOST:PORT (e.g. 192.168.1.20 or "
            "192.168.1.20:8471)"
        )
    return host, port or default_port


def open_session(ctx: ssl.SSLContext, peer: Peer, timeout_s: float) -> aiohttp.ClientSession:
    """A session to ``peer`` (base URL its address); ``ctx``: ``tls.client_context`` of this
    box's identity and the peer's pinned certificate. Close it."""
    return aiohttp.ClientSession(
        base_url=base_url(peer.address),
        connector=aiohttp.TCPConnector(ssl=ctx, limit=8),
        timeout=aiohttp.ClientTimeout(total=timeout_s, sock_connect=min(timeout_s, 3.0)),
    )


def explain(peer: Peer, exc: BaseException) -> PeerError:
    """A failed request to ``peer`` as an error that names the box and the fix."""
    where = f"box {peer.name!r} at {peer.address}"
    again = f"`traylm unpair {peer.name}` and pair the boxes again (`traylm pair`)"
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return PeerError(
            f"{where} presented a certificate that is not the one paired (expected "
            f"{tls.shown(peer.fingerprint)[:19]}...): its identity changed (reinstalled, or its "
            f"data folder reset), or another machine answers at that address; if it is really "
            f"{peer.name}, {again}"
        )
    if isinstance(exc, aiohttp.ClientConnectorError):
        return PeerUnreachable(
            f"{where} is not reachable ({exc.os_error.strerror or exc}); is "
            "its daemon running and is the address still right?"
        )
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError):
        return PeerError(
            f"{where} refused this box's certificate: it no longer has this box paired, or this "
            f"box's identity changed; {again}"
        )
    if isinstance(exc, TimeoutError):
        return PeerUnreachable(f"{where} did not answer in time; is it overloaded or asleep?")
    return PeerUnreachable(f"{where}: {type(exc).__name__}: {exc}")


# --------------------------------------------------------------------------- pairing


async def first_contact(host: str, port: int, where: str, timeout_s: float) -> bytes:
    """The certificate the box at host:port shows (TLS without verification)."""
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(
                host, port, ssl=tls.client_context(None, None)
            )
    except (OSError, TimeoutError) as exc:
        raise PeerUnreachable(
            f"no traylm box answers at {where} ({getattr(exc, 'strerror', None) or 'no answer'}"
            "); run `traylm pair` on it first (it listens only while pairing or paired) and "
            "check the address and port (peers.port)"
        ) from None
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    if not der:
        raise PeerError(f"the box at {where} showed no certificate; is it a traylm box?")
    return bytes(der)


async def post_pairing(
    where: str, ctx: ssl.SSLContext, body: dict[str, Any], timeout_s: float
) -> dict[str, Any]:
    """The pairing request to the box at ``where``; its answer, or the error it refused with."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.post(base_url(where) / "peer/pair", json=body, ssl=ctx) as resp,
        ):
            data = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise PeerUnreachable(
            f"the box at {where} did not complete the pairing ({type(exc).__name__}); try again"
        ) from None
    except ValueError:
        raise PeerError(
            f"the box at {where} answered something that is not traylm's pairing (HTTP "
            f"{resp.status}); is that address a traylm box's peers.port?"
        ) from None
    if not isinstance(data, dict):
        raise PeerError(f"the box at {where} gave a malformed pairing answer")
    if resp.status != 200:
        error = data.get("error")
        message = error.get("message") if isinstance(error, dict) else None
        kind = PairingRefused if resp.status == 403 else PeerError
        raise kind(f"the box at {where} refused the pairing: {message or resp.status}")
    return data
