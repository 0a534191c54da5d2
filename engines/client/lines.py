"""The lines of a daemon's stream, of any length: aiohttp's own line reader (``async for line
in resp.content``) refuses a line past its 128 KiB-512 KiB buffer (``LineTooLong``), and an
exported request or an event can be longer. Bounded by ``max_bytes`` all the same (a line
still growing past it is a daemon gone wrong: the stream ends with a clear error)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from engines.errors import DaemonUnavailable

if TYPE_CHECKING:  # aiohttp is imported when a call is made (the CLI starts fast)
    import aiohttp

LINE_MAX_BYTES = 1 << 30
"""The longest line taken (an export's row holds at most three bodies of
``requests.body_max_bytes``, escaped as JSON)."""


async def lines(
    content: aiohttp.StreamReader, max_bytes: int = LINE_MAX_BYTES
) -> AsyncIterator[bytes]:
    """Each line with its ``\\n`` (the last one without, when the stream ends mid-line)."""
    held = bytearray()
    async for chunk in content.iter_any():
        start = 0
        while (end := chunk.find(b"\n", start)) != -1:
            held += chunk[start : end + 1]
            yield bytes(held)
            held.clear()
            start = end + 1
        held += chunk[start:]
        if len(held) > max_bytes:
            raise DaemonUnavailable(
                f"the daemon sent a line of more than {max_bytes} bytes; stopped reading it"
            )
    if held:
        yield bytes(held)
