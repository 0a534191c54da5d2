"""The streaming relay from the gateway to one engine.

Server-sent events pass through unbuffered: each event the engine sends is written to the client
as soon as its last byte arrives (a chunk that ends mid-event keeps that event's start back until
the rest comes). If the client goes away the handler is cancelled and the upstream
connection is closed, so the engine aborts the request instead of generating for nobody. If the
engine dies mid-stream, the client gets an OpenAI-shaped error event (which the openai SDK raises
as ``APIError``) and a clean end of stream instead of a hung connection; the same at once when
the supervisor declares the engine dead, hung or stopped (``Flow.stop``: the event says why).
Events reach the client as valid UTF-8 (gateway/utf8.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from time import monotonic
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from engines.gateway.metrics import GatewayMetrics
from engines.gateway.shapes import is_anthropic
from engines.gateway.utf8 import Utf8Events
from engines.http import openai_error
from engines.traffic import Flow

log = logging.getLogger(__name__)

# OpenAI's chat/completions usage, and the Responses and Anthropic Messages APIs' names
_PROMPT_RE = re.compile(rb'"(?:prompt|input)_tokens"\s*:\s*(\d+)')
_COMPLETION_RE = re.compile(rb'"(?:completion|output)_tokens"\s*:\s*(\d+)')
REPLY_COMPLETE = web.RequestKey("traylm.reply_complete", bool)
"""Request key set once the last byte of a streamed reply was written (see error_middleware)."""
CLIENT_GONE = web.RequestKey("traylm.client_gone", bool)
"""Request key set when the client went away while a write to it was pending."""


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


def sse_error(
    message: str, *, type_: str = "engine_error", code: int = 502, anthropic: bool = False
) -> bytes:
    """The event that ends a broken stream, as the client's SDK raises it: OpenAI's error data
    and [DONE], or Anthropic's ``error`` event (its SDK ignores events it does not know)."""
    if anthropic:
        data = {"type": "error", "error": {"type": "api_error", "message": message}}
        return b"event: error\ndata: " + json.dumps(data).encode() + b"\n\n"
    payload = {"error": {"message": message, "type": type_, "param": None, "code": code}}
    return b"data: " + json.dumps(payload).encode() + b"\n\ndata: [DONE]\n\n"


UsageSink = Callable[[int, int | None, int | None, float], None]
"""Called once per relayed request: (status, prompt tokens, completion tokens, seconds)."""


@dataclass(frozen=True)
class Upstream:
    """Where a request goes: an engine's loopback URL (or a remote base URL)."""

    name: str  # engine id, shown in X-Traylm-Engine
    base_url: str  # without the /v1 suffix
    headers: Mapping[str, str]
    remote: bool = False


async def relay(
    request: web.Request,
    *,
    session: aiohttp.ClientSession,
    upstream: Upstream,
    body: bytes,
    model: str,
    connect_timeout_s: float,
    metrics: GatewayMetrics,
    usage: UsageSink | None = None,
    content_type: str = "application/json",
    on_first_events: Callable[[bytes], None] | None = None,
    flow: Flow | None = None,
    tap: ReplySink | None = None,
) -> web.StreamResponse:
    """Relay ``request`` (method, path, query) with ``body``; ``on_first_events`` sees the first
    whole events of a stream (the Responses route reads the response id there). ``flow``: the
    request in flight (its engine's progress; when it is ended from outside, its client is told
    why); ``tap``: sees every event relayed (a chat reply kept as it streams)."""
    started = time.perf_counter()
    headers = {
        "Content-Type": content_type,
        "Accept": request.headers.get("Accept", "*/*"),
        **upstream.headers,
    }
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s, sock_read=None)
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else request.path  # no ids in labels
    try:
        resp_cm = session.request(
            request.method,
            upstream.base_url + request.path_qs,
            data=body or None,
            headers=headers,
            timeout=timeout,
        )
        upstream_resp = await resp_cm
    except asyncio.CancelledError:
        if not ended_from_outside(request, flow):
            raise
        assert flow is not None
        return _ended_error(flow.why)
    except (aiohttp.ClientConnectionError, TimeoutError) as exc:
        log.warning("upstream %s unreachable: %s", upstream.name, exc)
        if usage is not None:
            usage(502, None, None, time.perf_counter() - started)
        return openai_error(
            502,
            f"engine {upstream.name} did not answer ({type(exc).__name__}); "
            "it may be restarting: retry shortly",
            type_="engine_unavailable",
            headers={"Retry-After": "2"},
        )
    try:
        ctype = upstream_resp.headers.get("Content-Type", "")
        if upstream_resp.status == 200 and ctype.startswith("text/event-stream"):
            return await _stream(
                request,
                upstream_resp,
                _Stream(upstream, model, started, metrics, usage, on_first_events, flow, tap),
            )
        data = await upstream_resp.read()
        counts = b"" if request.path.endswith("/count_tokens") else data  # no generation
        prompt, completion = _count_usage(counts, model, metrics, chunks=0)
        if usage is not None:
            usage(upstream_resp.status, prompt, completion, time.perf_counter() - started)
        out_headers = {
            k: v for k, v in upstream_resp.headers.items() if k.lower() not in HOP_HEADERS
        }
        out_headers["X-Traylm-Engine"] = upstream.name
        if upstream.remote:
            out_headers["X-Traylm-Route"] = "remote"
        return web.Response(body=data, status=upstream_resp.status, headers=out_headers)
    except asyncio.CancelledError:
        if not ended_from_outside(request, flow):
            raise
        assert flow is not None
        return _ended_error(flow.why)
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
        if usage is not None:
            usage(502, None, None, time.perf_counter() - started)
        return openai_error(
            502, f"engine {upstream.name} failed mid-request: {exc}", type_="engine_error"
        )
    finally:
        metrics.latency.observe(time.perf_counter() - started, route=route)
        upstream_resp.close()


class EventStreamResponse(web.StreamResponse):
    """A streamed reply whose status line and headers leave with its first event, in one write
    and one TCP segment (a StreamResponse sends them alone at prepare(); aiohttp's Response
    already holds them back like this). The client then sees the 200 with the first token
    rather than when the engine accepted the request; the first token itself is not later."""

    _send_headers_immediately = False


@dataclass
class _Stream:
    """What a streamed relay needs besides the two responses."""

    upstream: Upstream
    model: str
    started: float
    metrics: GatewayMetrics
    usage: UsageSink | None
    on_first_events: Callable[[bytes], None] | None
    flow: Flow | None
    tap: ReplySink | None


async def _stream(
    request: web.Request, upstream_resp: aiohttp.ClientResponse, s: _Stream
) -> web.StreamResponse:
    upstream, metrics, flow, tap = s.upstream, s.metrics, s.flow, s.tap
    headers = {
        "Content-Type": upstream_resp.headers.get("Content-Type", "text/event-stream"),
        "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no",
        "X-Traylm-Engine": upstream.name,
    }
    if upstream.remote:
        headers["X-Traylm-Route"] = "remote"
    resp = EventStreamResponse(status=200, headers=headers)
    await resp.prepare(request)
    first = True
    chunks = 0
    counted = b""  # the last events that carried token counts (usage)
    partial = b""  # the start of an event whose end has not arrived yet
    utf8 = Utf8Events()
    on_first_events = s.on_first_events
    try:
        async for chunk in upstream_resp.content.iter_any():
            if first:
                metrics.ttft.observe(time.perf_counter() - s.started, model=s.model)
                first = False
            if partial:
                chunk, partial = partial + chunk, b""
            if not chunk.endswith(EVENT_ENDS):  # usually it does: one token, one whole event
                cut = whole_events(chunk)
                chunk, partial = chunk[:cut], chunk[cut:]
                if not chunk:
                    continue
            if not chunk.isascii() or utf8.held:  # usually ASCII: one check, no copy
                chunk = utf8.clean(chunk)
            if on_first_events is not None:
                on_first_events(chunk)
                on_first_events = None
            chunks += chunk.count(b"data: {")
            if b'_tokens"' in chunk:  # usage: OpenAI's prompt/completion, Anthropic's input/output
                counted = (counted + chunk)[-8192:]
            if tap is not None:
                tap.feed(chunk)
            if flow is None:
                await resp.write(chunk)
            else:  # the engine's progress; a write the client does not take stays pending
                flow.writing_since_s = flow.engine.last_byte_s = monotonic()
                await resp.write(chunk)
                flow.writing_since_s = 0.0
        if partial:  # the engine ended without the closing blank line: pass it on as it is
            await resp.write(utf8.clean(partial))
    except asyncio.CancelledError:
        if not ended_from_outside(request, flow):
            raise
        assert flow is not None
        await _end_with_error(request, resp, s, flow.why)
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, ConnectionResetError) as exc:
        if request.transport is None or request.transport.is_closing():
            request[CLIENT_GONE] = True  # the client went away while a write was pending
            return resp
        log.warning(
            "engine %s broke off a stream: %s (%d bytes of an unfinished event dropped)",
            upstream.name,
            exc,
            len(partial),
        )
        await _end_with_error(
            request,
            resp,
            s,
            f"engine {upstream.name} stopped in the middle of the reply "
            f"({type(exc).__name__}); retry shortly (`traylm status` says whether it restarts)",
        )
    finally:
        if tap is not None:
            keep(tap.finish())
    prompt, completion = _count_usage(counted, s.model, metrics, chunks=chunks)
    if s.usage is not None:
        s.usage(200, prompt, completion, time.perf_counter() - s.started)
    await resp.write_eof()
    request[REPLY_COMPLETE] = True
    return resp


async def _end_with_error(
    request: web.Request, resp: web.StreamResponse, s: _Stream, message: str
) -> None:
    s.metrics.errors.inc(status="502")
    event = sse_error(message, anthropic=is_anthropic(request.path))
    if s.tap is not None:
        s.tap.feed(event)
    if s.flow is not None:  # a client that reads nothing is ended by the sweep, also here
        s.flow.writing_since_s = monotonic()
    await resp.write(event)


def ended_from_outside(request: web.Request, flow: Flow | None) -> bool:
    """The CancelledError being handled was the flow's own end (its engine died or stopped),
    and its client is still there to be told why: the cancel is taken back."""
    if flow is None or not flow.why or request.transport is None:
        return False
    if request.transport.is_closing():
        return False
    task = asyncio.current_task()
    return task is not None and task.uncancel() == 0


def _ended_error(why: str) -> web.Response:
    return openai_error(503, why, type_="engine_unavailable", headers={"Retry-After": "5"})


_KEPT: set[asyncio.Task[None]] = set()


def keep(coro: Coroutine[Any, Any, None]) -> None:
    """Run ``coro`` to its end even when the request's handler is cancelled now."""
    task = asyncio.create_task(coro)
    _KEPT.add(task)
    task.add_done_callback(_KEPT.discard)


EVENT_ENDS = (b"\n\n", b"\r\n\r\n")


def whole_events(data: bytes) -> int:
    """The length of the part of ``data`` made of whole server-sent events (each ends with a
    blank line). Only whole events are relayed, so an engine that dies mid-write never leaves
    the client half an event glued to the error event that follows."""
    ends = [i + len(sep) for sep in EVENT_ENDS if (i := data.rfind(sep)) >= 0]
    return max(ends, default=0)


def _count_usage(
    data: bytes, model: str, metrics: GatewayMetrics, *, chunks: int
) -> tuple[int | None, int | None]:
    prompt = _PROMPT_RE.findall(data)
    completion = _COMPLETION_RE.findall(data)
    prompt_tokens = int(prompt[-1]) if prompt else None
    completion_tokens = int(completion[-1]) if completion else None
    if prompt_tokens is not None:
        metrics.tokens_in.inc(float(prompt_tokens), model=model)
    if completion_tokens is not None:
        metrics.tokens_out.inc(float(completion_tokens), model=model)
    elif chunks > 1:
        completion_tokens = chunks - 1  # first chunk carries the role
        metrics.tokens_out.inc(float(completion_tokens), model=model)
    return prompt_tokens, completion_tokens
