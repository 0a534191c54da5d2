"""Admission control: a concurrency limit per engine with a bounded, time-limited queue.

Past the limit a request waits in the queue; a full queue, or a wait longer than the queue
timeout, is refused with 429 and Retry-After. Nothing is ever dropped silently.

A low-priority request (a batch's line) waits in a queue of its own, bounded by nothing and
never timed out: it takes a slot only when no other request waits, and never the engine's
last one, so an interactive request always finds a slot or is next.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable

LOW_PRIORITY_HEADER = "X-Traylm-Low-Priority"
"""Marks a request of the daemon's own batches (honoured with the daemon's own credential only)."""
ENGINE_LOW_PRIORITY = 10
"""vLLM's ``priority`` for a low-priority request where its engine schedules by priority
(``--scheduling-policy priority``: the lower value goes first; 0 is every other request's)."""


class QueueFull(Exception):
    """The engine is at its concurrency limit and the queue is full (or the wait timed out)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Admission:
    """Slots for requests to one engine. The event loop runs one thing at a time, so taking a
    free slot needs no lock (every request passes here); a request past the limit waits on its
    own future, and a slot that frees passes straight to the longest waiter (first come, first
    served)."""

    def __init__(
        self,
        *,
        max_concurrent: int,
        max_queue: int,
        queue_timeout_s: float,
        on_busy: Callable[[], None] | None = None,
    ) -> None:
        """``on_busy``: called when a request takes a slot while none ran (the gateway's
        throughput reporter starts there)."""
        self.on_busy = on_busy
        self.max_concurrent = max_concurrent
        self.max_queue = max_queue
        self.queue_timeout_s = queue_timeout_s
        self.in_flight = 0
        self.idle_since_s: float | None = None
        """time.monotonic() when the last request ended with none left running or queued
        (None: none has ended yet); idle unload reads it."""
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._low: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def waiting(self) -> int:
        """Requests queued for a slot (low-priority ones included)."""
        return len(self._waiters) + len(self._low)

    @property
    def low_limit(self) -> int:
        """The most slots low-priority requests hold at once: all but one (at least one)."""
        return max(1, self.max_concurrent - 1)

    def slot(self, *, low: bool = False) -> _Slot:
        """``async with admission.slot():`` holds a slot for the request's whole life;
        ``low``: a low-priority request's."""
        return _Slot(self, low)

    async def _acquire_low(self) -> None:
        if self.in_flight < self.low_limit and not self._waiters and not self._low:
            self._take()
            return
        handed = asyncio.get_running_loop().create_future()
        self._low.append(handed)
        try:
            await handed
        except BaseException:
            if handed.done() and not handed.cancelled():
                self._release()  # the slot came with the cancel: it goes on
            else:
                handed.cancel()
                self._low.remove(handed)
            raise

    def _take(self) -> None:
        self.in_flight += 1
        if self.in_flight == 1 and self.on_busy is not None:
            self.on_busy()

    async def _acquire(self) -> None:
        if self.in_flight < self.max_concurrent and not self._waiters:
            self.in_flight += 1
            if self.in_flight == 1 and self.on_busy is not None:
                self.on_busy()
            return
        if len(self._waiters) >= self.max_queue:
            raise QueueFull(
                f"{self.in_flight} requests running and {len(self._waiters)} queued (the limit)"
            )
        handed = asyncio.get_running_loop().create_future()
        self._waiters.append(handed)
        try:
            async with asyncio.timeout(self.queue_timeout_s):
                await handed
        except BaseException as exc:
            if handed.done() and not handed.cancelled():
                self._release()  # the slot came with the timeout or cancel: it goes on
            else:
                handed.cancel()
                self._waiters.remove(handed)
            if isinstance(exc, TimeoutError):
                raise QueueFull(f"waited {self.queue_timeout_s:g} s in the queue") from None
            raise

    def _release(self) -> None:
        while self._waiters:
            handed = self._waiters.popleft()
            if not handed.done():
                handed.set_result(None)  # the slot passes on: in_flight stays as it is
                return
        while self._low and self.in_flight <= self.low_limit:
            handed = self._low.popleft()
            if not handed.done():
                handed.set_result(None)
                return
        self.in_flight -= 1
        if self.in_flight == 0:
            self.idle_since_s = time.monotonic()


class _Slot:
    __slots__ = ("_admission", "_low")

    def __init__(self, admission: Admission, low: bool) -> None:
        self._admission = admission
        self._low = low

    async def __aenter__(self) -> None:
        if self._low:
            await self._admission._acquire_low()
        else:
            await self._admission._acquire()

    async def __aexit__(self, *exc: object) -> None:
        self._admission._release()
