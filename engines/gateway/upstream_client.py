"""The relay's HTTP/1.1 client for plain-http upstreams: the engines on loopback, and attached
servers reached over http. Attached servers over https go through aiohttp's client.

Why a pool of its own rather than aiohttp's client for the engines: at one stream aiohttp's
client path (a ClientRequest, URL parsing, the connector, tracing hooks, the cookie jar, a
ClientResponse with a StreamReader) is most of what a relay adds to the time to first token;
tests/perf/gateway_bench.py --paced measures it. What this module writes and keeps is small:
- one write of bytes built from the method, the path and the headers;
- a pool of kept-alive connections per host, each dropped before the engine would drop it
  (uvicorn, which vLLM, SGLang and trtllm-serve run, closes idle ones after 5 s), and a
  request whose reused connection closes before any byte of its reply is sent once more on a
  new connection (the engine closed an idle connection as the request went out);
- a connect timeout; back-pressure (the engine's socket stops being read while the relay's
  reader is far behind); close: a reply not read to its end closes its connection, so the
  engine sees the client go and aborts the request.
Replies are parsed by llhttp (through httptools, the parser uvicorn uses), never by hand: a
reply with two Content-Lengths, or a length and chunked together, is malformed.
The errors subclass aiohttp's, so one ``except`` catches either client's:
- no connection → ``ClientConnectionError``;
- a reply broken off or malformed → ``ClientPayloadError`` (a malformed head: a
  ``ClientConnectionError``).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import socket
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import cast
from urllib.parse import quote, urlsplit

import aiohttp
import httptools
from multidict import CIMultiDict, CIMultiDictProxy

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024
"""An engine's status line and headers together: more is a malformed reply (llhttp itself sets
no bound, and httptools gathers each header's value)."""
HIGH_WATER = 256 * 1024
"""Unread body bytes at which the engine's socket stops being read, until the reader catches up."""
IDLE_S = 4.0
"""A kept-alive connection idle for longer is closed instead of reused: below the 5 s after which
uvicorn (vLLM, SGLang, trtllm-serve) closes an idle connection, so a request is not written into
a connection the engine is closing at that moment (the retry in ``request`` covers the rest)."""
URL_SAFE = "!#$%&'()*+,-./:;=?@[]^_`{|}~"
"""What stays as it is in a request target: escapes already made, and the delimiters."""


class EngineUnreachable(aiohttp.ClientConnectionError):
    """No connection to the upstream: refused, timed out, or closed before its reply began."""


class EngineBadReply(aiohttp.ClientConnectionError):
    """The upstream's status line or headers were not HTTP/1.x."""


class EngineBrokeOff(aiohttp.ClientPayloadError):
    """The upstream's reply body ended early or was malformed."""


class ClosedBeforeReply(EngineUnreachable):
    """A connection closed before any byte of the reply came (on a reused connection: the
    engine closed it as idle while the request went out, so the request may be sent again)."""


@dataclass(frozen=True)
class _Origin:
    """Where a base URL points: what the pool keys on and what each request writes."""

    host: str
    port: int
    host_header: str
    prefix: str  # the base URL's path, before every request's own


@functools.lru_cache(maxsize=256)
def _origin(base_url: str) -> _Origin:
    parts = urlsplit(base_url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"not a plain-http base URL: {base_url!r}")
    return _Origin(
        parts.hostname, parts.port or 80, parts.netloc.rpartition("@")[2], parts.path.rstrip("/")
    )


def _check_header(name: str, value: str) -> None:
    if "\r" in name or "\n" in name or ":" in name or "\r" in value or "\n" in value:
        raise ValueError(f"header {name!r} holds a line break or a colon: not sent to the engine")


def _request_head(
    method: str, base_url: str, path_qs: str, headers: Mapping[str, str], body: bytes
) -> tuple[_Origin, bytes]:
    origin = _origin(base_url)
    target = origin.prefix + path_qs
    if not target.isascii() or not target.isprintable() or " " in target:
        target = quote(target, safe=URL_SAFE)  # what aiohttp's client would send
    lines = [f"{method} {target} HTTP/1.1\r\nHost: {origin.host_header}\r\n"]
    for name, value in headers.items():
        _check_header(name, value)
        lines.append(f"{name}: {value}\r\n")
    if body or method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
        lines.append(f"Content-Length: {len(body)}\r\n")
    lines.append("\r\n")
    return origin, "".join(lines).encode("utf-8", "surrogateescape")  # a header's own bytes


class UpstreamClient:
    """Requests to upstreams, over kept-alive connections (plain http) or aiohttp (https).
    One per gateway; ``close`` when the gateway stops."""

    def __init__(self, *, idle_s: float = IDLE_S, tls: ssl.SSLContext | None = None) -> None:
        """``idle_s``: how long an idle connection is kept for reuse; ``tls``: what https
        upstreams are checked against (default: the system's CAs)."""
        self._idle_s = idle_s
        self._tls = tls
        self._idle: dict[_Origin, list[_Connection]] = {}
        self._https: aiohttp.ClientSession | None = None
        self._open: set[_Connection] = set()
        self.resent_total = 0
        """Requests sent once more because their reused connection closed before the reply."""

    async def request(
        self,
        method: str,
        base_url: str,
        path_qs: str,
        *,
        body: bytes,
        headers: Mapping[str, str],
        connect_timeout_s: float,
        tls: ssl.SSLContext | None = None,
    ) -> UpstreamReply | aiohttp.ClientResponse:
        """Send a request to ``base_url`` + ``path_qs`` and wait for the head of its reply. The
        caller reads the body and closes the reply (``close`` also when it read all of it).
        ``tls``: an https upstream's own context (a paired box's mutual TLS), else the
        client's."""
        if base_url.startswith("https:"):
            return await self._via_aiohttp(
                method, base_url + path_qs, body, headers, connect_timeout_s, tls
            )
        origin, head = _request_head(method, base_url, path_qs, headers, body)
        head_only = method == "HEAD"
        kept = self._take(origin)
        if kept is not None and kept.send(head, body, head_only=head_only):
            try:
                return await self._reply(origin, kept)
            except ClosedBeforeReply as exc:
                # the engine closed the idle connection as the request went out: it never
                # saw the request, which goes once more on a new connection
                self.resent_total += 1
                log.info(
                    "%s:%s closed a kept-alive connection (%s); request sent again on a new one",
                    origin.host,
                    origin.port,
                    exc,
                )
        conn = await self._connect(origin, connect_timeout_s)
        if not conn.send(head, body, head_only=head_only):
            raise EngineUnreachable(f"{origin.host}:{origin.port} closed the connection at once")
        return await self._reply(origin, conn)

    async def _reply(self, origin: _Origin, conn: _Connection) -> UpstreamReply:
        try:
            status, reply_headers = await conn.head()
        except BaseException:
            conn.discard()
            raise
        return UpstreamReply(self, origin, conn, status, reply_headers)

    def _take(self, origin: _Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.reusable and now - conn.idle_since < self._idle_s:
                return conn
            conn.discard()
        return None

    async def _connect(self, origin: _Origin, timeout_s: float) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout_s):
                _, conn = await loop.create_connection(
                    functools.partial(_Connection, self._open), origin.host, origin.port
                )
        except TimeoutError as exc:
            raise EngineUnreachable(
                f"no connection to {origin.host}:{origin.port} within {timeout_s:g} s"
            ) from exc
        except OSError as exc:
            raise EngineUnreachable(
                f"cannot connect to {origin.host}:{origin.port}: {exc.strerror or exc}"
            ) from exc
        return conn

    def _release(self, origin: _Origin, conn: _Connection) -> None:
        if not conn.reusable:
            conn.discard()
            return
        conn.idle_since = time.monotonic()
        if origin not in self._idle and len(self._idle) >= 32:  # engines come and go on new ports
            self._idle = {
                o: kept for o, kept in self._idle.items() if any(c.reusable for c in kept)
            }
        self._idle.setdefault(origin, []).append(conn)

    async def _via_aiohttp(
        self,
        method: str,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        connect_timeout_s: float,
        tls: ssl.SSLContext | None,
    ) -> aiohttp.ClientResponse:
        if self._https is None:
            connector = aiohttp.TCPConnector(limit=0, ssl=self._tls or True)
            self._https = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s, sock_read=None)
        # identity: the relay passes bodies through and drops Content-Encoding (a hop header),
        # so a compressed body would reach the client as bytes it cannot read
        sent = {"Accept-Encoding": "identity", **headers}
        return await self._https.request(
            method, url, data=body or None, headers=sent, timeout=timeout, ssl=tls or True
        )

    async def close(self) -> None:
        """Close every connection (idle or in use) and the https session."""
        for conn in list(self._open):
            conn.discard()
        self._idle.clear()
        if self._https is not None:
            await self._https.close()
            self._https = None


class UpstreamReply:
    """A reply whose head has come; the body is read with ``read`` or ``content.iter_any``
    (the names of aiohttp's ClientResponse, which the relay also reads)."""

    __slots__ = ("_client", "_conn", "_origin", "content", "headers", "status")

    def __init__(
        self,
        client: UpstreamClient,
        origin: _Origin,
        conn: _Connection,
        status: int,
        headers: CIMultiDictProxy[str],
    ) -> None:
        self._client, self._origin = client, origin
        self._conn: _Connection | None = conn
        self.status = status
        self.headers = headers
        self.content = _Body(conn)

    async def read(self) -> bytes:
        return b"".join([piece async for piece in self.content.iter_any()])

    def close(self) -> None:
        """Give the connection back when the whole reply was read, else close it (the engine
        sees its client go)."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if conn.finished:
            self._client._release(self._origin, conn)
        else:
            conn.discard()


class _Body:
    __slots__ = ("_conn",)

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn

    async def iter_any(self) -> AsyncIterator[bytes]:
        """Each piece of the body as it arrives (all that arrived since the last one)."""
        conn = self._conn
        while True:
            piece = await conn.next_piece()
            if not piece:
                return
            yield piece


class _Connection(asyncio.Protocol):
    """One kept-alive connection: writes a request, and feeds its reply's bytes to llhttp,
    whose callbacks (``on_*``) hand the head and each piece of the body to the reader."""

    def __init__(self, registry: set[_Connection]) -> None:
        self._registry = registry
        self._transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self._parser: httptools.HttpResponseParser | None = None  # one per reply
        self._headers: CIMultiDict[str] = CIMultiDict()
        self._status = 0
        self._head: asyncio.Future[tuple[int, CIMultiDictProxy[str]]] | None = None
        self._head_only = False
        self._until_close = False  # the body lasts until the connection closes
        self._received = 0  # bytes of the reply so far
        self._done = True  # the reply is complete (or none was asked for)
        self._keep_alive = True
        self._pieces: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._error: Exception | None = None
        self._closed = False
        self.idle_since = 0.0

    # -- the pool's view

    @property
    def finished(self) -> bool:
        """The whole reply was read by its reader."""
        return self._done and not self._pieces

    @property
    def reusable(self) -> bool:
        return self.finished and self._keep_alive and not self._closed

    def discard(self) -> None:
        self._closed = True
        self._registry.discard(self)
        if self._transport is not None:
            self._transport.close()

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._registry.add(self)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._registry.discard(self)
        if not self._done:
            why = f": {exc}" if exc else ""
            if self._head is not None and not self._head.done():
                if self._received:
                    self._fail(EngineUnreachable(f"the engine closed the connection mid-head{why}"))
                else:
                    self._fail(
                        ClosedBeforeReply(f"the engine closed the connection before its reply{why}")
                    )
                return
            if not self._until_close:
                self._fail(EngineBrokeOff(f"the engine closed the connection mid-reply{why}"))
                return
            self._done = True  # a body that lasts until the connection closes: its end
        self._wake()

    def data_received(self, data: bytes) -> None:
        parser = self._parser
        if self._done or parser is None:  # bytes nobody asked for: the connection is not trusted
            self._keep_alive = False
            return
        self._received += len(data)
        try:
            parser.feed_data(data)
            if self._received > MAX_HEAD_BYTES and not self._head_read:
                raise httptools.HttpParserError(f"the headers over {MAX_HEAD_BYTES} bytes")
        except httptools.HttpParserError as exc:
            self._keep_alive = False
            if self._done:  # more after a whole reply: the reply stands, the connection goes
                self.discard()
                return
            self._fail(
                EngineBrokeOff(f"the engine's reply body is malformed: {exc}")
                if self._head_read
                else EngineBadReply(f"the engine's reply head is not HTTP/1.x: {exc}")
            )
            self.discard()
            return
        if self._buffered > HIGH_WATER and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()
        self._wake()

    @property
    def _head_read(self) -> bool:
        return self._head is not None and self._head.done()

    # -- llhttp's callbacks (inside feed_data)

    def on_message_begin(self) -> None:
        if self._done:  # a second reply to one request: nothing of it is read
            self._keep_alive = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.add(name.decode("latin-1"), value.decode("latin-1"))

    def on_headers_complete(self) -> None:
        parser = self._parser
        assert parser is not None
        status = parser.get_status_code()
        if 100 <= status < 200 or self._done:  # informational (100 Continue): the head follows
            self._headers = CIMultiDict()
            return
        headers, self._headers = self._headers, CIMultiDict()
        self._status = status
        self._keep_alive = parser.should_keep_alive()
        self._until_close = (
            "Content-Length" not in headers
            and "Transfer-Encoding" not in headers
            and status not in (204, 304)
        )
        if self._until_close:
            self._keep_alive = False
        head = self._head
        if head is not None and not head.done():
            head.set_result((status, CIMultiDictProxy(headers)))
        if self._head_only:  # the reply to HEAD has no body, whatever its length says
            self._done, self._keep_alive = True, False

    def on_body(self, body: bytes) -> None:
        if not self._done:
            self._pieces.append(body)
            self._buffered += len(body)

    def on_message_complete(self) -> None:
        if 100 <= self._status_now() < 200:
            return
        self._done = True

    def _status_now(self) -> int:
        return self._parser.get_status_code() if self._parser is not None else 0

    # -- the request's side

    def send(self, head: bytes, body: bytes, *, head_only: bool) -> bool:
        """Write a request; False (nothing written) when the connection already closed."""
        transport = self._transport
        if transport is None or self._closed or transport.is_closing():
            self.discard()
            return False
        self._parser = httptools.HttpResponseParser(self)
        self._headers = CIMultiDict()
        self._head_only, self._keep_alive, self._until_close = head_only, True, False
        self._done, self._received, self._error = False, 0, None
        self._head = self._loop.create_future()
        if len(body) <= 16384:
            transport.write(head + body)
        else:
            transport.write(head)
            transport.write(body)
        return True

    async def head(self) -> tuple[int, CIMultiDictProxy[str]]:
        assert self._head is not None
        return await self._head

    async def next_piece(self) -> bytes:
        """The body bytes that arrived since the last call; b"" at its end."""
        while not self._pieces:
            if self._error is not None:
                raise self._error
            if self._done:
                return b""
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        pieces = self._pieces
        piece = pieces.popleft() if len(pieces) == 1 else b"".join(pieces)
        pieces.clear()
        self._buffered = 0
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()
        return piece

    def _fail(self, exc: Exception) -> None:
        self._error = exc
        head = self._head
        if head is not None and not head.done():
            head.set_exception(exc)
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
