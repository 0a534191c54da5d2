"""The relay's HTTP/1.1 client for plain-http upstreams: the engines on loopback, and attached
servers reached over http. Attached servers over https go through aiohttp's client.

Why not aiohttp's client for the engines. At one stream its request path is most of what a
relay adds to the time to first token. It builds a ClientRequest and parses the URL, takes a
connection through the connector, runs the tracing hooks and the cookie jar, and makes a
ClientResponse with a StreamReader. tests/perf/gateway_bench.py --paced measures the difference.
Here a request is:
- one write of bytes built from the method, the path and the headers;
- one parse of the head, when it has all come;
- a chunk decoder that hands each piece of the body to its reader as it arrives.

What the relay needs is all here:
- a pool of kept-alive connections per host;
- a connect timeout;
- bodies that are chunked, have a length, or last until the connection closes;
- back-pressure: the engine's socket stops being read while the relay's reader is far behind;
- close: a reply not read to its end closes its connection, so the engine sees the client go
  and aborts the request.
The errors subclass aiohttp's, so one ``except`` catches either client's:
- no connection → ``ClientConnectionError``;
- a reply broken off or malformed → ``ClientPayloadError`` (a malformed head: a
  ``ClientConnectionError``).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import socket
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import cast
from urllib.parse import quote, urlsplit

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy

MAX_HEAD_BYTES = 64 * 1024
"""An engine's status line and headers together: more is a malformed reply."""
MAX_CHUNK_LINE = 1024
"""A chunk-size line (hex size and extensions)."""
HIGH_WATER = 256 * 1024
"""Unread body bytes at which the engine's socket stops being read, until the reader catches up."""
IDLE_S = 30.0
"""A kept-alive connection idle for longer is closed instead of reused (engines close theirs
sooner: vLLM's server after 5 s, and the pool sees that close as it happens)."""
NO_BODY_STATUS = frozenset({204, 304})
URL_SAFE = "!#$%&'()*+,-./:;=?@[]^_`{|}~"
"""What stays as it is in a request target: escapes already made, and the delimiters."""


class EngineUnreachable(aiohttp.ClientConnectionError):
    """No connection to the upstream: refused, timed out, or closed before its reply began."""


class EngineBadReply(aiohttp.ClientConnectionError):
    """The upstream's status line or headers were not HTTP/1.x."""


class EngineBrokeOff(aiohttp.ClientPayloadError):
    """The upstream's reply body ended early or was malformed."""


class _Malformed(Exception):
    """What the parser found wrong (data_received tells whose reply: head or body)."""


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


@dataclass(frozen=True)
class Sent:
    """A request written to an upstream, its reply not read yet."""

    origin: _Origin
    conn: _Connection


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
    return origin, "".join(lines).encode("utf-8")


class UpstreamClient:
    """Requests to upstreams, over kept-alive connections (plain http) or aiohttp (https).
    One per gateway; ``close`` when the gateway stops."""

    def __init__(self, *, idle_s: float = IDLE_S, tls: ssl.SSLContext | None = None) -> None:
        """``tls``: what https upstreams are checked against (default: the system's CAs)."""
        self._idle_s = idle_s
        self._tls = tls
        self._idle: dict[_Origin, list[_Connection]] = {}
        self._https: aiohttp.ClientSession | None = None
        self._open: set[_Connection] = set()

    async def request(
        self,
        method: str,
        base_url: str,
        path_qs: str,
        *,
        body: bytes,
        headers: Mapping[str, str],
        connect_timeout_s: float,
    ) -> UpstreamReply | aiohttp.ClientResponse:
        """Send a request to ``base_url`` + ``path_qs`` and wait for the head of its reply. The
        caller reads the body and closes the reply (``close`` also when it read all of it)."""
        if base_url.startswith("https:"):
            return await self._via_aiohttp(
                method, base_url + path_qs, body, headers, connect_timeout_s
            )
        origin, head = _request_head(method, base_url, path_qs, headers, body)
        sent = self._send_kept(origin, head, body, method)
        if sent is None:
            conn = await self._connect(origin, connect_timeout_s)
            if not conn.send(head, body, head_only=method == "HEAD"):
                raise EngineUnreachable(
                    f"{origin.host}:{origin.port} closed the connection at once"
                )
            sent = Sent(origin, conn)
        return await self.reply(sent)

    def send_now(
        self, method: str, base_url: str, path_qs: str, *, body: bytes, headers: Mapping[str, str]
    ) -> Sent | None:
        """Write a request to a plain-http upstream at once, without awaiting anything, on a
        kept-alive connection; None when none is idle (``request`` then connects). ``reply``
        waits for the head of its reply."""
        origin, head = _request_head(method, base_url, path_qs, headers, body)
        return self._send_kept(origin, head, body, method)

    async def reply(self, sent: Sent) -> UpstreamReply:
        """The reply to a request ``send_now`` (or ``request``) wrote, once its head came."""
        try:
            status, reply_headers = await sent.conn.head()
        except BaseException:
            sent.conn.discard()
            raise
        return UpstreamReply(self, sent.origin, sent.conn, status, reply_headers)

    def _send_kept(self, origin: _Origin, head: bytes, body: bytes, method: str) -> Sent | None:
        conn = self._take(origin)
        if conn is None or not conn.send(head, body, head_only=method == "HEAD"):
            return None  # none idle, or it closed while idle and nothing was sent
        return Sent(origin, conn)

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
    ) -> aiohttp.ClientResponse:
        if self._https is None:
            connector = aiohttp.TCPConnector(limit=0, ssl=self._tls or True)
            self._https = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s, sock_read=None)
        # identity: the relay passes bodies through and drops Content-Encoding (a hop header),
        # so a compressed body would reach the client as bytes it cannot read
        sent = {"Accept-Encoding": "identity", **headers}
        return await self._https.request(
            method, url, data=body or None, headers=sent, timeout=timeout
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

    def stream_to(self, sink: Callable[[bytes], None]) -> None:
        """Hand each piece of the body to ``sink`` from now on, as it arrives (in the
        connection's callback, with no task in between); what came already goes first.
        ``until_end`` then waits for the end. ``pause_reading`` holds the engine back while
        the sink's own reader lags."""
        assert self._conn is not None
        self._conn.stream_to(sink)

    async def until_end(self) -> None:
        """Wait until the whole body went to the sink; raises as ``iter_any`` would."""
        assert self._conn is not None
        while await self._conn.next_piece():
            pass

    def pause_reading(self) -> None:
        if self._conn is not None:
            self._conn.pause(True)

    def resume_reading(self) -> None:
        if self._conn is not None:
            self._conn.pause(False)

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


def _line_end(data: bytes, pos: int, end: bytes, limit: int, what: str) -> int:
    """Where ``end`` is in ``data`` from ``pos``, or -1 while more may come (_Malformed once
    more than ``limit`` bytes came without it)."""
    cut = data.find(end, pos)
    if cut < 0 and len(data) - pos > limit:
        raise _Malformed(f"{what} over {limit} bytes without an end")
    return cut


# parser states
_HEAD, _SIZE, _DATA, _DATA_END, _TRAILER, _LENGTH, _TO_CLOSE, _DONE = range(8)


class _Connection(asyncio.Protocol):
    """One kept-alive connection: sends requests and parses their replies as bytes arrive."""

    def __init__(self, registry: set[_Connection]) -> None:
        self._registry = registry
        self._transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self._state = _DONE
        self._buf = bytearray()
        self._left = 0  # bytes left in the current chunk, or of a Content-Length body
        self._head_only = False
        self._keep_alive = True
        self._head: asyncio.Future[tuple[int, CIMultiDictProxy[str]]] | None = None
        self._pieces: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._error: Exception | None = None
        self._closed = False
        self._sink: Callable[[bytes], None] | None = None
        self.idle_since = 0.0

    # -- the pool's view

    @property
    def finished(self) -> bool:
        """The whole reply was read by its reader."""
        return self._state == _DONE and not self._pieces

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
        if self._state == _TO_CLOSE:  # a body that lasts until the connection closes
            self._state = _DONE
        elif self._state != _DONE:
            why = f": {exc}" if exc else ""
            if self._state == _HEAD:
                self._fail(
                    EngineUnreachable(f"the engine closed the connection before its reply{why}")
                )
            else:
                self._fail(EngineBrokeOff(f"the engine closed the connection mid-reply{why}"))
            return
        self._wake()

    def data_received(self, data: bytes) -> None:
        if self._state == _DONE:  # bytes nobody asked for: the connection cannot be trusted
            self._keep_alive = False
            return
        try:
            self._parse(data)
        except _Malformed as exc:
            self._keep_alive = False
            head_read = self._head is not None and self._head.done()
            self._fail(
                EngineBadReply(f"the engine's reply head is not HTTP/1.x: {exc}")
                if not head_read
                else EngineBrokeOff(f"the engine's reply body is malformed: {exc}")
            )
            if self._transport is not None:
                self._transport.close()
            return
        if self._buffered > HIGH_WATER and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()
        self._wake()

    # -- the request's side

    def send(self, head: bytes, body: bytes, *, head_only: bool) -> bool:
        """Write a request; False (nothing written) when the connection already closed."""
        transport = self._transport
        if transport is None or self._closed or transport.is_closing():
            self.discard()
            return False
        self._state, self._head_only, self._keep_alive = _HEAD, head_only, True
        self._buf.clear()
        self._error, self._sink = None, None
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
            if self._state == _DONE:
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

    def stream_to(self, sink: Callable[[bytes], None]) -> None:
        if self._pieces:
            sink(b"".join(self._pieces))
            self._pieces.clear()
            self._buffered = 0
        self._sink = sink
        self.pause(False)

    def pause(self, paused: bool) -> None:
        if paused != self._paused and self._transport is not None and not self._closed:
            self._paused = paused
            if paused:
                self._transport.pause_reading()
            else:
                self._transport.resume_reading()

    # -- parsing

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

    def _body(self, piece: bytes) -> None:
        if piece:
            if self._sink is not None:
                self._sink(piece)
                return
            self._pieces.append(piece)
            self._buffered += len(piece)

    def _parse(self, data: bytes) -> None:
        """Advance through ``data`` (after what an earlier read left unparsed); raises
        _Malformed. The usual read is one whole chunk: one find, one int, one slice."""
        if self._buf:
            data = bytes(self._buf) + data
            self._buf.clear()
        state, pos, end = self._state, 0, len(data)
        while pos < end:
            if state == _SIZE:
                cut = _line_end(data, pos, b"\r\n", MAX_CHUNK_LINE, "a chunk-size line")
                if cut < 0:
                    break
                size_text = data[pos:cut].split(b";", 1)[0].strip()
                if not size_text or size_text.strip(b"0123456789abcdefABCDEF"):
                    raise _Malformed(f"a bad chunk size {size_text[:20]!r}")
                self._left = int(size_text, 16)
                pos = cut + 2
                state = _DATA if self._left else _TRAILER
            elif state == _DATA:
                take = min(self._left, end - pos)
                self._body(data[pos : pos + take] if pos or take < end else data)
                pos += take
                self._left -= take
                if self._left:
                    break
                state = _DATA_END
            elif state == _DATA_END:
                if end - pos < 2:
                    break
                if data[pos : pos + 2] != b"\r\n":
                    raise _Malformed("a chunk that does not end with CRLF")
                pos += 2
                state = _SIZE
            elif state == _HEAD:
                cut = _line_end(data, pos, b"\r\n\r\n", MAX_HEAD_BYTES, "the headers")
                if cut < 0:
                    break
                state = self._on_head(data[pos:cut])
                pos = cut + 4
            elif state == _TRAILER:
                cut = _line_end(data, pos, b"\r\n", MAX_HEAD_BYTES, "the trailer")
                if cut < 0:
                    break
                state = _DONE if cut == pos else _TRAILER
                pos = cut + 2
            elif state == _LENGTH:
                take = min(self._left, end - pos)
                self._body(data[pos : pos + take])
                pos += take
                self._left -= take
                if not self._left:
                    state = _DONE
            elif state == _TO_CLOSE:
                self._body(data[pos:] if pos else data)
                pos = end
            else:  # _DONE, and more bytes: the connection cannot be trusted again
                self._keep_alive = False
                pos = end
        self._state = state
        if pos < end:
            self._buf += data[pos:]

    def _on_head(self, raw: bytes) -> int:
        """Parse a status line and headers; the state the body starts in."""
        text = raw.decode("utf-8", "surrogateescape")
        lines = text.split("\r\n")
        status_line = lines[0].split(" ", 2)
        if len(status_line) < 2 or not status_line[0].startswith("HTTP/1."):
            raise _Malformed(f"status line {lines[0][:60]!r}")
        version, code = status_line[0], status_line[1]
        if len(code) != 3 or not code.isdigit() or not 100 <= int(code) <= 599:
            raise _Malformed(f"status {code[:20]!r}")
        status = int(code)
        headers: CIMultiDict[str] = CIMultiDict()
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon or not name or name != name.strip():
                raise _Malformed(f"header line {line[:60]!r}")
            headers.add(name, value.strip(" \t"))
        if 100 <= status < 200:  # informational (100 Continue): the real head follows
            return _HEAD
        connection = headers.get("Connection", "").lower()
        self._keep_alive = "close" not in connection and (
            version != "HTTP/1.0" or "keep-alive" in connection
        )
        head = self._head
        if head is not None and not head.done():
            head.set_result((status, CIMultiDictProxy(headers)))
        if self._head_only or status in NO_BODY_STATUS:
            return _DONE
        if "chunked" in headers.get("Transfer-Encoding", "").lower():
            return _SIZE
        length = headers.get("Content-Length")
        if length is not None:
            if not length.isdigit():
                raise _Malformed(f"Content-Length {length[:20]!r}")
            self._left = int(length)
            return _LENGTH if self._left else _DONE
        self._keep_alive = False
        return _TO_CLOSE
