"""The relay when an engine or a client misbehaves, through the real daemon and the FAKE
engine: bytes that are not UTF-8, clients that never read, an engine declared dead or hung
mid-stream, and the daemon stopping mid-stream."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import socket
import struct
import time
import urllib.request
from collections.abc import Callable

import aiohttp
import openai
import pytest

from engines.core.procs import free_loopback_port
from engines.events import EngineState
from tests.conftest import DaemonFactory, RunningDaemon, fast_settings
from tests.engines.gateway.test_daemon_gateway import sdk, start_fake


async def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def fake_stats(d: RunningDaemon) -> dict[str, int]:
    engine = d.daemon.engine("fake")
    with urllib.request.urlopen(f"{engine.base_url}/fake/stats", timeout=10) as r:
        return dict(json.loads(r.read()))


async def test_bytes_that_are_not_utf8_reach_the_client_as_utf8(daemon: RunningDaemon) -> None:
    """The engine cuts a euro sign between two events and sends a stray 0xff byte: the openai
    SDK reads the whole reply (no UnicodeDecodeError), the euro sign whole, the stray byte as
    U+FFFD, and every byte the client gets is UTF-8."""
    await start_fake(daemon, args="--bad-utf8")
    client = sdk(daemon)
    stream = await client.chat.completions.create(
        model="fake", messages=[], max_tokens=5, stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    await client.close()
    assert text == "a€bc\ufffddw3 w4 "
    body = {"model": "fake", "messages": [], "max_tokens": 5, "stream": True}
    async with (
        aiohttp.ClientSession() as http,
        http.post(daemon.url + "/v1/chat/completions", json=body) as r,
    ):
        raw = await r.read()
    raw.decode("utf-8")  # strict: raises if any byte is not UTF-8
    assert raw.count(b"data: ") == 6 and raw.endswith(b"data: [DONE]\n\n")


async def _raw_stream_request(
    d: RunningDaemon, max_tokens: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw client connection that has sent a streamed chat request."""
    reader, writer = await asyncio.open_connection("127.0.0.1", d.port)
    body = json.dumps(
        {"model": "fake", "messages": [], "max_tokens": max_tokens, "stream": True}
    ).encode()
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
        b"Content-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )
    await writer.drain()
    return reader, writer


async def _non_reading_client(d: RunningDaemon, max_tokens: int) -> asyncio.StreamWriter:
    """A client that sends a streamed request and then never reads a byte."""
    _reader, writer = await _raw_stream_request(d, max_tokens)
    writer.transport.pause_reading()  # nothing read from here on
    return writer


@pytest.mark.slow
async def test_clients_that_never_read_lose_their_slots(daemon_factory, fake_env) -> None:
    """Streams whose clients read nothing are ended after gateway.client_stall_timeout_s and
    their requests aborted in the engine; the slots come back, and the engine (busy and slow to
    answer meanwhile) is not restarted for it. The limit is lowered (a live setting) only once
    every slot was seen held: on a loaded machine the 40 streams take a while to start."""
    settings = fast_settings(
        free_loopback_port(), max_concurrent=40, max_queue=0, client_stall_timeout_s=600.0
    )
    d: RunningDaemon = await daemon_factory(settings)
    await start_fake(d, args="--chunk-bytes 8192")
    engine = d.daemon.engine("fake")
    leader = engine.pid
    writers = [await _non_reading_client(d, 1_000_000) for _ in range(40)]
    try:
        await wait_until(lambda: fake_stats(d)["requests"] >= 40, "the streams to start")
        async with aiohttp.ClientSession() as http:
            body = {"model": "fake", "messages": [], "max_tokens": 1}
            async with http.post(d.url + "/v1/chat/completions", json=body) as r:
                assert r.status == 429  # every slot is held by a client that does not read
        await d.daemon.live.update({"gateway.client_stall_timeout_s": 2.0})
        await wait_until(lambda: fake_stats(d)["aborted"] >= 40, "the streams to be ended", 60)
        async with (
            aiohttp.ClientSession() as http,
            http.post(d.url + "/v1/chat/completions", json=body) as r,
        ):
            assert r.status == 200
        assert engine.state == EngineState.READY and engine.pid == leader
        assert engine.restarts == 0
    finally:
        for writer in writers:
            writer.close()


async def test_the_daemon_stopping_mid_stream_says_so(daemon_factory, fake_env) -> None:
    d: RunningDaemon = await daemon_factory()
    await start_fake(d, args="--token-delay 0.05")
    client = sdk(d)
    received: list[str] = []
    stream = await client.chat.completions.create(
        model="fake", messages=[], max_tokens=100_000, stream=True
    )
    try:
        async for chunk in stream:
            received.append(chunk.choices[0].delta.content or "")
            if len(received) == 3:
                d.daemon.request_stop("test")
    except openai.APIError as exc:
        assert "traylm is stopping" in str(exc) and "restarting" not in str(exc)
        assert exc.type == "traylm_stopping"  # not the engine's fault: the app keeps it
    else:
        raise AssertionError("the stream ended without saying why")
    finally:
        await client.close()


@pytest.mark.slow
async def test_a_hung_engine_tells_the_waiting_client_why(daemon_factory, fake_env) -> None:
    base = fast_settings(free_loopback_port())
    settings = dataclasses.replace(
        base, engines=dataclasses.replace(base.engines, stall_timeout_s=2.0)
    )
    d: RunningDaemon = await daemon_factory(settings)
    await start_fake(d, args="--stall-after-tokens 4 --token-delay 0.02")
    client = sdk(d)
    received: list[str] = []
    try:
        stream = await client.chat.completions.create(
            model="fake", messages=[], max_tokens=50, stream=True
        )
        async for chunk in stream:
            received.append(chunk.choices[0].delta.content or "")
    except openai.APIError as exc:
        message = str(exc)
    else:
        raise AssertionError("the stream ended without an error")
    finally:
        await client.close()
    assert len(received) == 4
    assert (
        "stopped in the middle of the reply: hung (1 request(s) in flight and no token" in message
    )
    assert "traylm is restarting it" in message


async def test_a_stopped_engine_tells_a_waiting_non_streamed_request(
    daemon_factory: DaemonFactory, fake_env
) -> None:
    """A request that is not streamed waits for the whole reply: when the engine is stopped
    under it (here by the user), it gets an answer at once, saying why."""
    d: RunningDaemon = await daemon_factory()
    await start_fake(d, args="--token-delay 1")
    async with aiohttp.ClientSession() as http:
        body = {"model": "fake", "messages": [], "max_tokens": 600}
        call = asyncio.create_task(http.post(d.url + "/v1/chat/completions", json=body))
        await wait_until(lambda: fake_stats(d)["requests"] >= 1, "the request to reach it")
        await d.client.stop("fake")
        r = await asyncio.wait_for(call, 30)
        data = await r.json()
    assert r.status == 503
    assert "engine fake was stopped" in data["error"]["message"]


async def _reset_mid_stream(d: RunningDaemon, read_bytes: int) -> None:
    """A client that reads ``read_bytes`` of a fast stream and then resets its connection
    (RST: SO_LINGER 0), so that the relay's next writes to it fail."""
    reader, writer = await _raw_stream_request(d, 1_000_000)
    await reader.readexactly(read_bytes)
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def test_clients_that_go_away_mid_stream_are_not_the_engines_fault(
    daemon_factory: DaemonFactory, fake_env, caplog: pytest.LogCaptureFixture
) -> None:
    """Clients reset their connections while the relay writes a fast stream to them (aiohttp
    then raises "Cannot write to closing transport", a ClientConnectionError, before it cancels
    the handler): every request counts as 499 (client closed request) and its engine request
    is aborted; none is a 502 or logged as the engine breaking off, and the engine is left
    alone."""
    caplog.set_level(logging.INFO, logger="engines")
    clients = 12
    d: RunningDaemon = await daemon_factory(fast_settings(free_loopback_port()))
    await start_fake(d, args="--chunk-bytes 8192")
    engine = d.daemon.engine("fake")
    leader = engine.pid
    for _ in range(clients):
        await _reset_mid_stream(d, 256 * 1024)
    await wait_until(lambda: fake_stats(d)["aborted"] >= clients, "the engine requests to end")
    metrics = d.daemon.ctx.metrics
    route = (("route", "/v1/chat/completions"),)

    def counted(status: str) -> float:
        return metrics.requests.values.get((*route, ("status", status)), 0.0)

    await wait_until(lambda: counted("499") + counted("200") >= clients, "the requests to end")
    assert counted("499") == clients, metrics.requests.values
    assert not metrics.errors.values, metrics.errors.values
    assert not [r for r in caplog.records if "broke off" in r.getMessage()]
    assert engine.state == EngineState.READY and engine.pid == leader
