"""The followers' wait: a cancel that lands in the same loop turn as the queue's next item
(Ctrl-C while events stream) must stop the follower, never be swallowed."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable

import pytest

from engines.core.waiting import within

Wait = Callable[[asyncio.Queue[int]], Awaitable[int]]


async def _cancel_as_an_item_arrives(wait: Wait) -> tuple[bool, int]:
    """Whether the waiting task ended cancelled, and how many items the queue kept."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    task = asyncio.create_task(wait(queue))
    for _ in range(3):  # the task is waiting on queue.get()
        await asyncio.sleep(0)
    queue.put_nowait(1)
    task.cancel()  # in the same loop turn, as a SIGINT beside an event does
    try:
        await task
    except asyncio.CancelledError:
        return True, queue.qsize()
    return False, queue.qsize()


async def test_within_never_swallows_a_cancel_that_comes_with_an_item() -> None:
    cancelled, kept = await _cancel_as_an_item_arrives(lambda q: within(5.0, q.get()))
    assert cancelled and kept == 1


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="wait_for swallows the cancel on 3.11")
async def test_wait_for_on_3_11_swallows_that_cancel() -> None:
    """What the followers used before: the task returns the item as if never cancelled."""
    cancelled, kept = await _cancel_as_an_item_arrives(lambda q: asyncio.wait_for(q.get(), 5.0))
    assert not cancelled and kept == 0


async def test_within_still_times_out_and_returns_in_time() -> None:
    queue: asyncio.Queue[int] = asyncio.Queue()
    with pytest.raises(TimeoutError):
        await within(0.01, queue.get())
    queue.put_nowait(7)
    assert await within(5.0, queue.get()) == 7
