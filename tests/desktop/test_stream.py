"""The chat window's HTTP client against real loopback servers that misbehave on purpose: the
connection dropped mid-reply, nothing listening, a 401, and Stop (cancel) mid-stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from desktop.daemon.gateway import ChatDelta, ChatRequest, GatewayHTTP
from engines.core.procs import free_loopback_port

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _chunk(text: str) -> bytes:
    data = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    return b"data: " + json.dumps(data).encode() + b"\n\n"


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    runners: list[web.AppRunner] = []

    async def start(handler: Handler) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handler)
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        port = free_loopback_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        return f"http://127.0.0.1:{port}"

    yield start
    for runner in runners:
        await runner.cleanup()


def _request() -> ChatRequest:
    return ChatRequest(1, "m", (("user", "hi", ()),), 0.7, 1.0, 100)


async def test_connection_dropped_mid_reply_keeps_the_partial_reply(serve) -> None:
    async def drop(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(_chunk("Hello") + _chunk(" world"))
        assert request.transport is not None
        request.transport.abort()  # the gateway process is gone: no [DONE], no clean end
        return resp

    posted: list[object] = []
    gateway = GatewayHTTP(posted.append)
    gateway.base_url = await serve(drop)
    ended = await gateway.stream_chat(_request())
    await gateway.close()
    assert ended.content == "Hello world" and ended.finish_reason == "interrupted"
    assert ended.error is not None and ended.error.kind == "connection_lost"
    assert "partial reply is kept" in ended.error.message
    assert "".join(p.text for p in posted if isinstance(p, ChatDelta)) == "Hello world"


async def test_nothing_listening_says_the_gateway_is_unreachable() -> None:
    gateway = GatewayHTTP(lambda _m: None)
    gateway.base_url = f"http://127.0.0.1:{free_loopback_port()}"
    ended = await gateway.stream_chat(_request())
    listed = await gateway.models()
    await gateway.close()
    assert ended.error is not None and ended.error.kind == "gateway_unreachable"
    assert "reconnects on its own" in ended.error.message
    assert listed.names == () and listed.error is not None
    assert listed.error.kind == "gateway_unreachable"


async def test_an_api_key_is_sent_and_401_is_reported(serve) -> None:
    seen: list[str] = []

    async def guarded(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("Authorization", ""))
        body = {"error": {"message": "missing or wrong API key", "type": "unauthorized"}}
        return web.json_response(body, status=401)

    gateway = GatewayHTTP(lambda _m: None)
    gateway.base_url = await serve(guarded)
    gateway.api_key = "tlm-abc"
    ended = await gateway.stream_chat(_request())
    await gateway.close()
    assert seen == ["Bearer tlm-abc"]
    assert ended.error is not None and ended.error.kind == "unauthorized"
    assert ended.error.http_status == 401


async def test_cancel_is_stop_and_keeps_what_arrived(serve) -> None:
    closed = asyncio.Event()

    async def slow(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for i in range(1000):
                await resp.write(_chunk(f"w{i} "))
                await asyncio.sleep(0.01)
        except (asyncio.CancelledError, ConnectionResetError):
            closed.set()  # the client went away: a real engine would abort the request
            raise
        return resp

    posted: list[object] = []
    gateway = GatewayHTTP(posted.append)
    gateway.base_url = await serve(slow)
    task = asyncio.create_task(gateway.stream_chat(_request()))
    while sum(isinstance(p, ChatDelta) for p in posted) < 2:
        await asyncio.sleep(0.01)
    task.cancel()
    ended = await task  # the Stop button: not an error, the reply so far is returned
    await asyncio.wait_for(closed.wait(), 5)
    await gateway.close()
    assert ended.finish_reason == "stopped" and ended.error is None
    assert ended.content.startswith("w0 w1 ")


async def test_a_reply_that_arrives_in_one_burst_claims_no_speed(serve) -> None:
    """A first reply held back on its way (a cold model's load) arrives in one burst: its
    tokens/s cannot be measured and none is claimed (it once said 82,005 tok/s). Tokens spread
    over time give their real rate."""
    usage = b'data: {"choices": [], "usage": {"completion_tokens": 400}}\n\n'

    async def burst(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(0.2)  # the load: the time to the first token
        await resp.write(b"".join(_chunk(f"w{i} ") for i in range(400)) + usage)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def paced(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(6):
            await resp.write(_chunk(f"w{i} "))
            await asyncio.sleep(0.03)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    gateway = GatewayHTTP(lambda _m: None)
    gateway.base_url = await serve(burst)
    ended = await gateway.stream_chat(_request())
    assert ended.completion_tokens == 400 and ended.ttft_s is not None and ended.ttft_s >= 0.2
    assert ended.tokens_per_s is None and "tokens_per_s" not in ended.stats()
    gateway.base_url = await serve(paced)
    ended = await gateway.stream_chat(_request())
    await gateway.close()
    # 5 tokens after the first, at least 0.03 s apart: never more than 5 / 0.15 s
    assert ended.tokens_per_s is not None and 0 < ended.tokens_per_s <= 5 / 0.15 + 0.01
