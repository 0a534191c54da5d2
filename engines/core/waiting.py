"""Waiting with a time limit that never loses a cancel.

On Python 3.11 ``asyncio.wait_for`` returns the result when the waiting task is cancelled in
the same loop turn as the awaited thing completes: the cancel (Ctrl-C, through asyncio.run) is
swallowed and the follower goes on waiting. ``within`` awaits in the caller's own task under
``asyncio.timeout``, so a cancel always raises CancelledError (and a queue keeps its item).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(timeout_s: float | None, aw: Awaitable[T]) -> T:
    """``await aw``, or TimeoutError after ``timeout_s`` (None: no limit)."""
    async with asyncio.timeout(timeout_s):
        return await aw
