"""Is a ready engine alive and making progress? The real daemon and supervisor with the FAKE
engine: a stopped engine core (SIGSTOP) or generation that stops is a hung engine (its requests
end, it is restarted); a slow /health while tokens flow is a healthy one; a stopped leader is
cleaned up without waiting a graceful stop it cannot run."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import time
from collections.abc import Callable

import aiohttp
import psutil
import pytest

from engines.core.procs import free_loopback_port
from engines.events import EngineState, EngineStateChanged
from tests.conftest import DaemonFactory, RunningDaemon, fast_settings
from tests.engines.gateway.test_daemon_gateway import start_fake


async def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def engine_daemon(factory: DaemonFactory, **engines: float) -> RunningDaemon:
    base = fast_settings(free_loopback_port())
    settings = dataclasses.replace(base, engines=dataclasses.replace(base.engines, **engines))
    d: RunningDaemon = await factory(settings)
    return d


class Stream:
    """One streamed chat request through the gateway, read as it comes."""

    def __init__(self, d: RunningDaemon, max_tokens: int) -> None:
        self.url = d.url + "/v1/chat/completions"
        self.body = {"model": "fake", "messages": [], "max_tokens": max_tokens, "stream": True}
        self.events: list[bytes] = []
        self.ended: BaseException | None = None

    async def run(self, http: aiohttp.ClientSession) -> None:
        try:
            async with http.post(self.url, json=self.body) as r:
                assert r.status == 200
                async for line in r.content:
                    if line.startswith(b"data: "):
                        self.events.append(line)
        except aiohttp.ClientError as exc:  # the connection was cut
            self.ended = exc

    @property
    def tokens(self) -> int:
        return sum(1 for e in self.events if b'"delta"' in e)


@pytest.mark.slow
async def test_a_stopped_engine_core_is_hung_and_restarted(daemon_factory, fake_env) -> None:
    """SIGSTOP of the process that makes the tokens (vLLM's EngineCore): /health still says
    200, but the engine is hung: the waiting stream ends and the engine is restarted."""
    d = await engine_daemon(daemon_factory)
    await start_fake(d, args="--core-process --token-delay 0.05")
    engine = d.daemon.engine("fake")
    leader = engine.pid
    assert leader is not None
    with d.daemon.bus.subscribe(frozenset({"engine.state"})) as sub:
        async with aiohttp.ClientSession() as http:
            stream = Stream(d, max_tokens=100_000)
            reading = asyncio.create_task(stream.run(http))
            await wait_until(lambda: stream.tokens >= 3, "the first tokens")
            (core,) = psutil.Process(leader).children()
            os.kill(core.pid, signal.SIGSTOP)
            await asyncio.wait_for(reading, 60)  # the stream ends: nobody waits forever
        error = json.loads(stream.events[-2][6:])["error"]  # then data: [DONE]
        assert f"reply: hung (process {core.pid} is stopped (SIGSTOP))" in error["message"]
        event = await asyncio.wait_for(sub.get(), 30)
        assert isinstance(event, EngineStateChanged) and event.state == EngineState.STARTING
        assert f"hung (process {core.pid} is stopped (SIGSTOP))" in event.detail, event.detail
    await wait_until(lambda: engine.state == EngineState.READY and engine.pid != leader, "restart")
    assert engine.restarts == 1
    assert not psutil.pid_exists(core.pid) or core.status() == psutil.STATUS_ZOMBIE


@pytest.mark.slow
async def test_generation_that_stops_is_hung_and_restarted(daemon_factory, fake_env) -> None:
    """No process is stopped and /health says 200, but no token comes for stall_timeout_s
    while a request waits: hung."""
    d = await engine_daemon(daemon_factory, stall_timeout_s=2.0)
    await start_fake(d, args="--stall-after-tokens 5 --token-delay 0.02")
    engine = d.daemon.engine("fake")
    leader = engine.pid
    with d.daemon.bus.subscribe(frozenset({"engine.state"})) as sub:
        async with aiohttp.ClientSession() as http:
            stream = Stream(d, max_tokens=50)
            await asyncio.wait_for(stream.run(http), 60)
        assert stream.tokens == 5
        event = await asyncio.wait_for(sub.get(), 30)
        assert isinstance(event, EngineStateChanged)
        assert "hung (1 request(s) in flight and no token for" in event.detail, event.detail
    await wait_until(lambda: engine.state == EngineState.READY and engine.pid != leader, "restart")


@pytest.mark.slow
async def test_slow_health_while_tokens_flow_is_no_crash(daemon_factory, fake_env) -> None:
    """/health answers after 2 s (later than the probe waits) while the engine streams: the
    engine is working, so it is neither restarted nor is the stream cut."""
    d = await engine_daemon(daemon_factory)
    await start_fake(d, args="--slow-health 2 --token-delay 0.05")
    engine = d.daemon.engine("fake")
    leader = engine.pid
    with d.daemon.bus.subscribe(frozenset({"engine.state"})) as sub:
        async with aiohttp.ClientSession() as http:
            stream = Stream(d, max_tokens=120)  # 6 s: several slow /health probes
            await asyncio.wait_for(stream.run(http), 120)
        assert stream.ended is None and stream.tokens == 120
        assert stream.events[-1].strip() == b"data: [DONE]"
        assert sub.queue.empty(), "the engine changed state while it was streaming"
    assert engine.state == EngineState.READY and engine.pid == leader and engine.restarts == 0


@pytest.mark.slow
async def test_replies_flowing_stand_for_health(daemon_factory, fake_env) -> None:
    """While the gateway relays an engine's tokens, the supervisor does not also ask /health
    every second (one request and one connection less per second, off the loop that relays the
    tokens); once they stop, it asks again."""
    d = await engine_daemon(daemon_factory)
    await start_fake(d, args="--token-delay 0.05")
    engine = d.daemon.engine("fake")
    async with aiohttp.ClientSession() as http:

        async def probes() -> int:
            async with http.get(f"{engine.base_url}/fake/stats") as r:
                return int((await r.json())["health_probes"])

        stream = Stream(d, max_tokens=120)  # 6 s of tokens: 6 looks of the supervisor
        reading = asyncio.create_task(stream.run(http))
        await wait_until(lambda: stream.tokens >= 3, "the first tokens")
        before = await probes()
        await asyncio.wait_for(reading, 120)
        during = await probes() - before
        assert stream.tokens == 120 and stream.ended is None
        assert during <= 1, f"{during} /health probes while tokens flowed"
        after = await probes()
        deadline = time.monotonic() + 30
        while await probes() == after:  # idle again: /health is asked once more
            assert time.monotonic() < deadline, "no /health probe after the stream"
            await asyncio.sleep(0.1)
    assert engine.state == EngineState.READY and engine.restarts == 0


@pytest.mark.slow
async def test_stopped_leader_is_killed_without_a_graceful_wait(daemon_factory, fake_env) -> None:
    """A SIGSTOPped leader can run no SIGTERM handler: it is declared dead and SIGKILLed at
    once, not after engines.stop_timeout_s (10 minutes here, far past this test's waits)."""
    d = await engine_daemon(daemon_factory, stop_timeout_s=600.0)
    await start_fake(d, args="--token-delay 0.05")
    engine = d.daemon.engine("fake")
    leader = engine.pid
    assert leader is not None
    with d.daemon.bus.subscribe(frozenset({"engine.state"})) as sub:
        os.kill(leader, signal.SIGSTOP)
        event = await asyncio.wait_for(sub.get(), 30)
        assert isinstance(event, EngineStateChanged) and event.state == EngineState.STARTING
    await wait_until(lambda: _gone(leader), "the SIGKILL", 30)
    await wait_until(lambda: engine.state == EngineState.READY, "restart")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
