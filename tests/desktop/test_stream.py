"""The chat window's HTTP client against real loopback servers that misbehave on purpose: the
connection dropped mid-reply, nothing listening, a 401, and Stop (cancel) mid-stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from desktop.chat.stream import ChatDelta, ChatRequest, GatewayHTTP
from engines.procs import free_loopback_port

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
    return ChatRequest(1, "m", (("user", "hi"),), 0.7, 1.0, 100)


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
