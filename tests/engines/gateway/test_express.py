"""The express lane (engines/gateway/express.py) through the real daemon and the FAKE engine:
which requests take it, that its answers read as the full path's, kept-alive connections moving
between it and aiohttp, bodies that come after their head, pipelined requests, and streams that
outlive aiohttp's keep-alive timer. The relay's fault tests (test_relay_faults.py) run through
it too: their streamed requests take the lane."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from typing import Any

import aiohttp
import openai
import pytest

from engines.gateway.express import ExpressLane
from engines.gateway.security import hash_key
from engines.procs import free_loopback_port
from tests.conftest import RunningDaemon, fast_settings
from tests.engines.gateway.test_relay_faults import fake_stats, wait_until
from tests.engines.gateway.test_storage_bounds import usage_rows
from tests.engines.test_daemon_gateway import sdk, start_fake

KEY = "tlm-test-key"
STREAM = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def served_now(d: RunningDaemon) -> float:
    lane = d.daemon.gate.lane
    assert isinstance(lane, ExpressLane)
    return sum(lane.served.values.values())


async def start_warm(
    d: RunningDaemon, *, args: str = "", headers: dict[str, str] | None = None
) -> None:
    """The FAKE engine, ready and asked once: the first request to an engine's start takes
    the full path, which works out what the engine serves (the lane needs to know)."""
    await start_fake(d, args=args)
    body = {**STREAM, "max_tokens": 1}
    async with (
        aiohttp.ClientSession() as http,
        http.post(d.url + "/v1/chat/completions?warm", json=body, headers=headers) as r,
    ):
        assert r.status == 200, await r.text()


async def served(d: RunningDaemon) -> int:
    """Requests the lane served, as /metrics says (keys open it too)."""
    keys = bool(d.daemon.settings.gateway.api_key_sha256)
    headers = {"Authorization": f"Bearer {KEY}"} if keys else None
    async with (
        aiohttp.ClientSession() as http,
        http.get(d.url + "/metrics", headers=headers) as r,
    ):
        text = await r.text()
    found = re.search(r"^traylm_express_requests_total (\d+)", text, re.MULTILINE)
    count = int(found[1]) if found else 0
    assert count == served_now(d)
    return count


def request_bytes(port: int, body: dict[str, object], *, extra: str = "") -> tuple[bytes, bytes]:
    data = json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\n{extra}Content-Length: {len(data)}\r\n\r\n"
    ).encode()
    return head, data


async def read_chunked_reply(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One chunked HTTP/1.1 reply: (head, body)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
    body = b""
    while True:
        size = int((await asyncio.wait_for(reader.readuntil(b"\r\n"), 20)).strip(), 16)
        chunk = await reader.readexactly(size + 2)
        if not size:
            return head, body
        body += chunk[:-2]


async def test_a_stream_takes_the_lane_and_reads_as_the_full_path(daemon: RunningDaemon) -> None:
    """The same request through the lane and through the full path (a query string sends it
    there): the same status, headers and events; only the first counts as the lane's."""
    await start_warm(daemon)
    replies = []
    async with aiohttp.ClientSession() as http:
        for path in ("/v1/chat/completions", "/v1/chat/completions?via=full"):
            async with http.post(daemon.url + path, json={**STREAM, "stream": True}) as r:
                replies.append((r.status, r.headers, await r.read()))
    assert await served(daemon) == 1
    (status, headers, body), (full_status, full_headers, full_body) = replies
    assert status == full_status == 200
    for name in ("Content-Type", "Cache-Control", "X-Traylm-Engine", "Transfer-Encoding"):
        assert headers[name] == full_headers[name], name
    assert "Date" in headers

    def contents(raw: bytes) -> list[str]:
        events = [e for e in raw.split(b"\n\n") if e.startswith(b"data: {")]
        return [
            (json.loads(e[6:])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
            for e in events
        ]

    assert contents(body) == contents(full_body) == ["w0 ", "w1 ", "w2 "]
    assert body.endswith(b"data: [DONE]\n\n") and full_body.endswith(b"data: [DONE]\n\n")


async def test_one_connection_moves_between_the_lane_and_aiohttp(daemon: RunningDaemon) -> None:
    """On one kept-alive connection: streams take the lane, a model list and a non-streamed
    request take aiohttp, and the next stream takes the lane again."""
    await start_warm(daemon)
    connections = 0

    async def opened(*_: object) -> None:
        nonlocal connections
        connections += 1

    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(opened)
    connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=connector, trace_configs=[trace]) as http:
        for step in ("stream", "models", "stream", "whole", "stream", "stream"):
            if step == "models":
                async with http.get(daemon.url + "/v1/models") as r:
                    assert r.status == 200
                continue
            body = {**STREAM, "stream": step == "stream"}
            async with http.post(daemon.url + "/v1/chat/completions", json=body) as r:
                assert r.status == 200, await r.text()
                text = await r.text()
                assert "w2" in text
    assert connections == 1
    assert await served(daemon) == 4


async def test_requests_the_lane_leaves_to_the_full_path(daemon_factory, fake_env) -> None:
    """A missing key, an Origin, a Host not allowed: answered as before (401 in OpenAI's
    shape, 403), and none served by the lane; a request with the key is."""
    key = "tlm-test-key"
    d = await daemon_factory(fast_settings(free_loopback_port(), api_key_sha256=(hash_key(key),)))
    auth = {"Authorization": f"Bearer {KEY}"}
    await start_warm(d, headers=auth)
    body = {**STREAM, "stream": True}
    async with aiohttp.ClientSession() as http:
        async with http.post(d.url + "/v1/chat/completions", json=body) as r:
            assert r.status == 401
            assert "API key" in (await r.json())["error"]["message"]
        headers = {**auth, "Origin": "http://evil.example"}
        async with http.post(d.url + "/v1/chat/completions", json=body, headers=headers) as r:
            assert r.status == 403
        headers = {**auth, "Host": "rebind.example"}
        async with http.post(d.url + "/v1/chat/completions", json=body, headers=headers) as r:
            assert r.status == 403
        assert await served(d) == 0
        async with http.post(d.url + "/v1/chat/completions", json=body, headers=auth) as r:
            assert r.status == 200 and "w2" in await r.text()
        assert await served(d) == 1


async def test_the_lane_turned_off(daemon_factory, fake_env) -> None:
    """gateway.express_lane = false: every request takes the full path."""
    off = await daemon_factory(fast_settings(free_loopback_port(), express_lane=False))
    await start_warm(off)
    async with (
        aiohttp.ClientSession() as http,
        http.post(off.url + "/v1/chat/completions", json={**STREAM, "stream": True}) as r,
    ):
        assert r.status == 200 and "w2" in await r.text()
    assert await served(off) == 0


async def test_a_body_after_its_head_and_a_request_pipelined_behind(
    daemon: RunningDaemon,
) -> None:
    """A client that writes the head and the body apart (httpx does) is still served by the
    lane once the body is whole; a second request sent while the first streams is answered
    after it, on the same connection."""
    await start_warm(daemon, args="--token-delay 0.05")
    reader, writer = await asyncio.open_connection("127.0.0.1", daemon.port)
    head, data = request_bytes(daemon.port, {**STREAM, "stream": True})
    writer.write(head)
    await writer.drain()
    await asyncio.sleep(0.2)  # the head alone first: the lane holds it for the body
    writer.write(data)
    first = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
    assert first.startswith(b"HTTP/1.1 200")
    writer.write(b"".join(request_bytes(daemon.port, {**STREAM, "stream": True})))
    await writer.drain()
    size = int((await reader.readuntil(b"\r\n")).strip(), 16)  # the first reply goes on
    rest = (await reader.readexactly(size + 2))[:-2]
    while size:
        size = int((await asyncio.wait_for(reader.readuntil(b"\r\n"), 20)).strip(), 16)
        rest += (await reader.readexactly(size + 2))[:-2]
    assert rest.endswith(b"data: [DONE]\n\n") and b"w2" in rest
    second_head, second = await read_chunked_reply(reader)
    assert second_head.startswith(b"HTTP/1.1 200") and second.endswith(b"data: [DONE]\n\n")
    writer.close()
    assert await served(daemon) == 2


async def test_a_stream_outlives_aiohttps_keep_alive_and_idle_closes(
    daemon_factory, fake_env
) -> None:
    """A connection aiohttp served first, then a stream on the lane that lasts longer than
    gateway.keepalive_timeout_s: aiohttp's keep-alive timer does not cut it; once idle for that
    long after it, the connection is closed."""
    d = await daemon_factory(fast_settings(free_loopback_port(), keepalive_timeout_s=1.0))
    await start_warm(d, args="--token-delay 0.5")
    reader, writer = await asyncio.open_connection("127.0.0.1", d.port)
    writer.write(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{d.port}\r\n\r\n".encode())
    health = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
    assert health.startswith(b"HTTP/1.1 200")
    length = re.search(rb"Content-Length: (\d+)", health)
    assert length is not None
    await reader.readexactly(int(length[1]))
    writer.write(b"".join(request_bytes(d.port, {**STREAM, "max_tokens": 5, "stream": True})))
    head, body = await read_chunked_reply(reader)  # 5 tokens, 0.5 s apart: 2.5 s
    assert head.startswith(b"HTTP/1.1 200") and body.endswith(b"data: [DONE]\n\n")
    assert b"w4" in body
    assert await served(d) == 1
    assert await asyncio.wait_for(reader.read(), 10) == b""  # closed after 1 s idle
    writer.close()


async def test_a_client_gone_mid_stream_aborts_the_engines_request(
    daemon: RunningDaemon,
) -> None:
    """The lane's client closes its connection mid-stream: the engine's request is aborted,
    and the usage log says 499 (client closed request)."""
    await start_warm(daemon, args="--token-delay 0.2")
    reader, writer = await asyncio.open_connection("127.0.0.1", daemon.port)
    writer.write(b"".join(request_bytes(daemon.port, {**STREAM, "max_tokens": 50, "stream": True})))
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
    assert head.startswith(b"HTTP/1.1 200")
    writer.transport.abort()
    await wait_until(lambda: fake_stats(daemon)["aborted"] >= 1, "the engine's request to end")
    await wait_until(lambda: served_now(daemon) == 1, "the lane to end it")
    assert [row["status"] for row in await usage_rows(daemon)] == [200, 499]  # warm-up, this
    requests = daemon.daemon.ctx.metrics.requests.values
    assert requests[(("route", "/v1/chat/completions"), ("status", "499"))] == 1.0


@pytest.mark.parametrize("content_length", ["12x", ""])
async def test_a_bad_length_goes_to_aiohttp(daemon: RunningDaemon, content_length: str) -> None:
    """Heads the lane cannot read with certainty get aiohttp's own answer."""
    await start_warm(daemon)
    reader, writer = await asyncio.open_connection("127.0.0.1", daemon.port)
    length = f"Content-Length: {content_length}\r\n" if content_length else ""
    writer.write(
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{daemon.port}\r\n{length}\r\n"
        "{}".encode()
    )
    answer = await asyncio.wait_for(reader.read(65536), 20)
    assert answer.split(b"\r\n")[0].endswith(b" 400 Bad Request"), answer[:200]
    writer.close()
    assert await served(daemon) == 0


async def lane_stream_error(
    d: RunningDaemon, max_tokens: int, during: Any = None
) -> tuple[list[str], openai.APIError]:
    """Stream through the lane with the openai SDK until it raises; ``during(received)`` runs
    after each chunk."""
    client = sdk(d)
    received: list[str] = []
    before = served_now(d)
    try:
        stream = await client.chat.completions.create(
            model="fake", messages=[], max_tokens=max_tokens, stream=True
        )
        async for chunk in stream:
            received.append(chunk.choices[0].delta.content or "")
            if during is not None:
                during(received)
    except openai.APIError as exc:
        error = exc
    else:
        raise AssertionError("the stream ended without an error")
    finally:
        await client.close()
    await wait_until(lambda: served_now(d) == before + 1, "the lane to end the request")
    return received, error


async def test_an_engine_that_dies_mid_stream_on_the_lane(daemon: RunningDaemon) -> None:
    """The engine is killed after 4 tokens: the SDK gets them, then an APIError that says the
    engine stopped mid-reply."""
    await start_warm(daemon, args="--crash-after-tokens 4 --token-delay 0.02")
    received, error = await lane_stream_error(daemon, 50)
    assert received == ["w0 ", "w1 ", "w2 ", "w3 "]
    assert "stopped in the middle of the reply" in str(error)


async def test_a_hung_engine_on_the_lane_tells_the_client_why(daemon_factory, fake_env) -> None:
    """The supervisor declares the engine hung mid-stream: the lane's client is told why."""
    base = fast_settings(free_loopback_port())
    settings = dataclasses.replace(
        base, engines=dataclasses.replace(base.engines, stall_timeout_s=2.0)
    )
    d: RunningDaemon = await daemon_factory(settings)
    await start_warm(d, args="--stall-after-tokens 5 --token-delay 0.02")  # 1 for the warm-up
    received, error = await lane_stream_error(d, 50)
    assert len(received) == 4
    assert "stopped in the middle of the reply: hung" in str(error)


async def test_the_daemon_stopping_mid_stream_on_the_lane(daemon_factory, fake_env) -> None:
    d: RunningDaemon = await daemon_factory()
    await start_warm(d, args="--token-delay 0.05")

    def stop_at_three(received: list[str]) -> None:
        if len(received) == 3:
            d.daemon.request_stop("test")

    _, error = await lane_stream_error(d, 100_000, stop_at_three)
    assert "traylm is stopping" in str(error)
    assert error.type == "traylm_stopping"
