"""The streaming relay from the gateway to one engine.

Server-sent events pass through unbuffered: each event the engine sends is written to the client
as soon as its last byte arrives (a chunk that ends mid-event keeps that event's start back until
the rest comes). If the client goes away the handler is cancelled and the upstream
connection is closed, so the engine aborts the request instead of generating for nobody; a
write to a client that is gone counts as that (499), never as the engine's fault. If the
engine dies mid-stream, the client gets an OpenAI-shaped error event (which the openai SDK raises
as ``APIError``) and a clean end of stream instead of a hung connection; the same at once when
the supervisor declares the engine dead, hung or stopped (``RelayedRequest.stop``: the event
says why).
Events reach the client as valid UTF-8 (gateway/utf8.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from time import monotonic
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from engines.core.http import event_stream, openai_error
from engines.gateway.chunked import DirectChunks
from engines.gateway.metrics import GatewayMetrics
from engines.gateway.sse import (
    EVENT_ENDS,
    count_usage,
    ends_reply,
    error_text,
    sse_error,
    whole_events,
)
from engines.gateway.upstream import Upstream
from engines.gateway.upstream_client import EngineUnreachable, UpstreamClient, UpstreamReply
from engines.gateway.utf8 import Utf8Events
from engines.runtime.traffic import ENGINE_ERROR, RelayedRequest

log = logging.getLogger(__name__)

REPLY_COMPLETE = web.RequestKey("traylm.reply_complete", bool)
"""Request key set once the last byte of a streamed reply was written (see error_middleware)."""
CLIENT_GONE = web.RequestKey("traylm.client_gone", bool)
"""Request key set when a write to the client failed because it went away (error_middleware
counts the request as 499, client closed request)."""
CLIENT_WRITE_ERRORS = (ConnectionError, aiohttp.ClientConnectionError)
"""What a write to the client raises once its connection is gone (aiohttp: "Cannot write to
closing transport", a ConnectionResetError and a ClientConnectionError at once)."""
CLIENT_CLOSED_REQUEST = 499


class ClientGone(Exception):
    """A write to the client failed: it went away, or was closed for reading nothing."""


class ReplySink(Protocol):
    """Sees every event of a streamed reply (engines/chats/replies.py ReplyTap)."""

    def feed(self, events: bytes) -> None: ...

    async def finish(self) -> None: ...


HOP_HEADERS = frozenset(
    {
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "content-encoding",
        "server",
        "date",
    }
)

EngineReply = UpstreamReply | aiohttp.ClientResponse
"""An engine's reply: from traylm's client (plain http), or aiohttp's (https)."""

UsageSink = Callable[[int, int | None, int | None, float], None]
"""Called once per relayed request: (status, prompt tokens, completion tokens, seconds)."""


def unreachable_message(name: str, exc: BaseException) -> str:
    return (
        f"engine {name} did not answer ({type(exc).__name__}); it may be restarting: retry shortly"
    )


def broke_off_message(name: str, exc: BaseException) -> str:
    return (
        f"engine {name} stopped in the middle of the reply ({type(exc).__name__}); retry "
        "shortly (`traylm status` says whether it restarts)"
    )


def log_broke_off(name: str, exc: BaseException, dropped: int) -> None:
    log.warning(
        "engine %s broke off a stream: %s (%d bytes of an unfinished event dropped)",
        name,
        exc,
        dropped,
    )


def unreachable(name: str, exc: BaseException) -> web.Response:
    """The 502 of an engine that could not be reached, marked ``NOT_SENT`` when no connection
    took the request."""
    log.warning("upstream %s unreachable: %s", name, exc)
    resp = openai_error(
        502,
        unreachable_message(name, exc),
        type_="engine_unavailable",
        headers={"Retry-After": "2"},
    )
    resp[NOT_SENT] = isinstance(exc, NO_CONNECTION)
    return resp


BOX_REFUSALS = frozenset({429, 503})
"""What a paired box's gateway answers when it does not take a request now (busy, the model not
loaded there, paused): another replica may take it."""
NO_CONNECTION = (EngineUnreachable, aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
"""No connection took the request: traylm's client's, and aiohttp's (https: a paired box)."""
NOT_SENT = web.ResponseKey("traylm_not_sent", bool)
"""Set on an answer the gateway made because the request never reached its engine (no
connection), or its engine was declared dead or stopped before it sent a byte of the reply:
another replica may take it."""


Rewrite = Callable[[bytes], bytes]
"""What changes a successful reply on its way (whole events of a stream, or the whole body):
the Responses API's ids (response_ids.py)."""


@dataclass
class _Stream:
    """What a relay needs besides the request and the engine's response."""

    upstream: Upstream
    model: str
    started: float
    metrics: GatewayMetrics
    usage: UsageSink | None
    on_first_events: Callable[[bytes], None] | None
    flow: RelayedRequest | None
    tap: ReplySink | None
    prepared: web.StreamResponse | None
    rewrite: Rewrite | None = None

    def record(self, status: int, prompt: int | None = None, completion: int | None = None) -> None:
        if self.usage is not None:
            self.usage(status, prompt, completion, time.perf_counter() - self.started)


async def relay(
    request: web.Request,
    *,
    client: UpstreamClient,
    upstream: Upstream,
    body: bytes,
    model: str,
    connect_timeout_s: float,
    metrics: GatewayMetrics,
    usage: UsageSink | None = None,
    content_type: str = "application/json",
    on_first_events: Callable[[bytes], None] | None = None,
    flow: RelayedRequest | None = None,
    tap: ReplySink | None = None,
    prepared: web.StreamResponse | None = None,
    rewrite: Rewrite | None = None,
) -> web.StreamResponse:
    """Relay ``request`` (method, path, query) with ``body``; ``on_first_events`` sees the first
    whole events of a stream (the Responses route reads the response id there). ``flow``: the
    request in flight (its engine's progress; when it is ended from outside, its client is told
    why); ``tap``: sees every event relayed (a chat reply kept as it streams); ``prepared``: a
    stream already answered with 200 and SSE comments while the model loaded (``ColdStream``):
    the reply, or an error event, goes into it; ``rewrite``: changes a successful reply before
    anything else sees it."""
    s = _Stream(
        upstream,
        model,
        time.perf_counter(),
        metrics,
        usage,
        on_first_events,
        flow,
        tap,
        prepared,
        rewrite,
    )
    headers = {
        "Content-Type": content_type,
        "Accept": _accept(request),
        **upstream.headers,
    }
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else request.path  # no ids in labels
    try:
        upstream_resp = await client.request(
            request.method,
            upstream.base_url,
            request.path_qs,
            body=body,
            headers=headers,
            connect_timeout_s=connect_timeout_s,
            tls=upstream.tls,
        )
    except asyncio.CancelledError:
        if not ended_from_outside(request, flow):
            raise
        return await _answer_ended(request, s)
    except (aiohttp.ClientConnectionError, TimeoutError) as exc:
        s.record(502)
        if prepared is not None:
            log.warning("upstream %s unreachable: %s", upstream.name, exc)
            message = unreachable_message(upstream.name, exc)
            return await end_with_error(request, prepared, message, type_="engine_unavailable")
        return unreachable(upstream.name, exc)
    try:
        return await _reply(request, upstream_resp, s)
    except asyncio.CancelledError:
        if not ended_from_outside(request, flow):
            raise
        return await _answer_ended(request, s)
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
        s.record(502)
        message = f"engine {upstream.name} failed mid-request: {exc}"
        if prepared is not None:
            return await end_with_error(request, prepared, message)
        return openai_error(502, message, type_="engine_error")
    finally:
        metrics.latency.observe(time.perf_counter() - s.started, route=route)
        upstream_resp.close()


def _accept(request: web.Request) -> str:
    """The client's Accept for the engine; one with bytes that are not ASCII (aiohttp hands
    them on as surrogates) means nothing to an engine: ``*/*``."""
    accept = request.headers.get("Accept", "*/*")
    return accept if accept.isascii() else "*/*"


async def _reply(
    request: web.Request, upstream_resp: EngineReply, s: _Stream
) -> web.StreamResponse:
    ctype = upstream_resp.headers.get("Content-Type", "")
    if upstream_resp.status == 200 and ctype.startswith("text/event-stream"):
        return await _stream(request, upstream_resp, s)
    data = await upstream_resp.read()
    counts = b"" if request.path.endswith("/count_tokens") else data  # no generation
    s.record(upstream_resp.status, *count_usage(counts, s.model, s.metrics, chunks=0))
    if s.prepared is not None:  # an answer that is not a stream, after the stream began
        message = error_text(data, upstream_resp.status)
        return await end_with_error(request, s.prepared, message, status=upstream_resp.status)
    if s.rewrite is not None and upstream_resp.status < 400:
        data = s.rewrite(data)
    resp = engine_answer(s.upstream, upstream_resp, data)
    if s.upstream.box and upstream_resp.status in BOX_REFUSALS:
        resp[NOT_SENT] = True  # the box's gateway refused it before any engine there began
    return resp


def engine_answer(upstream: Upstream, reply: EngineReply, data: bytes) -> web.Response:
    """An engine's whole (not streamed) reply as the client gets it: its headers less the hop
    ones, and which engine (or remote) answered."""
    headers = {k: v for k, v in reply.headers.items() if k.lower() not in HOP_HEADERS}
    headers["X-Traylm-Engine"] = upstream.name
    _route_headers(headers, upstream)
    return web.Response(body=data, status=reply.status, headers=headers)


def stream_headers(content_type: str, upstream: Upstream) -> dict[str, str]:
    """The headers of a relayed stream."""
    headers = {
        "Content-Type": content_type,
        "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no",
        "X-Traylm-Engine": upstream.name,
    }
    _route_headers(headers, upstream)
    return headers


def _route_headers(headers: dict[str, str], upstream: Upstream) -> None:
    """Where a reply came from, beyond the engine: the remote fallback, or a paired box."""
    if upstream.remote:
        headers["X-Traylm-Route"] = "remote"
    elif upstream.box:
        headers["X-Traylm-Route"] = f"box {upstream.box}"


async def _stream(
    request: web.Request, upstream_resp: EngineReply, s: _Stream
) -> web.StreamResponse:
    resp = s.prepared or await _open_stream(request, upstream_resp, s.upstream)
    state = Relayed(
        metrics=s.metrics,
        model=s.model,
        started=s.started,
        flow=s.flow,
        tap=s.tap,
        on_first_events=s.on_first_events,
        rewrite=s.rewrite,
    )
    try:
        try:
            await _pump(request, upstream_resp, resp, s, state)
        except asyncio.CancelledError:
            if ended_from_outside(request, s.flow):
                assert s.flow is not None
                await _end_with_error(request, resp, s, s.flow.why, s.flow.why_type)
            elif state.ended:  # the client closed at the reply's last event: it got it all
                s.record(200, *count_usage(state.counted, s.model, s.metrics, chunks=state.chunks))
                request[REPLY_COMPLETE] = True
                raise
            else:
                raise
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, ConnectionError) as exc:
            log_broke_off(s.upstream.name, exc, len(state.partial))
            await _end_with_error(request, resp, s, broke_off_message(s.upstream.name, exc))
        s.record(200, *count_usage(state.counted, s.model, s.metrics, chunks=state.chunks))
        await _end_body(resp, s.upstream.name)
    except ClientGone as exc:
        request[CLIENT_GONE] = True
        log.info("client of a stream from %s went away: %s", s.upstream.name, exc.__cause__)
        s.record(CLIENT_CLOSED_REQUEST)
        return resp  # the relay closes the engine's response: the engine aborts the request
    finally:
        if s.tap is not None:
            keep(s.tap.finish())
    request[REPLY_COMPLETE] = True
    return resp


class Relayed:
    """A stream's events on their way to the client: ``feed`` each piece of the engine's body
    as it comes and write what it returns. Events leave whole and as valid UTF-8; on the way
    they are counted (usage), shown to the tap and to ``on_first_events``, and mark the
    engine's progress."""

    __slots__ = (
        "_first",
        "_metrics",
        "_model",
        "_on_first_events",
        "_progress",
        "_rewrite",
        "_started",
        "_tap",
        "_utf8",
        "chunks",
        "counted",
        "ended",
        "partial",
    )

    def __init__(
        self,
        *,
        metrics: GatewayMetrics,
        model: str,
        started: float,
        flow: RelayedRequest | None,
        tap: ReplySink | None = None,
        on_first_events: Callable[[bytes], None] | None = None,
        rewrite: Rewrite | None = None,
    ) -> None:
        self.chunks = 0  # events relayed
        self.counted = b""  # the last events that carried token counts (usage)
        self.partial = b""  # the start of an event not yet whole
        self.ended = False  # the last event fed ends the reply ([DONE], message_stop, ...)
        self._first = True
        self._metrics, self._model, self._started = metrics, model, started
        self._progress = flow.engine if flow is not None else None
        self._tap, self._on_first_events = tap, on_first_events
        self._rewrite = rewrite
        self._utf8 = Utf8Events()

    def feed(self, chunk: bytes) -> bytes:
        """The whole events to write now (b"" while an event is still incomplete)."""
        if self._first:
            self._metrics.ttft.observe(time.perf_counter() - self._started, model=self._model)
            self._first = False
        if self.partial:
            chunk, self.partial = self.partial + chunk, b""
        if not chunk.endswith(EVENT_ENDS):  # usually it does: one token, one whole event
            cut = whole_events(chunk)
            chunk, self.partial = chunk[:cut], chunk[cut:]
            if not chunk:
                return b""
        if not chunk.isascii() or self._utf8.held:  # usually ASCII: one check, no copy
            chunk = self._utf8.clean(chunk)
        if self._rewrite is not None:
            chunk = self._rewrite(chunk)
        if self._on_first_events is not None:
            self._on_first_events(chunk)
            self._on_first_events = None
        self.chunks += chunk.count(b"data: {")
        if b'_tokens"' in chunk:  # usage: OpenAI's prompt/completion, Anthropic's input/output
            self.counted = (self.counted + chunk)[-8192:]
        if self._tap is not None:
            self._tap.feed(chunk)
        if self._progress is not None:
            self._progress.last_byte_s = monotonic()  # the engine's progress
        self.ended = ends_reply(chunk)
        return chunk

    def rest(self) -> bytes:
        """What is left when the engine ended without an event's closing blank line: passed
        on as it is."""
        rest, self.partial = self.partial, b""
        return self._utf8.clean(rest) if rest else b""


async def _pump(
    request: web.Request,
    upstream_resp: EngineReply,
    resp: web.StreamResponse,
    s: _Stream,
    state: Relayed,
) -> None:
    """Relay the engine's events to the client as they come. Raises ClientGone when a write
    to the client fails; what the engine's side raises passes through."""
    flow = s.flow
    direct: DirectChunks | None = None  # once the headers are out (chunked.py)
    async for piece in upstream_resp.content.iter_any():
        chunk = state.feed(piece)
        if not chunk:
            continue
        try:
            if direct is not None:
                if direct.write(chunk):  # the client lags: wait while it is far behind
                    await _pending(flow, direct.drain())
            else:
                await _pending(flow, resp.write(chunk))
                direct = DirectChunks.of(request, resp)
        except CLIENT_WRITE_ERRORS as exc:
            raise ClientGone(str(exc)) from exc
    if rest := state.rest():
        await _to_client(resp.write(rest))


async def _pending(flow: RelayedRequest | None, write: Coroutine[Any, Any, None]) -> None:
    """Await a write; meanwhile the flow says since when it waits for its client (the sweep
    ends a stream whose client reads nothing, gateway.client_stall_timeout_s)."""
    if flow is None:
        await write
        return
    flow.writing_since_s = monotonic()
    await write
    flow.writing_since_s = 0.0


async def _end_body(resp: web.StreamResponse, engine: str) -> None:
    """End a stream whose every event was written. A client that closes at its last event
    (the openai SDK stops reading at ``[DONE]``) got every event, though the end of the chunked
    body may find its connection gone: a success, not a client gone mid-reply."""
    try:
        await resp.write_eof()
    except CLIENT_WRITE_ERRORS as exc:
        log.debug("client of a stream from %s closed at its last event: %s", engine, exc)


async def _to_client(write: Coroutine[Any, Any, None]) -> None:
    try:
        await write
    except CLIENT_WRITE_ERRORS as exc:
        raise ClientGone(str(exc)) from exc


async def _end_with_error(
    request: web.Request,
    resp: web.StreamResponse,
    s: _Stream,
    message: str,
    type_: str = ENGINE_ERROR,
) -> None:
    s.metrics.errors.inc(status="502")
    event = sse_error(message, type_=type_, path=request.path)
    if s.tap is not None:
        s.tap.feed(event)
    if s.flow is not None:  # a client that reads nothing is ended by the sweep, also here
        s.flow.writing_since_s = monotonic()
    await _to_client(resp.write(event))


async def end_with_error(
    request: web.Request,
    resp: web.StreamResponse,
    message: str,
    *,
    type_: str = "engine_error",
    status: int = 502,
) -> web.StreamResponse:
    """End a stream that already began (SSE comments while the model loaded) with an error
    event in the shape of the request's API, carrying the ``status`` the same refusal has
    unstreamed; a client that is gone is only noted."""
    try:
        await resp.write(sse_error(message, type_=type_, code=status, path=request.path))
        await resp.write_eof()
    except CLIENT_WRITE_ERRORS:
        request[CLIENT_GONE] = True
    return resp


def ended_from_outside(request: web.Request, flow: RelayedRequest | None) -> bool:
    """The CancelledError being handled was the flow's own end (its engine died or stopped),
    and its client is still there to be told why: the cancel is taken back."""
    if flow is None or not flow.why or request.transport is None:
        return False
    if request.transport.is_closing():
        return False
    task = asyncio.current_task()
    return task is not None and task.uncancel() == 0


async def _answer_ended(request: web.Request, s: _Stream) -> web.StreamResponse:
    """The answer of a request ended from outside before its reply began."""
    assert s.flow is not None
    if s.prepared is not None:
        why = s.flow.why
        return await end_with_error(
            request, s.prepared, why, type_="engine_unavailable", status=503
        )
    resp = openai_error(503, s.flow.why, type_="engine_unavailable", headers={"Retry-After": "5"})
    resp[NOT_SENT] = True  # its engine died or stopped before a byte of reply: nothing happened
    return resp


async def _open_stream(
    request: web.Request, upstream_resp: EngineReply, upstream: Upstream
) -> web.StreamResponse:
    ctype = upstream_resp.headers.get("Content-Type", "text/event-stream")
    resp = event_stream(request, stream_headers(ctype, upstream))
    await resp.prepare(request)
    return resp


_KEPT: set[asyncio.Task[None]] = set()


def keep(coro: Coroutine[Any, Any, None]) -> None:
    """Run ``coro`` to its end even when the request's handler is cancelled now."""
    task = asyncio.create_task(coro)
    _KEPT.add(task)
    task.add_done_callback(_KEPT.discard)
