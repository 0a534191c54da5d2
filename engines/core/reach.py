"""Whether a server answers at all, in a few seconds: a TCP connection to its host. Used before
work that would otherwise wait for a long network timeout to learn there is no network (the
Hub before a start that needs it, a package index before pip)."""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit

REACH_TIMEOUT_S = 3.0


async def reachable(url: str, timeout_s: float = REACH_TIMEOUT_S) -> bool:
    parts = urlsplit(url)
    if not parts.hostname:
        return False
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(parts.hostname, port), timeout_s)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True
