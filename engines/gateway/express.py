"""The express lane: streamed chat and completion requests for a model that is ready, served
straight from the connection's bytes, without aiohttp's request machinery.

At one stream, aiohttp's server path (its parser, the request object, a task, the router, the
response writer) is most of what the gateway adds to the time to first token; a relay of bare
protocols adds half as much (tests/perf/gateway_bench.py --paced). The lane is that relay with
every check of the full path. A request takes it only when all of these hold at once:
- its bytes are exactly one whole request: ``POST /v1/chat/completions`` or ``/v1/completions``,
  HTTP/1.1, plain header lines, a ``Content-Length`` body; no ``Transfer-Encoding``,
  ``Expect``, ``Upgrade``, ``Origin`` or chat-reply header, no header twice;
- the guard lets it through as the middleware would (this computer, Host, API key);
- its JSON passes ``check_openai`` and asks for ``"stream": true``, without Ollama's
  ``keep_alive``;
- the gateway is not paused, the model is ready on a local engine whose capabilities are known
  and serve the request (route, tools), and that engine's admission has a free slot now.
Anything else goes to aiohttp, the same bytes; so every refusal, error shape and slow path stays
in one place (app.py, routes.py, forward.py). A kept-alive connection moves between the two at
request boundaries: the lane sees a request on a connection aiohttp served before when aiohttp
waits for its next one with nothing in progress (connections.py ``_Guarded._lend``).

Once taken, the lane answers everything itself, as the full path would: the engine's stream as
chunked SSE (the status line and headers leave with the first event, and each event is written
from the engine connection's callback, with no task in between), the engine's error replies
explained (capabilities.py), a 502 when it cannot be reached, an error event when it breaks off
or the supervisor ends it; usage, metrics, flows (the supervisor's hang check, the stalled-client
sweep) and admission as for any relayed request. A client that goes away aborts the engine's
request. Kept-alive connections close after ``gateway.keepalive_timeout_s`` idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any

import aiohttp
from aiohttp import web

from engines.gateway.admission import Admission
from engines.gateway.capabilities import Capabilities, explain_engine_error, serve_problem
from engines.gateway.checks import check_openai
from engines.gateway.connections import LaneConnection, OpenConnection, is_loopback
from engines.gateway.proxy import (
    CLIENT_CLOSED_REQUEST,
    Relayed,
    Upstream,
    broke_off_message,
    engine_answer,
    log_broke_off,
    stream_headers,
    unreachable,
)
from engines.gateway.service import GatewayContext
from engines.gateway.shapes import INTERNAL_ERROR
from engines.gateway.sse import count_usage, sse_error
from engines.gateway.upstream_client import Sent, UpstreamReply
from engines.http import openai_error, parse_json_body
from engines.traffic import ENGINE_ERROR, Flow

log = logging.getLogger(__name__)

EXPRESS_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions"})
MAX_HEAD_BYTES = 16 * 1024
"""A longer request head goes to aiohttp."""
_NOT_HERE = frozenset(
    {
        "transfer-encoding",
        "expect",
        "upgrade",
        "origin",
        "content-encoding",
        "x-traylm-chat-reply",
        "x-traylm-token",
    }
)
"""Headers that send a request to aiohttp (CORS, chunked or compressed bodies, 100-continue,
the chat window's replies)."""
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_FINAL_CHUNK = b"0\r\n\r\n"


@dataclass(frozen=True)
class _Head:
    path: str
    fields: dict[str, str]
    """Header values by lower-case name (each name once)."""
    length: int
    close: bool
    """The client asked for ``Connection: close``."""


def parse_head(raw: bytes) -> _Head | None:
    """The head of a request the lane may take (without its blank line), or None."""
    if not raw.isascii():
        return None
    lines = raw.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or parts[0] != b"POST" or parts[2] != b"HTTP/1.1":
        return None
    path = parts[1].decode()
    if path not in EXPRESS_ROUTES:  # other routes, and any query string: aiohttp's
        return None
    fields: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name) or _CONTROL.search(value):
            return None
        key = name.decode().lower()
        if key in fields or key in _NOT_HERE:
            return None
        fields[key] = value.strip(b" \t").decode()
    length = fields.get("content-length", "")
    if not length.isdigit() or len(length) > 12:
        return None
    connection = fields.get("connection", "").lower()
    return _Head(path, fields, int(length), "close" in connection)


@dataclass(frozen=True)
class _Request:
    head: _Head
    body: bytes
    model: str
    upstream: Upstream
    admission: Admission
    caps: Capabilities


class ExpressLane:
    """The lane for the gateway's connections (``ConnectionGate.lane``)."""

    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx
        self.served = ctx.registry.counter(
            "traylm_express_requests_total",
            "Streamed requests served by the gateway's express lane (the rest go through "
            "its full path).",
        )
        self._running: set[asyncio.Task[Any]] = set()

    def connection(self, conn: OpenConnection) -> LaneConnection | None:
        return _Connection(self, conn) if self.ctx.settings.gateway.express_lane else None

    def admit(self, head: _Head, body: bytes, peer: str | None) -> _Request | None:
        """The request when the lane may serve it, else None (aiohttp serves it). A request
        it takes holds an admission slot from here."""
        ctx = self.ctx
        guard = ctx.guard
        fields = head.fields
        if not guard.lan and not is_loopback(peer):
            return None
        if not guard.host_ok(fields.get("host")) or not guard.key_ok(
            fields.get("authorization"), fields.get("x-api-key")
        ):
            return None
        payload, _ = parse_json_body(body)
        if payload is None or payload.get("stream") is not True or "keep_alive" in payload:
            return None
        if check_openai(payload, ctx.settings.gateway) is not None or ctx.pause is not None:
            return None
        model: str = payload["model"]
        upstream = ctx.routing.upstream(model)
        if (
            upstream is None
            or upstream.remote
            or upstream.model_name is not None
            or not upstream.base_url.startswith("http://")
        ):
            return None
        engine = ctx.routing.engines.get(upstream.name)
        if engine is None:
            return None
        caps = ctx.capabilities.known(engine)
        if caps is None:  # the first request to this start of the engine: the full path's
            self._keep(ctx.capabilities.of(engine))  # and the next one knows them
            return None
        if serve_problem(caps, "POST", head.path, head.path, payload, model) is not None:
            return None
        admission = ctx.admission(upstream.name)
        if not admission.try_enter():  # a queue, and its 429, are the full path's
            return None
        return _Request(head, body, model, upstream, admission, caps)

    def run(self, exchange: _Exchange) -> None:
        exchange.task = self._keep(exchange.run())
        exchange.task.add_done_callback(exchange.finished)

    def _keep(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.create_task(work, name="express")
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return task


class _Connection:
    """The lane's side of one client connection: it holds a request's bytes until it is whole,
    then serves it or hands it (and the connection, until aiohttp is idle again) to aiohttp."""

    def __init__(self, lane: ExpressLane, conn: OpenConnection) -> None:
        assert conn.transport is not None  # connection_made came first
        self._lane = lane
        self._conn = conn
        self.transport = conn.transport
        self._held = b""  # the bytes of a request not yet whole
        self._head: _Head | None = None  # its head, once whole
        self._head_end = 0
        self._exchange: _Exchange | None = None
        self._later = b""  # bytes that came while an exchange ran (the next request)
        self._timer: asyncio.TimerHandle | None = None

    # -- LaneConnection

    def feed(self, data: bytes) -> None:
        if self._exchange is not None:
            self._later += data
            if len(self._later) > self._lane.ctx.settings.gateway.max_body_bytes:
                self.transport.pause_reading()  # read on once the exchange is over
            return
        self._cancel_timer()
        held = self._held + data if self._held else data
        if self._head is None:
            end = held.find(b"\r\n\r\n")
            head = parse_head(held[:end]) if 0 <= end <= MAX_HEAD_BYTES else None
            if head is None:  # not the lane's, or a head that came in pieces
                self._hand_over(held)
                return
            self._head, self._head_end = head, end + 4
        g = self._lane.ctx.settings.gateway
        have = len(held) - self._head_end
        if have < self._head.length and self._head.length <= g.max_body_bytes:
            self._held = held  # the rest of the body is on its way
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(g.body_timeout_s, self._hand_over_held)
            return
        head, self._head, self._held = self._head, None, b""
        if have != head.length or not self._start(head, held[self._head_end :]):
            self._hand_over(held)  # pipelined requests, or not the lane's

    def _start(self, head: _Head, body: bytes) -> bool:
        """Serve the request on the lane if it may; False: aiohttp serves it."""
        request = None
        try:
            peer = self.transport.get_extra_info("peername")
            request = self._lane.admit(head, body, peer[0] if peer else None)
            if request is None:
                return False
            self._exchange = _Exchange(self._lane, self, request)
            self._lane.run(self._exchange)
            return True
        except Exception:  # boundary: the full path answers what the lane could not take
            log.exception("the express lane could not take a request; aiohttp serves it")
            if request is not None:
                request.admission.leave()
            self._exchange = None
            return False

    def lost(self) -> None:
        self._cancel_timer()
        if self._exchange is not None and self._exchange.task is not None:
            self._exchange.task.cancel()

    def pause_writing(self) -> bool:
        return self._exchange is not None and self._exchange.pause_writing()

    def resume_writing(self) -> None:
        if self._exchange is not None:
            self._exchange.resume_writing()

    # -- the exchange's end

    def done(self, *, close: bool) -> None:
        self._exchange = None
        transport = self.transport
        if close or transport.is_closing():
            transport.close()
            return
        later, self._later = self._later, b""
        if later:
            transport.resume_reading()
            self.feed(later)
            return
        keep_s = self._lane.ctx.settings.gateway.keepalive_timeout_s
        self._timer = asyncio.get_running_loop().call_later(keep_s, transport.close)

    # -- helpers

    def _hand_over(self, data: bytes) -> None:
        self._held, self._head = b"", None
        self._conn.hand_over(data)

    def _hand_over_held(self) -> None:
        self._timer = None
        self._hand_over(self._held)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class _Exchange:
    """One request the lane serves, from the engine's request to the client's last byte."""

    def __init__(self, lane: ExpressLane, conn: _Connection, request: _Request) -> None:
        ctx = lane.ctx
        self.task: asyncio.Task[None] | None = None
        self._lane, self._ctx, self._conn, self._r = lane, ctx, conn, request
        self._transport = conn.transport
        self._started = time.perf_counter()
        self._status = CLIENT_CLOSED_REQUEST  # until an answer is complete
        self._head: bytes | None = None  # the stream's head, until it leaves with an event
        self._reply: UpstreamReply | None = None
        self._streaming = False
        self._counts: tuple[int | None, int | None] = (None, None)  # prompt, completion tokens
        self._flow: Flow = ctx.traffic.open(
            request.upstream.name, streaming=True, end=self._end_from_outside
        )
        self._flow.client = self._transport
        self._events = Relayed(
            metrics=ctx.metrics, model=request.model, started=self._started, flow=self._flow
        )
        self._headers = {
            "Content-Type": "application/json",
            "Accept": request.head.fields.get("accept", "*/*"),
            **request.upstream.headers,
        }
        # written now, on a kept-alive connection: the engine starts while the task does
        self._sent: Sent | None = None
        with contextlib.suppress(ValueError):  # a header it refuses: the task says so
            self._sent = ctx.upstreams.send_now(
                "POST",
                request.upstream.base_url,
                request.head.path,
                body=request.body,
                headers=self._headers,
            )

    async def run(self) -> None:
        try:
            await self._serve()
        except asyncio.CancelledError:
            if not self._ended_from_outside():
                raise
            self._tell_ended()
        except Exception:  # boundary: never leak a traceback (or a path) to a client
            log.exception("the express lane failed on a request to %s", self._r.upstream.name)
            if self._streaming:
                self._error_event(INTERNAL_ERROR)
                self._finish_stream()
            else:
                self._answer(openai_error(500, INTERNAL_ERROR, type_="server_error"))
        finally:
            if self._reply is not None:
                self._reply.close()  # not read to its end: the engine aborts the request

    def finished(self, _: asyncio.Task[Any]) -> None:
        """The task's end, also when it was cancelled before it began (then ``run`` never
        ran): the slot and the flow go back, and the request is counted and logged."""
        r, ctx = self._r, self._ctx
        if self._reply is None and self._sent is not None:
            self._sent.conn.discard()  # written, never read: the engine aborts it
        self._flow.close()
        r.admission.leave()
        route, status = r.head.path, self._status
        elapsed_s = time.perf_counter() - self._started
        ctx.metrics.latency.observe(elapsed_s, route=route)
        if status >= 400 and status != CLIENT_CLOSED_REQUEST:
            ctx.metrics.errors.inc(status=str(status))
        ctx.metrics.requests.inc(route=route, status=str(status))
        self._lane.served.inc()
        if (usage := ctx.usage_sink(route, r.model, r.upstream)) is not None:
            usage(status, *self._counts, elapsed_s)
        self._conn.done(close=r.head.close or status == CLIENT_CLOSED_REQUEST)

    async def _serve(self) -> None:
        r, ctx = self._r, self._ctx
        try:
            if self._sent is not None:
                reply: UpstreamReply | aiohttp.ClientResponse = await ctx.upstreams.reply(
                    self._sent
                )
            else:
                reply = await ctx.upstreams.request(
                    "POST",
                    r.upstream.base_url,
                    r.head.path,
                    body=r.body,
                    headers=self._headers,
                    connect_timeout_s=ctx.settings.gateway.upstream_connect_timeout_s,
                )
        except (aiohttp.ClientConnectionError, TimeoutError) as exc:
            self._answer(unreachable(r.upstream.name, exc))
            return
        assert isinstance(reply, UpstreamReply)  # admit takes plain-http upstreams only
        self._reply = reply
        ctype = reply.headers.get("Content-Type", "")
        if reply.status == 200 and ctype.startswith("text/event-stream"):
            await self._stream(reply, ctype)
            return
        try:
            data = await reply.read()
        except aiohttp.ClientPayloadError as exc:
            self._answer(openai_error(502, f"engine {r.upstream.name} failed mid-request: {exc}"))
            return
        self._counts = count_usage(data, r.model, ctx.metrics, chunks=0)
        resp = engine_answer(r.upstream, reply, data)
        if resp.status >= 400:
            path = r.head.path
            resp = explain_engine_error(
                r.caps, resp, method="POST", route=path, path=path, model=r.model
            )
        self._answer(resp)

    async def _stream(self, reply: UpstreamReply, ctype: str) -> None:
        r = self._r
        head = ["HTTP/1.1 200 OK"]
        head += [f"{name}: {value}" for name, value in stream_headers(ctype, r.upstream).items()]
        head += ["Transfer-Encoding: chunked", f"Date: {http_date()}"]
        if r.head.close:
            head.append("Connection: close")
        self._head = ("\r\n".join(head) + "\r\n\r\n").encode()
        self._streaming = True
        reply.stream_to(self._relay)
        try:
            await reply.until_end()
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
            log_broke_off(r.upstream.name, exc, len(self._events.partial))
            self._error_event(broke_off_message(r.upstream.name, exc))
        else:
            if rest := self._events.rest():
                self._write(rest)
        self._finish_stream()

    def _relay(self, piece: bytes) -> None:
        """The engine connection's callback: each piece of the body, relayed at once."""
        try:
            chunk = self._events.feed(piece)
            if chunk:
                self._write(chunk)
        except Exception:  # boundary: never into the engine connection's parser
            log.exception("relaying a stream from %s failed", self._r.upstream.name)
            if self._reply is not None:
                self._reply.close()  # the stream ends as broken off, with its error event

    def _write(self, chunk: bytes) -> None:
        transport = self._transport
        if transport.is_closing():
            return  # the client went away: connection_lost ends the exchange
        framed = b"%x\r\n%b\r\n" % (len(chunk), chunk)
        if self._head is not None:
            framed, self._head = self._head + framed, None
        transport.write(framed)

    def _finish_stream(self) -> None:
        if self._head is not None:  # nothing came: the head still goes, with the end
            self._transport.write(self._head)
            self._head = None
        if not self._transport.is_closing():
            self._transport.write(_FINAL_CHUNK)
            self._status = 200
        ctx, events = self._ctx, self._events
        self._counts = count_usage(events.counted, self._r.model, ctx.metrics, chunks=events.chunks)

    def _error_event(self, message: str, type_: str = ENGINE_ERROR) -> None:
        self._ctx.metrics.errors.inc(status="502")
        self._write(sse_error(message, type_=type_))

    def _answer(self, resp: web.Response) -> None:
        """A whole (non-streamed) answer."""
        if not self._transport.is_closing():
            self._transport.write(whole_response(resp, close=self._r.head.close))
            self._status = resp.status

    # -- ended from outside (the engine died, hung or was stopped)

    def _end_from_outside(self) -> None:
        if self.task is not None:
            self.task.cancel()

    def _ended_from_outside(self) -> bool:
        """The cancel was the flow's end, and the client is there to be told why: taken back."""
        if not self._flow.why or self._transport.is_closing():
            return False
        task = asyncio.current_task()
        return task is not None and task.uncancel() == 0

    def _tell_ended(self) -> None:
        """Why the engine's side ended: an error event in a stream that began, else a 503."""
        why = self._flow.why
        if self._streaming:
            self._error_event(why, self._flow.why_type)
            self._finish_stream()
        else:
            self._answer(
                openai_error(503, why, type_="engine_unavailable", headers={"Retry-After": "5"})
            )

    # -- back-pressure: the client's socket buffer is full

    def pause_writing(self) -> bool:
        if self._reply is not None:
            self._reply.pause_reading()
        self._flow.writing_since_s = time.monotonic()
        return True

    def resume_writing(self) -> None:
        self._flow.writing_since_s = 0.0
        if self._reply is not None:
            self._reply.resume_reading()


def whole_response(resp: web.Response, *, close: bool) -> bytes:
    """A complete HTTP/1.1 response with a length, from an aiohttp Response (the errors the
    gateway builds, an engine's answer)."""
    body = resp.body if isinstance(resp.body, bytes) else b""
    lines = [f"HTTP/1.1 {resp.status} {resp.reason}"]
    for name, value in resp.headers.items():
        if name.lower() not in ("content-length", "transfer-encoding", "connection", "date"):
            lines.append(f"{name}: {value}")
    lines.append(f"Content-Length: {len(body)}")
    lines.append(f"Date: {http_date()}")
    if close:
        lines.append("Connection: close")
    head = "\r\n".join(lines) + "\r\n\r\n"
    return head.encode("utf-8", "surrogateescape") + body


_date: tuple[int, str] = (0, "")


def http_date() -> str:
    """The Date header's value, worked out once a second."""
    global _date
    now = int(time.time())
    if _date[0] != now:
        _date = (now, formatdate(now, usegmt=True))
    return _date[1]
