"""The streaming relay (engines/gateway/proxy.py) between a real aiohttp client and a real
upstream server that writes server-sent events cut at awkward places: whole events only, the
bytes unchanged, and the token counts taken from the engine's usage (not the chunk count)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from engines.gateway.loading import ColdStream, LoadProgress
from engines.gateway.metrics import GatewayMetrics, MetricsRegistry
from engines.gateway.proxy import CLIENT_GONE, relay
from engines.gateway.upstream import Upstream
from engines.gateway.upstream_client import UpstreamClient

ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
TOKEN = b'data: {"choices":[{"index":0,"delta":{"content":"ab"}}]}\n\n'
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":9}}\n\n'
DONE = b"data: [DONE]\n\n"
STREAM = ROLE + TOKEN + TOKEN + USAGE + DONE


async def serve(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def upstream_app(pieces: Sequence[bytes]) -> web.Application:
    """A FAKE engine that writes ``pieces`` one by one, flushing each."""

    async def chat(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for piece in pieces:
            await resp.write(piece)
            await asyncio.sleep(0.005)  # shapes the stream into separate reads; asserts no timing
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


def gateway_app(upstream_url: str, records: list[tuple[int, int | None, int | None]]) -> Any:
    registry = MetricsRegistry()
    metrics = GatewayMetrics(registry)

    async def chat(request: web.Request) -> web.StreamResponse:
        client = UpstreamClient()
        try:
            return await relay(
                request,
                client=client,
                upstream=Upstream("fake", upstream_url, {}),
                body=await request.read(),
                model="m",
                connect_timeout_s=5,
                metrics=metrics,
                usage=lambda status, p, c, _s: records.append((status, p, c)),
            )
        finally:
            await client.close()

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app, registry


CUTS = {
    "one event per write": [ROLE, TOKEN, TOKEN, USAGE, DONE],
    "cut inside events": [STREAM[:30], STREAM[30:90], STREAM[90:200], STREAM[200:]],
    "usage cut in two": [ROLE + TOKEN + TOKEN + USAGE[:40], USAGE[40:] + DONE],
    "byte by byte at the end": [ROLE + TOKEN + TOKEN, *(bytes([b]) for b in USAGE + DONE)],
}


@pytest.mark.parametrize("pieces", list(CUTS.values()), ids=list(CUTS))
async def test_events_pass_whole_and_usage_is_counted(pieces: list[bytes]) -> None:
    records: list[tuple[int, int | None, int | None]] = []
    async for up in serve(upstream_app(pieces)):
        app, registry = gateway_app(up, records)
        async for gw in serve(app):
            reads: list[bytes] = []
            async with (
                aiohttp.ClientSession() as http,
                http.post(gw + "/v1/chat/completions", json={"stream": True}) as resp,
            ):
                assert resp.headers["Content-Type"] == "text/event-stream"
                assert resp.headers["X-Traylm-Engine"] == "fake"
                async for chunk in resp.content.iter_any():
                    reads.append(chunk)
    assert b"".join(reads) == STREAM
    assert all(r.endswith(b"\n\n") for r in reads)  # never half an event
    assert records == [(200, 5, 9)]  # the engine's usage, though only 2 chunks had text
    text = registry.render()
    assert 'traylm_prompt_tokens_total{model="m"} 5' in text
    assert 'traylm_generation_tokens_total{model="m"} 9' in text


async def test_without_usage_the_text_events_are_counted() -> None:
    records: list[tuple[int, int | None, int | None]] = []
    async for up in serve(upstream_app([ROLE, TOKEN, TOKEN, TOKEN, DONE])):
        app, _ = gateway_app(up, records)
        async for gw in serve(app):
            async with (
                aiohttp.ClientSession() as http,
                http.post(gw + "/v1/chat/completions", json={"stream": True}) as resp,
            ):
                assert await resp.read() == ROLE + TOKEN * 3 + DONE
    assert records == [(200, None, 3)]  # the role event is not a token


MESSAGES_STREAM = (
    b'event: message_start\ndata: {"type":"message_start","message":{"usage":'
    b'{"input_tokens":7,"output_tokens":1}}}\n\n'
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":"ab"}}\n\n'
    b'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":4}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)
RESPONSES_STREAM = (
    b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
    b'"delta":"ab"}\n\n'
    b'event: response.completed\ndata: {"type":"response.completed","response":{"usage":'
    b'{"input_tokens":6,"input_tokens_details":{"cached_tokens":0},"output_tokens":3,'
    b'"output_tokens_details":{"reasoning_tokens":0},"total_tokens":9}}}\n\n'
)


@pytest.mark.parametrize(
    ("stream", "counts"),
    [(MESSAGES_STREAM, (7, 4)), (RESPONSES_STREAM, (6, 3))],
    ids=["anthropic messages", "responses"],
)
async def test_usage_of_the_messages_and_responses_streams_is_counted(
    stream: bytes, counts: tuple[int, int]
) -> None:
    """Anthropic's message_start/message_delta and Responses' response.completed name their
    counts input_tokens/output_tokens: those are counted, not the number of events."""
    records: list[tuple[int, int | None, int | None]] = []
    async for up in serve(upstream_app([stream[:50], stream[50:]])):
        app, _ = gateway_app(up, records)
        async for gw in serve(app):
            async with (
                aiohttp.ClientSession() as http,
                http.post(gw + "/v1/chat/completions", json={"stream": True}) as resp,
            ):
                assert await resp.read() == stream
    assert records == [(200, *counts)]


async def test_a_client_that_goes_away_is_not_an_engine_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The client closes its connection mid-stream while the relay's handler runs on (aiohttp
    cancels it only with handler_cancellation), so the next write to it raises "Cannot write to
    closing transport", a ClientConnectionError like the engine's own failures: the request is
    recorded as 499 (client closed request) and the engine's response is closed (its next
    write fails: the engine aborts the request); no 502 is counted and nothing says the engine
    broke off the stream."""
    caplog.set_level(logging.INFO, logger="engines")
    engine_gone = asyncio.Event()

    async def endless(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            while True:
                await resp.write(TOKEN)
                await asyncio.sleep(0.01)  # a token now and then; asserts no timing
        except ConnectionError:
            engine_gone.set()
        return resp

    upstream = web.Application()
    upstream.router.add_post("/v1/chat/completions", endless)
    records: list[tuple[int, int | None, int | None]] = []
    async for up in serve(upstream):
        app, registry = gateway_app(up, records)
        async for gw in serve(app):
            async with aiohttp.ClientSession() as http:
                resp = await http.post(gw + "/v1/chat/completions", json={"stream": True})
                await resp.content.readuntil(b"\n\n")
                resp.close()  # the client goes away mid-stream
                await asyncio.wait_for(engine_gone.wait(), 30)
    assert records == [(499, None, None)]
    assert "traylm_errors_total{" not in registry.render()
    assert not [r for r in caplog.records if "broke off" in r.getMessage()]


async def test_a_cold_stream_whose_client_went_away_only_notes_it() -> None:
    """While a model loads, a streaming client gets SSE comments (ColdStream); when it goes away
    meanwhile, the next comment fails to write: that is noted (CLIENT_GONE, counted as 499 by
    the gateway), not raised into the load that other requests may wait for (which would be a
    500 with a traceback)."""
    outcome: dict[str, object] = {}
    comments_sent = asyncio.Event()

    async def loading(request: web.Request) -> web.StreamResponse:
        cold = ColdStream(request)
        await cold(LoadProgress("m", "weights", 1.0))
        comments_sent.set()
        while request.transport is not None and not request.transport.is_closing():
            await asyncio.sleep(0.01)  # until the client is gone; asserts no timing
        try:
            await cold(LoadProgress("m", "compile", 4.0))
            await cold(LoadProgress("m", "ready", 7.0))
        except Exception as exc:  # what the load would have seen
            outcome["raised"] = exc
        outcome["gone"] = request.get(CLIENT_GONE)
        assert cold.response is not None
        return cold.response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", loading)
    async for gw in serve(app):
        async with aiohttp.ClientSession() as http:
            resp = await http.post(gw + "/v1/chat/completions", json={"stream": True})
            assert await resp.content.readuntil(b"\n\n") == b": loading m (weights, 1 s)\n\n"
            await comments_sent.wait()
            resp.close()  # the client goes away while the model loads
            while "gone" not in outcome:
                await asyncio.sleep(0.01)
    assert "raised" not in outcome
    assert outcome["gone"] is True
