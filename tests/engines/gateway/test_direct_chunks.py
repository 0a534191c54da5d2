"""A streamed reply written straight to the client's socket once its headers are out
(engines/gateway/chunked.py), through the real daemon and the FAKE engine: valid HTTP/1.1 chunks
with every event in order, also for a client that lags far behind (the writes then wait for it),
and aiohttp's own writes for an HTTP/1.0 client, which gets no chunked encoding. Also how the
request body is read before that: at once when it came with the head, else within a time
limit."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from engines.core.procs import free_loopback_port
from engines.gateway.chunked import DirectChunks
from tests.conftest import RunningDaemon, fast_settings
from tests.engines.gateway.test_daemon_gateway import start_fake


async def _request(d: RunningDaemon, version: bytes, max_tokens: int, *, rcvbuf: int = 0):  # type: ignore[no-untyped-def]
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", d.port))
    sock.setblocking(False)
    reader, writer = await asyncio.open_connection(sock=sock, limit=2**22)
    body = json.dumps(
        {"model": "fake", "messages": [], "max_tokens": max_tokens, "stream": True}
    ).encode()
    writer.write(
        b"POST /v1/chat/completions HTTP/" + version + b"\r\nHost: localhost\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)
    )
    await writer.drain()
    return reader, writer


def dechunk(body: bytes) -> bytes:
    """The data of an HTTP/1.1 chunked body, read strictly (bad framing fails the test)."""
    out, at = [], 0
    while True:
        line_end = body.index(b"\r\n", at)
        size = int(body[at:line_end], 16)
        start = line_end + 2
        assert body[start + size : start + size + 2] == b"\r\n", f"chunk at {at} not closed"
        if size == 0:
            assert start + 2 == len(body), "bytes after the last chunk"
            return b"".join(out)
        out.append(body[start : start + size])
        at = start + size + 2


def tokens(events: bytes) -> list[str]:
    """The delta texts of the events (padding stripped), in order; the stream must end with [DONE]."""
    assert events.endswith(b"data: [DONE]\n\n"), events[-200:]
    texts = []
    for event in events.split(b"\n\n")[:-2]:
        assert event.startswith(b"data: {"), event[:80]
        for choice in json.loads(event[6:])["choices"]:
            texts.append((choice["delta"].get("content") or "").rstrip())
    return [t for t in texts if t]


async def test_events_go_out_as_valid_chunks_in_order(daemon: RunningDaemon) -> None:
    await start_fake(daemon)
    reader, writer = await _request(daemon, b"1.1", 50)
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"Transfer-Encoding: chunked" in head
    body = await reader.readuntil(b"\r\n0\r\n\r\n")  # the connection stays open (keep-alive)
    writer.close()
    assert tokens(dechunk(body)) == [f"w{i}" for i in range(50)]


@pytest.mark.slow
async def test_a_client_that_lags_far_behind_gets_every_event(
    daemon: RunningDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """16 KiB events into a small receive buffer read slowly: the kernel's buffers fill, the
    relay's writes wait for the client (back-pressure) instead of piling up or dropping."""
    waits: list[int] = []
    drain = DirectChunks.drain

    async def counted(self: DirectChunks) -> None:
        waits.append(1)
        await drain(self)

    monkeypatch.setattr(DirectChunks, "drain", counted)
    await start_fake(daemon, args="--chunk-bytes 16384")
    reader, writer = await _request(daemon, b"1.1", 400, rcvbuf=4096)
    head = await reader.readuntil(b"\r\n\r\n")
    assert b"Transfer-Encoding: chunked" in head
    body = b""
    while not body.endswith(b"\r\n0\r\n\r\n"):
        piece = await asyncio.wait_for(reader.read(16384), 60)
        assert piece, "the stream ended early"
        body += piece
        await asyncio.sleep(0.01)  # at most 1.6 MB/s: far slower than the engine writes
    writer.close()
    assert len(body) > 400 * 16384
    assert waits, "the client never fell behind: the test did not exercise back-pressure"
    assert tokens(dechunk(body)) == [f"w{i}" for i in range(400)]


async def test_an_http_1_0_client_gets_the_stream_unchunked(daemon: RunningDaemon) -> None:
    await start_fake(daemon)
    reader, writer = await _request(daemon, b"1.0", 20)
    raw = await asyncio.wait_for(reader.read(), 60)  # HTTP/1.0: the end is the connection's
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200") and b"chunked" not in head.lower()
    assert tokens(body) == [f"w{i}" for i in range(20)]


@pytest.mark.slow
async def test_a_body_that_stops_arriving_is_408_and_one_in_pieces_is_served(
    daemon_factory, fake_env
) -> None:  # type: ignore[no-untyped-def]
    """A JSON body that came with its head is read at once; one that comes later must come
    whole within gateway.body_timeout_s, else 408 (a slow client holds a task and a socket)."""
    d: RunningDaemon = await daemon_factory(fast_settings(free_loopback_port(), body_timeout_s=1.0))
    await start_fake(d)
    body = json.dumps({"model": "fake", "messages": [], "max_tokens": 3}).encode()
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", d.port)
    writer.write(head + body[:10])
    await writer.drain()
    await asyncio.sleep(0.3)  # well inside the timeout: the rest comes in a second piece
    writer.write(body[10:])
    answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", d.port)
    writer.write(head + body[:10])  # and the rest never
    answer = await asyncio.wait_for(reader.read(), 30)  # 408, then the connection is closed
    writer.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"gateway.body_timeout_s" in answer
