"""The relay's own HTTP/1.1 client (engines/gateway/upstream_client.py) against real sockets: a
scripted loopback server writes replies byte for byte as engines (and broken engines) do."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from engines.core.procs import free_loopback_port
from engines.gateway.upstream_client import (
    HIGH_WATER,
    EngineBadReply,
    EngineBrokeOff,
    EngineUnreachable,
    UpstreamClient,
    UpstreamReply,
)

Reply = Sequence[bytes | None] | Callable[[bytes], Sequence[bytes | None]]


@dataclass
class Scripted:
    """A loopback server that answers each request with the next scripted reply, written in
    the pieces given (each its own write and flush); ``None`` closes the connection there."""

    replies: list[Reply]
    requests: list[bytes] = field(default_factory=list)
    connections: int = 0
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    url: str = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.replies:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                reply = self.replies.pop(0)
                pieces = reply(request) if callable(reply) else reply
                for piece in pieces:
                    if piece is None:
                        return
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0)
            await reader.read()  # until the client closes
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed.set()
            writer.close()


@contextlib.asynccontextmanager
async def scripted(*replies: Reply) -> AsyncIterator[Scripted]:
    s = Scripted(list(replies))
    server = await asyncio.start_server(s.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    s.url = f"http://127.0.0.1:{port}"
    try:
        yield s
    finally:
        server.close()


async def get(
    client: UpstreamClient, url: str, path: str = "/v1/x", body: bytes = b"{}"
) -> UpstreamReply:
    reply = await client.request(
        "POST",
        url,
        path,
        body=body,
        headers={"Content-Type": "application/json"},
        connect_timeout_s=5,
    )
    assert isinstance(reply, UpstreamReply)
    return reply


def chunked(*payloads: bytes, head: bytes = b"HTTP/1.1 200 OK\r\n") -> list[bytes]:
    out = [head + b"Content-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"]
    out += [b"%x\r\n%b\r\n" % (len(p), p) for p in payloads]
    return [*out, b"0\r\n\r\n"]


def fixed(body: bytes, status: bytes = b"200 OK", extra: bytes = b"") -> list[bytes]:
    return [b"HTTP/1.1 %b\r\nContent-Length: %d\r\n%b\r\n%b" % (status, len(body), extra, body)]


async def test_request_bytes_and_a_chunked_stream() -> None:
    events = [b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"]
    async with scripted(chunked(*events)) as s:
        client = UpstreamClient()
        reply = await client.request(
            "POST",
            s.url + "/base/",
            "/v1/chat/completions?x=1",
            body=b'{"a":1}',
            headers={"Content-Type": "application/json", "Authorization": "Bearer k"},
            connect_timeout_s=5,
        )
        assert reply.status == 200
        assert reply.headers["content-type"] == "text/event-stream"
        got = [piece async for piece in reply.content.iter_any()]
        reply.close()
        await client.close()
    assert b"".join(got) == b"".join(events)
    port = s.url.rsplit(":", 1)[1]
    assert s.requests == [
        b"POST /base/v1/chat/completions?x=1 HTTP/1.1\r\nHost: 127.0.0.1:"
        + port.encode()
        + b"\r\nContent-Type: application/json\r\nAuthorization: Bearer k\r\n"
        b"Content-Length: 7\r\n\r\n" + b'{"a":1}'
    ]


async def test_framing_cut_anywhere_gives_the_same_body() -> None:
    """Chunk extensions, a trailer, and the reply written one byte at a time."""
    whole = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n"
        b"1A\r\n" + b"z" * 26 + b"\r\n"
        b"0\r\nX-Trailer: t\r\n\r\n"
    )
    async with scripted([bytes([b]) for b in whole], fixed(b"next")) as s:
        client = UpstreamClient()
        reply = await get(client, s.url)
        assert await reply.read() == b"hello" + b"z" * 26
        reply.close()
        again = await get(client, s.url)  # the same connection: the trailer was read whole
        assert await again.read() == b"next"
        again.close()
        await client.close()
    assert s.connections == 1


async def test_length_close_delimited_informational_and_empty_replies() -> None:
    until_close = [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n", b"{}", b"[]", None]
    async with scripted(
        [b"HTTP/1.1 100 Continue\r\n\r\n", *fixed(b'{"ok":true}', extra=b"X-A: 1\r\n")],
        [b"HTTP/1.1 204 No Content\r\n\r\n"],
        until_close,
    ) as s:
        client = UpstreamClient()
        first = await get(client, s.url)
        assert (first.status, first.headers["X-A"], await first.read()) == (
            200,
            "1",
            b'{"ok":true}',
        )
        first.close()
        empty = await get(client, s.url)
        assert (empty.status, await empty.read()) == (204, b"")
        empty.close()
        last = await get(client, s.url)
        assert await last.read() == b"{}[]"  # a body without a length lasts until the close
        last.close()
        await client.close()
    assert s.connections == 1


async def test_connections_are_kept_and_not_reused_after_close() -> None:
    async with scripted(fixed(b"a"), fixed(b"b", extra=b"Connection: close\r\n"), fixed(b"c")) as s:
        client = UpstreamClient()
        for want in (b"a", b"b", b"c"):
            reply = await get(client, s.url)
            assert await reply.read() == want
            reply.close()
        await client.close()
    assert s.connections == 2  # a new one after "Connection: close"


async def test_a_kept_connection_closing_unseen_is_replaced() -> None:
    """A kept connection that began to close before the pool heard of it (its close is still
    on the way through the event loop): the request goes on a new one, nothing is sent twice."""
    async with scripted(fixed(b"a"), fixed(b"b")) as s:
        client = UpstreamClient()
        reply = await get(client, s.url)
        assert await reply.read() == b"a"
        reply.close()
        (kept,) = client._open
        assert kept._transport is not None
        kept._transport.close()  # is_closing() at once; connection_lost comes later
        reply = await get(client, s.url)
        assert await reply.read() == b"b"
        reply.close()
        await client.close()
    assert s.connections == 2
    assert len(s.requests) == 2


async def test_idle_close_seen_by_the_pool() -> None:
    async with scripted([*fixed(b"a"), None], fixed(b"b")) as s:
        client = UpstreamClient()
        reply = await get(client, s.url)
        assert await reply.read() == b"a"
        reply.close()
        await s.closed.wait()
        for _ in range(100):  # the FIN reaches the client's loop on a later turn
            if not client._open:
                break
            await asyncio.sleep(0.01)
        reply = await get(client, s.url)
        assert await reply.read() == b"b"
        reply.close()
        await client.close()
    assert s.connections == 2


async def test_closing_a_reply_midway_closes_its_connection() -> None:
    """The engine must see its client go (it then aborts the generation)."""
    async with scripted([chunked(b"data: 1\n\n")[0], b"9\r\ndata: 1\n\n\r\n"]) as s:
        client = UpstreamClient()
        reply = await get(client, s.url)
        async for piece in reply.content.iter_any():
            assert piece == b"data: 1\n\n"
            break
        reply.close()
        await asyncio.wait_for(s.closed.wait(), 10)
        assert not client._open
        await client.close()


@pytest.mark.parametrize(
    ("pieces", "error", "words"),
    [
        ([b"SSH-2.0-OpenSSH\r\n\r\n"], EngineBadReply, "Expected HTTP/"),
        ([b"HTTP/1.1 2000 OK\r\n\r\n"], EngineBadReply, "Invalid response status"),
        ([b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n"], EngineBadReply, "Invalid header token"),
        ([b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000], EngineBadReply, "the headers over"),
        (
            fixed(b"abcd", extra=b"Content-Length: 4\r\n"),
            EngineBadReply,
            "Duplicate Content-Length",
        ),
        (
            [b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"],
            EngineBadReply,
            "Transfer-Encoding can't be present with Content-Length",
        ),
        ([b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"], EngineBadReply, "Content-Length"),
        ([None], EngineUnreachable, "closed the connection before its reply"),
    ],
)
async def test_a_bad_head_is_an_error_of_the_request(
    pieces: list[bytes | None], error: type[Exception], words: str
) -> None:
    async with scripted(pieces) as s:
        client = UpstreamClient()
        with pytest.raises(error, match=words):
            await get(client, s.url)
        assert isinstance(error("x"), aiohttp.ClientConnectionError)  # the relay's 502
        await client.close()


@pytest.mark.parametrize(
    ("tail", "words"),
    [
        ([b"zz\r\n"], "Invalid character in chunk size"),
        ([b"-5\r\nhello\r\n"], "Invalid character in chunk size"),
        ([b"5\r\nhelloXX"], "Expected LF after chunk data"),
        ([b"5\r\nhel", None], "closed the connection mid-reply"),
        ([b"A" * 2000], "Chunk size overflow"),
    ],
)
async def test_a_broken_body_is_an_error_of_the_read(tail: list[bytes | None], words: str) -> None:
    async with scripted([chunked()[0], b"3\r\nabc\r\n", *tail]) as s:
        client = UpstreamClient()
        reply = await get(client, s.url)
        got = b""
        with pytest.raises(EngineBrokeOff, match=words):
            async for piece in reply.content.iter_any():
                got += piece
        assert got.startswith(b"abc")  # what came before the fault was delivered
        assert isinstance(EngineBrokeOff("x"), aiohttp.ClientPayloadError)
        reply.close()
        await client.close()


async def test_nothing_listening() -> None:
    client = UpstreamClient()
    with pytest.raises(EngineUnreachable, match="cannot connect to 127.0.0.1"):
        await get(client, f"http://127.0.0.1:{free_loopback_port()}")


async def test_a_header_with_a_line_break_is_not_sent() -> None:
    async with scripted(fixed(b"")) as s:
        client = UpstreamClient()
        with pytest.raises(ValueError, match="line break"):
            await client.request(
                "POST", s.url, "/", body=b"", headers={"X": "a\r\nHost: evil"}, connect_timeout_s=5
            )
        await client.close()
    assert s.requests == []


async def test_a_reader_far_behind_pauses_the_engine_socket() -> None:
    big = [b"x" * 65536] * 12  # 768 KiB, over the high-water mark
    async with scripted(chunked(*big)) as s:
        client = UpstreamClient()
        reply = await get(client, s.url)
        conn = reply._conn
        assert conn is not None
        for _ in range(500):  # wait (by events) until the client stopped reading
            if conn._paused:
                break
            await asyncio.sleep(0.01)
        assert conn._paused and conn._buffered > HIGH_WATER
        body = await reply.read()
        assert body == b"".join(big)
        assert not conn._paused
        reply.close()
        await client.close()


async def test_a_path_with_spaces_or_non_ascii_is_escaped() -> None:
    async with scripted(fixed(b"")) as s:
        client = UpstreamClient()
        reply = await get(client, s.url, path="/v1/responses/a b/ü%41?q=1")
        reply.close()
        await client.close()
    assert s.requests[0].startswith(b"POST /v1/responses/a%20b/%C3%BC%41?q=1 HTTP/1.1\r\n")


async def test_the_pool_forgets_engines_that_went_away() -> None:
    client = UpstreamClient()
    for _ in range(40):  # each its own port, as engines that stopped and started again
        async with scripted([*fixed(b"x"), None]) as s:  # the engine closes: gone
            reply = await get(client, s.url)
            assert await reply.read() == b"x"
            reply.close()
    assert len(client._idle) <= 33
    await client.close()


async def test_https_goes_through_aiohttp_and_checks_the_certificate(tmp_path: Path) -> None:
    """An attached server over https: aiohttp's client, which checks the certificate (one it
    does not trust is a connection error: the relay's 502), and asks for an uncompressed body
    (the relay drops Content-Encoding, so a compressed one would reach the client unreadable)."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    s = Scripted([fixed(b"secret")])
    server = await asyncio.start_server(s.handle, "127.0.0.1", 0, ssl=tls)
    url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    untrusting, trusting = (
        UpstreamClient(),
        UpstreamClient(tls=ssl.create_default_context(cafile=cert)),
    )
    try:
        with pytest.raises(aiohttp.ClientConnectionError, match="certificate"):
            await untrusting.request(
                "POST", url, "/v1/x", body=b"{}", headers={}, connect_timeout_s=5
            )
        assert s.requests == []  # nothing sent to a server whose certificate failed
        reply = await trusting.request(
            "POST", url, "/v1/x", body=b"{}", headers={"X-A": "1"}, connect_timeout_s=5
        )
        assert (reply.status, await reply.read()) == (200, b"secret")
        reply.close()
    finally:
        await untrusting.close()
        await trusting.close()
        server.close()
    head = s.requests[0].lower()
    assert b"accept-encoding: identity\r\n" in head and b"x-a: 1\r\n" in head


async def test_a_reused_connection_closed_before_the_reply_is_sent_again() -> None:
    """The engine closes an idle kept-alive connection just as the next request goes out on
    it (uvicorn's 5 s keep-alive): nothing of the reply came, so the request goes once more on
    a new connection instead of failing with a 502."""
    async with scripted(fixed(b"a"), [None], fixed(b"b")) as s:
        client = UpstreamClient()
        reply = await get(client, s.url)
        assert await reply.read() == b"a"
        reply.close()
        reply = await get(client, s.url, body=b'{"n": 2}')
        assert await reply.read() == b"b"
        reply.close()
        await client.close()
    assert s.connections == 2 and client.resent_total == 1
    assert [r.endswith(b'{"n": 2}') for r in s.requests] == [False, True, True]


@pytest.mark.parametrize(
    "second",
    [
        pytest.param([b"HTTP/1.1 200 OK\r\nContent-", None], id="part-of-a-head-came"),
        pytest.param([*chunked()[:1], None], id="the-head-came"),
    ],
)
async def test_a_reply_that_began_is_never_sent_again(second: list[bytes | None]) -> None:
    async with scripted(fixed(b"a"), second, fixed(b"b")) as s:
        client = UpstreamClient()
        reply = await get(client, s.url)
        assert await reply.read() == b"a"
        reply.close()
        with pytest.raises(aiohttp.ClientError):
            reply = await get(client, s.url)
            await reply.read()
        reply.close()
        await client.close()
    assert s.connections == 1 and client.resent_total == 0 and len(s.requests) == 2


async def test_a_new_connection_closed_before_the_reply_is_not_sent_again() -> None:
    async with scripted([None], fixed(b"b")) as s:
        client = UpstreamClient()
        with pytest.raises(EngineUnreachable, match="before its reply"):
            await get(client, s.url)
        await client.close()
    assert s.connections == 1 and client.resent_total == 0


async def test_a_connection_idle_longer_than_idle_s_is_not_reused() -> None:
    async with scripted(fixed(b"a"), fixed(b"b"), fixed(b"c")) as s:
        client = UpstreamClient(idle_s=0.5)
        for want in (b"a", b"b"):  # back to back: the same connection
            reply = await get(client, s.url)
            assert await reply.read() == want
            reply.close()
        assert s.connections == 1
        await asyncio.sleep(0.6)  # longer than idle_s (a sleep never ends early)
        reply = await get(client, s.url)
        assert await reply.read() == b"c"
        reply.close()
        await client.close()
    assert s.connections == 2 and client.resent_total == 0
