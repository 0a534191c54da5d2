"""Admission control: a concurrency limit per engine with a bounded, time-limited queue.

Past the limit a request waits in the queue; a full queue, or a wait longer than the queue
timeout, is refused with 429 and Retry-After. Nothing is ever dropped silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator


class QueueFull(Exception):
    """The engine is at its concurrency limit and the queue is full (or the wait timed out)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Admission:
    def __init__(self, *, max_concurrent: int, max_queue: int, queue_timeout_s: float) -> None:
        self.max_concurrent = max_concurrent
        self.max_queue = max_queue
        self.queue_timeout_s = queue_timeout_s
        self.in_flight = 0
        self.waiting = 0
        self.idle_since_s: float | None = None
        """time.monotonic() when the last request ended with none left running or queued
        (None: none has ended yet); idle unload reads it."""
        self._cond = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        await self._acquire()
        try:
            yield
        finally:
            await self._release()

    async def _acquire(self) -> None:
        async with self._cond:
            if self.in_flight < self.max_concurrent and self.waiting == 0:
                self.in_flight += 1
                return
            if self.waiting >= self.max_queue:
                raise QueueFull(
                    f"{self.in_flight} requests running and {self.waiting} queued (the limit)"
                )
            self.waiting += 1
            try:
                await asyncio.wait_for(
                    self._cond.wait_for(lambda: self.in_flight < self.max_concurrent),
                    self.queue_timeout_s,
                )
            except TimeoutError:
                self._cond.notify(1)  # a wake-up this waiter may have consumed goes on
                raise QueueFull(f"waited {self.queue_timeout_s:g} s in the queue") from None
            finally:
                self.waiting -= 1
            self.in_flight += 1

    async def _release(self) -> None:
        async with self._cond:
            self.in_flight -= 1
            if self.in_flight == 0 and self.waiting == 0:
                self.idle_since_s = time.monotonic()
            self._cond.notify(1)
