"""Low-priority requests (a batch's lines) in the gateway's admission: they take a slot only
when no interactive request waits, never the engine's last free one, queue without bound or
timeout, and a low waiter that goes away loses no slot."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from engines.gateway.admission import Admission


async def settled(check: Callable[[], bool]) -> None:
    """Let the other tasks run until ``check`` holds (each step is one pass of the loop)."""
    async with asyncio.timeout(10):
        while not check():
            await asyncio.sleep(0)


async def test_interactive_requests_go_before_waiting_low_ones() -> None:
    adm = Admission(max_concurrent=2, max_queue=1, queue_timeout_s=0.05)
    order: list[str] = []
    release = asyncio.Event()

    async def job(name: str, *, low: bool) -> None:
        async with adm.slot(low=low):
            order.append(name)
            await release.wait()

    first_low = asyncio.create_task(job("low-0", low=True))
    await settled(lambda: order == ["low-0"])
    lows = [asyncio.create_task(job(f"low-{n}", low=True)) for n in (1, 2, 3)]
    await settled(lambda: adm.waiting == 3)
    assert adm.in_flight == 1  # the last slot stays free for an interactive request
    chat = asyncio.create_task(job("chat", low=False))
    await settled(lambda: "chat" in order)  # at once, past three waiting low ones
    later = asyncio.create_task(job("later", low=False))
    await settled(lambda: adm.waiting == 4)
    release.set()
    await asyncio.gather(first_low, chat, later, *lows)
    assert order[:3] == ["low-0", "chat", "later"], order
    assert order[3:] == ["low-1", "low-2", "low-3"]
    assert adm.in_flight == 0 and adm.waiting == 0


async def test_low_ones_wait_past_the_queue_limit_and_timeout() -> None:
    adm = Admission(max_concurrent=1, max_queue=1, queue_timeout_s=0.01)
    held = adm.slot()
    await held.__aenter__()
    got: list[int] = []

    async def low(n: int) -> None:
        async with adm.slot(low=True):
            got.append(n)

    waiting = [asyncio.create_task(low(n)) for n in range(5)]  # more than max_queue
    await settled(lambda: adm.waiting == 5)
    await asyncio.sleep(0.05)  # past the queue timeout: none of them is refused
    assert not any(t.done() for t in waiting)
    gone = waiting.pop(0)
    gone.cancel()
    await settled(lambda: adm.waiting == 4)
    await held.__aexit__(None, None, None)
    await asyncio.gather(*waiting)
    assert got == [1, 2, 3, 4] and adm.in_flight == 0 and adm.waiting == 0
