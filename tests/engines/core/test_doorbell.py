"""The doorbell the batching writers sleep on (engines/core/doorbell.py), and the flight
recorder's writer asleep while nothing is recorded (an idle daemon must not poll)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from engines.core.doorbell import Doorbell
from engines.recorder.service import RequestRecorder
from tests.engines.recorder.test_recorder_parts import exchange, settings


async def test_a_ring_wakes_the_waiter_and_is_used_once() -> None:
    bell = Doorbell()
    bell.ring()
    bell.ring()  # two rings before a wait: one wake
    await asyncio.wait_for(bell.wait(30), 5)  # rung already: at once
    waiter = asyncio.create_task(bell.wait(30))
    await asyncio.sleep(0)
    assert not waiter.done()  # the earlier rings were used up
    bell.ring()
    await asyncio.wait_for(waiter, 5)


async def test_an_unrung_bell_times_out() -> None:
    await asyncio.wait_for(Doorbell().wait(0.01), 5)


async def test_the_recorders_writer_sleeps_until_a_request_is_recorded(tmp_path: Path) -> None:
    rec = RequestRecorder(tmp_path / "requests.db", settings(tmp_path), period_s=0.02)
    steps = 0
    max_bytes = rec._max_bytes

    def counted() -> int:  # once per step of the writer
        nonlocal steps
        steps += 1
        return max_bytes()

    rec._max_bytes = counted  # type: ignore[method-assign]
    await rec.start()
    try:
        await asyncio.sleep(0.5)  # 25 periods: a polling writer would step every one
        assert steps <= 2, steps
        rec.record(exchange(1))
        async with asyncio.timeout(10):
            while rec.written < 1:  # written by the writer itself, no flush called
                await asyncio.sleep(0.01)
    finally:
        await rec.stop()
