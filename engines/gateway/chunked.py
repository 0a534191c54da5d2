"""A streamed reply's events written straight to the client's socket as HTTP/1.1 chunks.

aiohttp's ``StreamResponse.write`` passes each event through two coroutines and its writer's
bookkeeping (compression, declared length, buffered headers, byte counters) before the socket
write; at one event per token that is a few microseconds a token the relay does not need once
the headers are out. ``DirectChunks`` frames the event the way aiohttp does (``<hex size>\\r\\n
<data>\\r\\n``) and writes it in one call. aiohttp's writer stays in charge of everything else:
the headers (the first event goes through it), the final empty chunk (``write_eof``), and the
back-pressure wait (``drain``: it returns at once unless the transport paused writing).
tests/perf/gateway_bench.py --paced measures the relay.
"""

from __future__ import annotations

import asyncio

from aiohttp import ClientConnectionResetError, hdrs, web
from aiohttp.abc import AbstractStreamWriter


class DirectChunks:
    """The writes of one streamed reply after its headers went out through aiohttp."""

    __slots__ = ("_transport", "_writer")

    def __init__(self, transport: asyncio.Transport, writer: AbstractStreamWriter) -> None:
        self._transport = transport
        self._writer = writer

    @classmethod
    def of(cls, request: web.Request, resp: web.StreamResponse) -> DirectChunks | None:
        """The direct writer of ``resp`` once something was written through aiohttp (which
        sends the headers held back for the first event), or None where aiohttp must keep
        writing: no chunked encoding (an HTTP/1.0 client), compression, or no transport."""
        transport = request.transport
        if transport is None or not resp.prepared or resp.compression:
            return None
        # aiohttp chunks a reply of unknown length to an HTTP/1.1 client (resp.chunked only
        # says whether it was asked to): its headers say what it did
        if resp.headers.get(hdrs.TRANSFER_ENCODING, "").lower() != "chunked":
            return None
        return cls(transport, request.writer)

    def write(self, data: bytes) -> bool:
        """Write ``data`` as one chunk. True when the socket did not take it all (the caller
        then awaits ``drain``, which waits only while the client is that far behind)."""
        transport = self._transport
        if transport.is_closing():
            raise ClientConnectionResetError("Cannot write to closing transport")
        transport.write(b"%x\r\n%b\r\n" % (len(data), data))
        return bool(transport.get_write_buffer_size())

    async def drain(self) -> None:
        await self._writer.drain()
