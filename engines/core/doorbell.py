"""``Doorbell``: how a batching writer sleeps while there is nothing to write.

The usage log and the flight recorder write what the gateway hands them in batches, one per
period. Polling every period kept an idle daemon waking several times a second; with a doorbell
the writer sleeps until the first item arrives (``ring``, one attribute test on the request's
path), then waits one period so what follows goes in the same batch.
"""

from __future__ import annotations

import asyncio
import contextlib


class Doorbell:
    """Rung from the event loop's thread (the gateway's handlers); waited on by one task."""

    __slots__ = ("_rung",)

    def __init__(self) -> None:
        self._rung = asyncio.Event()

    def ring(self) -> None:
        if not self._rung.is_set():
            self._rung.set()

    async def wait(self, timeout_s: float) -> None:
        """Until rung (at once if it was rung since the last wait) or ``timeout_s``."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._rung.wait()
        self._rung.clear()
