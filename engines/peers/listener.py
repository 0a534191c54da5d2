"""Where this box listens for paired boxes: an aiohttp site of its own (TLS, its own app),
opened and closed one at a time, and the addresses other boxes may reach it at."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import socket
import ssl
from collections.abc import Callable

import psutil
from aiohttp import web

from engines.errors import PeerError
from engines.peers import tls

log = logging.getLogger(__name__)


def join_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def lan_addresses() -> list[str]:
    """This machine's IPv4 addresses other boxes may reach (not loopback or link-local)."""
    found = []
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET:
                ip = ipaddress.IPv4Address(a.address)
                if not (ip.is_loopback or ip.is_link_local):
                    found.append(a.address)
    return sorted(found)


def host_name() -> str:
    """The host name made a valid box name."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname()).strip("-._")[:64]
    return name or "traylm"


class PeerListener:
    """The peer listener's socket. ``address`` is "" while closed."""

    def __init__(self) -> None:
        self._runner: web.AppRunner | None = None
        self._ctx: ssl.SSLContext | None = None
        self._lock = asyncio.Lock()  # one open or close at a time
        self.address = ""

    async def open(
        self, app: Callable[[], web.Application], ctx: ssl.SSLContext, host: str, port: int
    ) -> None:
        """Serve ``app()`` on host:port with ``ctx`` unless already open; PeerError when the
        port cannot be bound."""
        async with self._lock:
            if self._runner is not None:
                return
            runner = web.AppRunner(
                app(), access_log=None, shutdown_timeout=1.0, handler_cancellation=True
            )
            await runner.setup()
            try:
                await web.TCPSite(runner, host, port, ssl_context=ctx, reuse_address=True).start()
            except OSError as exc:
                await runner.cleanup()
                raise PeerError(
                    f"cannot listen for paired boxes on {join_address(host, port)} "
                    f"({exc.strerror or exc}); free that port, or choose another with "
                    "`traylm config set peers.port N` (on both boxes' addresses)"
                ) from None
            self._runner, self._ctx, self.address = runner, ctx, join_address(host, port)
            log.info("listening for paired boxes on %s (mutual TLS)", self.address)

    def trust(self, cert_pem: str) -> None:
        """A newly pinned certificate, for the handshakes from now on."""
        if self._ctx is not None:
            tls.trust(self._ctx, [cert_pem])

    async def close(self) -> None:
        async with self._lock:
            runner, self._runner, self._ctx = self._runner, None, None
            if runner is not None:
                log.info("stopped listening for paired boxes on %s", self.address)
                self.address = ""
                await runner.cleanup()
