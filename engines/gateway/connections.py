"""The gateway's listening socket and what arrives on it before a request exists.

- ``ConnectionGate`` wraps every connection's protocol (aiohttp's request handler) and keeps
  the limits a slow or hostile client could otherwise break: at most ``max_connections`` open
  at once (past it the oldest connection still sending its first request head is closed for a
  new one, else new ones wait in the kernel's backlog: ``GatewaySite`` accepts only while
  there is room), a request head must arrive within ``header_timeout_s`` (slowloris),
  and without LAN sharing a peer that is not on this computer is refused at once. Idle
  keep-alive connections are aiohttp's to close (``keepalive_timeout``).
- ``Listener`` binds the port and moves it to another address while the daemon runs (LAN
  sharing turned on or off), and reports the sockets actually bound.
- Malformed HTTP (a port scanner, TLS spoken to a plain port) is answered 400 by aiohttp, which
  logs each one as an ERROR with a traceback: ``http_logger`` makes it one INFO line.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import ipaddress
import json
import logging
import socket
from collections.abc import Callable
from typing import cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

log = logging.getLogger(__name__)

HEAD_ENDS = (b"\r\n\r\n", b"\n\n")
OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
ACCEPT_RETRY_S = 0.5
CLIENT_SEND_BUFFER_BYTES = 1024 * 1024
"""The kernel's send buffer per client (it doubles it). Unbounded it grows to several MiB, and a
client that does not read holds its stream that much longer before it is noticed
(gateway.client_stall_timeout_s); much smaller, a client that only lags (a loaded machine)
makes the relay wait for it more often (64 KiB cost about 10 % of the gateway's throughput at
256 paced streams here)."""


@functools.lru_cache(maxsize=1024)
def is_loopback(host: str | None) -> bool:
    """True for 127.0.0.0/8, ::1 and IPv4-mapped loopback; False for anything else."""
    if not host:
        return False
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def _answer(status: str, message: str, type_: str) -> bytes:
    """A whole HTTP response written straight to the socket (no request was parsed). A refusal
    that a retry cannot change (403) says so (``x-should-retry: false``, which SDKs and Claude
    Code honour); the others ask to retry shortly."""
    body = json.dumps({"error": {"message": message, "type": type_, "param": None}}).encode()
    retry = "x-should-retry: false" if status.startswith("403") else "Retry-After: 1"
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
        f"\r\nConnection: close\r\n{retry}\r\n\r\n"
    ).encode() + body


class _Guarded(asyncio.Protocol):
    """One connection: aiohttp's protocol inside, the gate's checks around it. Every byte goes
    to aiohttp as it came; the gate only watches for the end of the first request head."""

    __slots__ = ("_admitted", "_gate", "_head_timer", "_inner", "_tail", "transport")

    def __init__(self, inner: asyncio.Protocol, gate: ConnectionGate) -> None:
        self._inner = inner
        self._gate = gate
        self._admitted = False
        self._head_timer: asyncio.TimerHandle | None = None
        self._tail = b""
        self.transport: asyncio.Transport | None = None

    @property
    def waiting_for_head(self) -> bool:
        return self._head_timer is not None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        if not self._gate.admit(self, transport):
            return
        self._admitted = True
        sock = transport.get_extra_info("socket")
        if sock is not None:  # a client that stops reading blocks the relay's writes soon
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, CLIENT_SEND_BUFFER_BYTES)
        loop = asyncio.get_running_loop()
        self._head_timer = loop.call_later(self._gate.header_timeout_s, self._head_timed_out)
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._head_timer is not None:
            seen = self._tail + data
            if any(end in seen for end in HEAD_ENDS):
                self._head_timer.cancel()
                self._head_timer, self._tail = None, b""
            else:
                self._tail = seen[-3:]
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self._gate.release(self)
        if self._admitted:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def close(self, answer: bytes = b"") -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            if answer:
                transport.write(answer)
            transport.close()

    def _head_timed_out(self) -> None:
        self._head_timer = None
        self._gate.timed_out_total += 1
        self.close(
            _answer(
                "408 Request Timeout",
                f"the request head took longer than {self._gate.header_timeout_s:g} s "
                "(gateway.header_timeout_s)",
                "timeout",
            )
        )


class ConnectionGate:
    """The limits every connection passes (see the module docstring). Live settings:
    ``configure`` changes them for new connections at once."""

    def __init__(self, *, max_connections: int, header_timeout_s: float, lan: bool) -> None:
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.lan = lan
        self._open: dict[_Guarded, None] = {}  # insertion order: oldest first
        self._room = asyncio.Event()
        self.refused_total = 0
        self.evicted_total = 0
        self.timed_out_total = 0
        self.foreign_total = 0

    def configure(self, *, max_connections: int, header_timeout_s: float, lan: bool) -> None:
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.lan = lan
        self._room.set()  # a higher cap: let a waiting accept loop look again

    @property
    def open(self) -> int:
        return len(self._open)

    def factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        return lambda: _Guarded(inner(), self)

    def admit(self, conn: _Guarded, transport: asyncio.Transport) -> bool:
        peer = transport.get_extra_info("peername")
        if not self.lan and not is_loopback(peer[0] if peer else None):
            self.foreign_total += 1
            conn.close(
                _answer(
                    "403 Forbidden",
                    "this traylm serves only this computer (LAN sharing is off)",
                    "forbidden",
                )
            )
            return False
        if len(self._open) >= self.max_connections and not self._evict_one():
            self.refused_total += 1
            conn.close(
                _answer(
                    "503 Service Unavailable",
                    f"the gateway has {len(self._open)} connections open "
                    "(gateway.max_connections); retry shortly",
                    "overloaded",
                )
            )
            return False
        self._open[conn] = None
        return True

    def release(self, conn: _Guarded) -> None:
        """Forget a closed connection."""
        self._open.pop(conn, None)
        if len(self._open) < self.max_connections:
            self._room.set()

    async def room(self) -> None:
        """Return once a new connection may be accepted: below the cap, or one is still
        sending its first request head (it is closed for the newcomer)."""
        while len(self._open) >= self.max_connections and not any(
            c.waiting_for_head for c in self._open
        ):
            self._room.clear()
            await self._room.wait()

    def _evict_one(self) -> bool:
        """Close the oldest connection that has not finished its first request head."""
        for conn in self._open:
            if conn.waiting_for_head:
                self._open.pop(conn)
                self.evicted_total += 1
                conn.close()
                return True
        return False

    def close_foreign(self) -> int:
        """LAN sharing was turned off: close every open connection from another computer."""
        foreign = [
            c
            for c in self._open
            if c.transport is not None
            and not is_loopback((c.transport.get_extra_info("peername") or ("",))[0])
        ]
        for conn in foreign:
            conn.close()
        return len(foreign)


class GatewaySite(web.BaseSite):
    """aiohttp's TCPSite with an accept loop of its own: a connection is accepted only while
    the gate has room for it (or one it may close instead), so a flood waits in the kernel's
    backlog instead of taking every descriptor the daemon has, and each accepted connection
    passes the gate."""

    __slots__ = (
        "_accepting",
        "_app_runner",
        "_gate",
        "_host",
        "_listen_backlog",
        "_port",
        "_sockets",
    )

    def __init__(
        self, runner: web.BaseRunner, host: str, port: int, *, gate: ConnectionGate, backlog: int
    ) -> None:
        super().__init__(runner, backlog=backlog)
        # its own references: BaseSite's are private to aiohttp
        self._app_runner, self._listen_backlog = runner, backlog
        self._host, self._port, self._gate = host, port, gate
        self._sockets: list[socket.socket] = []
        self._accepting: list[asyncio.Task[None]] = []

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._app_runner.server
        assert server is not None
        factory = self._gate.factory(server)
        self._sockets = await asyncio.to_thread(
            _listen, self._host, self._port, self._listen_backlog
        )
        self._accepting = [
            asyncio.create_task(self._accept(sock, factory), name=f"accept {self.name}")
            for sock in self._sockets
        ]

    async def stop(self) -> None:
        for task in self._accepting:
            task.cancel()
        for task in self._accepting:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for sock in self._sockets:
            sock.close()
        self._accepting, self._sockets = [], []
        await super().stop()

    async def _accept(self, sock: socket.socket, factory: Callable[[], asyncio.Protocol]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._gate.room()
            try:
                conn, _ = await loop.sock_accept(sock)
            except OSError as exc:
                if exc.errno in OUT_OF_RESOURCES:  # wait for descriptors to come back
                    log.warning("gateway cannot accept a connection: %s", exc.strerror)
                    await asyncio.sleep(ACCEPT_RETRY_S)
                elif sock.fileno() < 0:
                    return
                continue  # a client that gave up before the accept (ECONNABORTED)
            try:
                await loop.connect_accepted_socket(factory, conn)
            except OSError:
                conn.close()

    def addresses(self) -> list[str]:
        out = []
        for sock in self._sockets:
            host, port = sock.getsockname()[:2]
            out.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
        return out


def _listen(host: str, port: int, backlog: int) -> list[socket.socket]:
    """Listening sockets on every address ``host`` names (as asyncio's create_server binds)."""
    sockets: list[socket.socket] = []
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    try:
        for family, type_, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, type_, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(backlog)
            sock.setblocking(False)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


class Listener:
    """The gateway's port on one address at a time."""

    def __init__(
        self, runner: web.BaseRunner, *, port: int, gate: ConnectionGate, backlog: int = 1024
    ) -> None:
        self._runner, self.port, self._gate, self._backlog = runner, port, gate, backlog
        self._site: GatewaySite | None = None
        self.host = ""

    async def bind(self, host: str) -> None:
        """Listen on ``host``; OSError when the port cannot be bound there."""
        site = GatewaySite(self._runner, host, self.port, gate=self._gate, backlog=self._backlog)
        try:
            await site.start()
        except OSError:
            await site.stop()
            raise
        self._site, self.host = site, host

    async def rebind(self, host: str) -> None:
        """Move to ``host`` (open connections stay). The port is free for a moment in between
        (one address cannot take a port another listening socket of this process holds); if
        the new address cannot be bound, the old one is bound again and OSError raised."""
        old, old_host = self._site, self.host
        if old is not None:
            await old.stop()
            self._site = None
        try:
            await self.bind(host)
        except OSError:
            if old is not None:
                await self.bind(old_host)
            raise
        log.info("gateway now listens on %s", ", ".join(self.addresses()))

    async def unbind(self) -> None:
        """Stop listening (open connections stay until they end)."""
        site, self._site = self._site, None
        if site is not None:
            await site.stop()

    def addresses(self) -> list[str]:
        return self._site.addresses() if self._site is not None else []


class MalformedRequestFilter(logging.Filter):
    """Turns aiohttp's "Error handling request" traceback for a request it could not parse into
    one INFO line naming the peer and what was wrong. Errors of the gateway itself keep their
    level and traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            peer = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
            record.msg = "refused a malformed request from %s: %s"
            what = (exc.message or "").strip().splitlines()  # aiohttp adds the line and a caret
            record.args = (peer, what[0] if what else type(exc).__name__)
            record.exc_info, record.exc_text = None, None
        return True


def http_logger() -> logging.Logger:
    """The logger for aiohttp's request handlers (``AppRunner(logger=...)``), with the
    malformed-request filter."""
    logger = logging.getLogger("engines.gateway.http")
    if not any(isinstance(f, MalformedRequestFilter) for f in logger.filters):
        logger.addFilter(MalformedRequestFilter())
    return logger
