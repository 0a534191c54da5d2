"""The daemon's event bus: fan-out of frozen events to any number of subscribers.

``publish`` is called on the event loop thread (threads use ``publish_threadsafe``). Each
subscriber has a bounded queue; a subscriber too slow to keep up loses its oldest events, never
blocks the publisher, and is told how many it lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

from engines.events.codec import Event

log = logging.getLogger(__name__)


class Subscription:
    def __init__(self, kinds: frozenset[str] | None, size: int) -> None:
        self.kinds = kinds
        self.queue: asyncio.Queue[Event] = asyncio.Queue(maxsize=size)
        self.dropped = 0

    def offer(self, event: Event) -> None:
        if self.kinds is not None and not _matches(event.kind, self.kinds):
            return
        if self.queue.full():
            with contextlib.suppress(asyncio.QueueEmpty):
                self.queue.get_nowait()
            self.dropped += 1
        self.queue.put_nowait(event)

    async def get(self) -> Event:
        return await self.queue.get()


def _matches(kind: str, kinds: frozenset[str]) -> bool:
    """``engine`` matches ``engine.state`` and ``engine.log``; exact names match themselves."""
    return kind in kinds or kind.split(".", 1)[0] in kinds


class EventBus:
    def __init__(self, queue_size: int = 2000) -> None:
        self._subs: set[Subscription] = set()
        self._queue_size = queue_size
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def publish(self, event: Event) -> None:
        for sub in list(self._subs):
            sub.offer(event)

    def publish_threadsafe(self, event: Event) -> None:
        """For threads (the GPU sampler, download watchers): hand the event to the loop."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.publish, event)

    @contextlib.contextmanager
    def subscribe(self, kinds: frozenset[str] | None = None) -> Iterator[Subscription]:
        sub = Subscription(kinds, self._queue_size)
        self._subs.add(sub)
        try:
            yield sub
        finally:
            self._subs.discard(sub)

    @property
    def subscriber_count(self) -> int:
        return len(self._subs)
