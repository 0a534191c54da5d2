"""The gateway's throughput reaches clients as events while requests run (the tray and the
dashboard read them instead of scraping /metrics), ends with one snapshot of zeros, and an idle
gateway has no reporter running at all."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from engines.events import GatewayThroughput
from tests.conftest import RunningDaemon
from tests.engines.gateway.test_daemon_gateway import sdk, start_fake


async def _throughput(
    daemon: RunningDaemon, opened: asyncio.Event
) -> AsyncIterator[GatewayThroughput]:
    async for event in daemon.client.events(["gateway.throughput"], opened=opened.set):
        assert isinstance(event, GatewayThroughput)
        yield event


@pytest.mark.slow
async def test_throughput_events_while_requests_run_then_one_zero(daemon: RunningDaemon) -> None:
    await start_fake(daemon, args="--token-delay 0.25")
    reporter = daemon.daemon.ctx.throughput
    assert reporter is not None and not reporter.running  # an engine ready, no traffic
    opened = asyncio.Event()
    events = _throughput(daemon, opened)
    first = asyncio.ensure_future(anext(events))
    await asyncio.wait_for(opened.wait(), 10)
    client = sdk(daemon)

    async def ask() -> None:
        stream = await client.chat.completions.create(
            model="fake", messages=[{"role": "user", "content": "hi"}], max_tokens=8, stream=True
        )
        async for _ in stream:
            pass

    request = asyncio.ensure_future(ask())
    busy = await asyncio.wait_for(first, 10)
    assert busy.in_flight == 1
    assert [(e.engine_id, e.in_flight) for e in busy.engines] == [("fake", 1)]
    await asyncio.wait_for(request, 20)
    seen: list[GatewayThroughput] = []
    async with asyncio.timeout(20):
        async for event in events:
            seen.append(event)
            if event.tokens_per_s == 0 and event.in_flight == 0:
                break
    counted = [e for e in seen if e.tokens_per_s > 0]
    assert counted, seen  # the 8 tokens, counted when the stream ended
    assert [m.model for m in counted[0].models] == ["fake"]
    assert seen[-1].models == () and seen[-1].engines == ()
    assert not reporter.running  # traffic stopped: nothing wakes up or publishes any more
    await events.aclose()
    await client.close()


@pytest.mark.slow
async def test_a_request_after_the_zero_starts_the_reports_again(daemon: RunningDaemon) -> None:
    await start_fake(daemon)
    reporter = daemon.daemon.ctx.throughput
    assert reporter is not None
    with daemon.daemon.bus.subscribe(frozenset({"gateway.throughput"})) as sub:
        client = sdk(daemon)
        for _ in range(2):
            await client.chat.completions.create(
                model="fake", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            seen = []
            while not seen or seen[-1].tokens_per_s or seen[-1].in_flight:  # until the zeros
                event = await asyncio.wait_for(sub.get(), 10)
                assert isinstance(event, GatewayThroughput)
                seen.append(event)
            assert any(e.tokens_per_s > 0 for e in seen)  # the short request's tokens
            assert not reporter.running
        await client.close()
