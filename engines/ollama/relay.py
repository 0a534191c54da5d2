"""One Ollama request relayed to its engine as the OpenAI request shapes.py made of it, and the
reply turned into Ollama's as it comes (replies.py).

It goes the way every request at :8000 goes, through the gateway's own parts: the pause switch,
``upstream_for`` (a model that is not loaded loads there, single flight), Ollama's
``keep_alive`` onto traylm's TTL, the engine's admission slot (429 past the queue), the
traffic flow the supervisor and the stalled-client sweep read, the upstream client's pooled
connections, the usage log, the recorder and the gateway's metrics (TTFT, tokens, latency).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from engines.gateway.admission import QueueFull
from engines.gateway.exchange import EXCHANGE, ReplyCapture
from engines.gateway.forward import upstream_for
from engines.gateway.proxy import CLIENT_GONE, CLIENT_WRITE_ERRORS, REPLY_COMPLETE
from engines.gateway.service import GatewayContext
from engines.gateway.sse import count_usage, error_text, whole_events
from engines.gateway.upstream import Upstream
from engines.ollama.errors import from_openai, ollama_error
from engines.ollama.replies import StreamLines, Timing, whole

NDJSON = "application/x-ndjson"


@dataclass(frozen=True)
class Ask:
    """What goes to the engine: the OpenAI route and body, the traylm model the client named,
    what the reply becomes (chat | generate | raw | embed), Ollama's keep_alive in seconds, and
    the name as the client wrote it (``fake:latest`` for ``fake``), which the reply echoes as
    Ollama's do."""

    route: str
    payload: Mapping[str, Any]
    model: str
    kind: str
    keep_alive_s: float | None = None
    named: str = ""

    @property
    def echoed(self) -> str:
        """The model name the reply carries: the client's own spelling."""
        return self.named or self.model

    @property
    def stream(self) -> bool:
        return self.payload.get("stream") is True


async def resolved(
    ctx: GatewayContext, request: web.Request, ask: Ask
) -> tuple[Upstream, Any] | web.Response:
    """The upstream and admission of ``ask.model`` (loading it when it is not), its keep_alive
    applied; or the error in Ollama's shape."""
    body = json.dumps(ask.payload).encode()
    exchange = request.get(EXCHANGE)
    if exchange is not None:
        exchange.asked(ask.model, body, "application/json", stream=ask.stream)
    if ctx.pause is not None:
        ctx.log_refused(request.path, ask.model, 503)
        return ollama_error(503, f"traylm paused new requests: {ctx.pause.reason}")
    target = await upstream_for(ctx, ask.model)
    if isinstance(target, web.Response):
        ctx.log_refused(request.path, ask.model, target.status)
        return from_openai(target)
    upstream, admission = target
    if ask.keep_alive_s is not None:
        ctx.routing.keep_alive(upstream, ask.keep_alive_s)
    if exchange is not None:
        exchange.engine_id, exchange.remote = upstream.name, upstream.remote
    return upstream, admission


async def forward(ctx: GatewayContext, request: web.Request, ask: Ask) -> web.StreamResponse:
    """Relay ``ask`` and answer in Ollama's shape (a stream of lines, or one object)."""
    target = await resolved(ctx, request, ask)
    if isinstance(target, web.Response):
        return target
    upstream, admission = target
    payload = dict(ask.payload)
    if upstream.model_name is not None:
        payload["model"] = upstream.model_name  # an attached server's own model id
    body = json.dumps(payload).encode()
    try:
        async with admission.slot():
            return await _in_slot(ctx, request, ask, upstream, body)
    except QueueFull as exc:
        ctx.log_refused(request.path, ask.model, 429, upstream.name)
        return ollama_error(429, f"too many requests for {ask.model}: {exc.reason}; retry later")


async def _in_slot(
    ctx: GatewayContext, request: web.Request, ask: Ask, upstream: Upstream, body: bytes
) -> web.StreamResponse:
    task = asyncio.current_task()
    assert task is not None
    key = f"remote:{upstream.name}" if upstream.remote else upstream.name

    def end() -> None:
        task.cancel()

    flow = ctx.traffic.open(key, streaming=ask.stream, end=end)
    flow.client = request.transport
    started = time.perf_counter()
    exchange = request.get(EXCHANGE)
    sink = ctx.usage_sink(request.path, ask.model, upstream)
    usage = exchange.counted(sink) if exchange is not None else sink
    g = ctx.settings.gateway
    try:
        reply = await ctx.upstreams.request(
            "POST",
            upstream.base_url,
            ask.route,
            body=body,
            headers={"Content-Type": "application/json", **upstream.headers},
            connect_timeout_s=g.upstream_connect_timeout_s,
            tls=upstream.tls,
        )
    except (aiohttp.ClientConnectionError, TimeoutError) as exc:
        flow.close()
        if usage is not None:
            usage(502, None, None, time.perf_counter() - started)
        why = f"engine {upstream.name} did not answer ({type(exc).__name__}); retry shortly"
        return ollama_error(502, why)
    try:
        ctype = reply.headers.get("Content-Type", "")
        if reply.status == 200 and ctype.startswith("text/event-stream"):
            return await _stream(ctx, request, ask, reply, (started, usage, flow))
        data = await reply.read()
        prompt, completion = count_usage(data, ask.model, ctx.metrics, chunks=0)
        if usage is not None:
            usage(reply.status, prompt, completion, time.perf_counter() - started)
        if reply.status >= 400:
            return ollama_error(reply.status, error_text(data, reply.status))
        return _whole(ask, data, Timing())
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
        return ollama_error(502, f"engine {upstream.name} failed mid-request: {exc}")
    finally:
        ctx.metrics.latency.observe(time.perf_counter() - started, route=request.path)
        reply.close()
        flow.close()


def _whole(ask: Ask, data: bytes, timing: Timing) -> web.Response:
    try:
        parsed = json.loads(data)
    except ValueError:
        return ollama_error(502, "the engine's reply was not JSON")
    if not isinstance(parsed, dict):
        return ollama_error(502, "the engine's reply was not a JSON object")
    if ask.kind == "embed":
        return web.json_response(embedded(ask.echoed, parsed, timing))
    return web.json_response(whole(ask.kind, ask.echoed, parsed, timing))


def embedded(model: str, reply: Mapping[str, Any], timing: Timing) -> dict[str, Any]:
    """An OpenAI embeddings reply as /api/embed's."""
    rows = reply.get("data")
    vectors = [r.get("embedding", []) for r in rows or () if isinstance(r, dict)]
    stats = timing.stats(reply.get("usage"))
    return {
        "model": model,
        "embeddings": vectors,
        "total_duration": stats["total_duration"],
        "load_duration": 0,
        "prompt_eval_count": stats["prompt_eval_count"],
    }


async def _stream(
    ctx: GatewayContext,
    request: web.Request,
    ask: Ask,
    reply: Any,
    run: tuple[float, Any, Any],
) -> web.StreamResponse:
    """The engine's events as Ollama's lines, each written as soon as its event is whole."""
    started, usage, flow = run
    lines = StreamLines("chat" if ask.kind == "chat" else ask.kind, ask.echoed)
    exchange = request.get(EXCHANGE)
    capture = ReplyCapture(exchange, None) if exchange is not None else None
    resp = web.StreamResponse(headers={"Content-Type": NDJSON, "Cache-Control": "no-cache"})
    await resp.prepare(request)
    partial, tail, first = b"", b"", True
    try:
        async for piece in reply.content.iter_any():
            chunk = partial + piece
            cut = whole_events(chunk)
            events, partial = chunk[:cut], chunk[cut:]
            if not events:
                continue
            if first:
                ctx.metrics.ttft.observe(time.perf_counter() - started, model=ask.model)
                first = False
            if capture is not None:
                capture.feed(events)
            if b'_tokens"' in events:
                tail = (tail + events)[-8192:]
            flow.engine.last_byte_s = time.monotonic()  # the engine's progress
            out = lines.feed(events)
            if out:
                flow.writing_since_s = time.monotonic()
                await resp.write(out)
                flow.writing_since_s = 0.0
        await resp.write(lines.end())
        await resp.write_eof()
    except CLIENT_WRITE_ERRORS:
        request[CLIENT_GONE] = True
        if usage is not None:
            usage(499, None, None, time.perf_counter() - started)
        return resp
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
        lines.error = f"the engine stopped in the middle of the reply ({type(exc).__name__})"
        await _last(resp, lines.end())
    prompt, completion = count_usage(tail, ask.model, ctx.metrics, chunks=0)
    if usage is not None:
        usage(200, prompt, completion, time.perf_counter() - started)
    request[REPLY_COMPLETE] = True
    return resp


async def _last(resp: web.StreamResponse, data: bytes) -> None:
    try:
        await resp.write(data)
        await resp.write_eof()
    except CLIENT_WRITE_ERRORS:
        pass
