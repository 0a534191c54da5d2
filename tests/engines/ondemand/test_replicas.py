"""Replicas through the real daemon and gateway with FAKE engines on two simulated GPUs: a model
loaded with ``replicas = 2`` is two engines behind its one name, one per card; both serve
(X-Traylm-Engine), concurrent streams spread, a conversation sticks, a SIGKILLed replica's
stream gets the error event while a request queued for it moves to the other and the killed one
comes back; `traylm ps`, /v1/models and unload see every replica."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from engines.control.cli import _engine_line
from engines.errors import ModelUnavailable
from engines.events import EngineState
from engines.ondemand.cli import _ps_line
from tests.conftest import DaemonFactory, RunningDaemon
from tests.engines.ondemand.conftest import fake_profile, settings

SLOW = "--token-delay 0.1"


async def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not in time"
        await asyncio.sleep(0.02)


@pytest.fixture
async def two_gpus(daemon_factory: DaemonFactory, fake_env: object) -> RunningDaemon:
    base = settings(gpus=2)
    one_at_a_time = dataclasses.replace(base.gateway, max_concurrent=1)
    d: RunningDaemon = await daemon_factory(dataclasses.replace(base, gateway=one_at_a_time))
    return d


def chat(model: str, text: str, *, stream: bool = False, tokens: int = 3) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}],
        "max_tokens": tokens,
        "stream": stream,
    }


async def engine_of(http: aiohttp.ClientSession, d: RunningDaemon, body: dict[str, Any]) -> str:
    async with http.post(d.url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        await r.read()
        return r.headers["X-Traylm-Engine"]


class Stream:
    """One streamed request: which engine took it, and its events as they come."""

    def __init__(self, d: RunningDaemon, body: dict[str, Any]) -> None:
        self.d, self.body = d, body
        self.engine = ""
        self.events: list[str] = []
        self.started = asyncio.Event()

    async def run(self, http: aiohttp.ClientSession) -> None:
        async with http.post(self.d.url + "/v1/chat/completions", json=self.body) as r:
            self.engine = r.headers.get("X-Traylm-Engine", "")
            self.started.set()
            async for line in r.content:
                if line.startswith(b"data: "):
                    self.events.append(line.decode().strip())

    @property
    def error(self) -> str:
        for event in self.events:
            if event != "data: [DONE]" and "error" in (found := json.loads(event[6:])):
                return str(found["error"]["message"])
        return ""


async def load_two(d: RunningDaemon, name: str, args: str = SLOW) -> None:
    fake_profile(d, name, gpus="auto", args=args)
    row = await d.client.load_model(name, replicas=2)  # the control route's replicas
    assert row.engine_id == name
    for engine_id in (name, f"{name}.r2"):
        await d.daemon.engine(engine_id).wait_state((EngineState.READY,))


async def test_two_replicas_one_per_card_both_serve(two_gpus: RunningDaemon) -> None:
    d = two_gpus
    await load_two(d, "twin", args="")
    gpus = {e: d.daemon.engine(e).profile.gpus for e in ("twin", "twin.r2")}
    assert sorted(gpus.values()) == [(0,), (1,)]  # one per card
    async with aiohttp.ClientSession() as http:
        served = {await engine_of(http, d, chat("twin", f"q{i}")) for i in range(4)}
        assert served == {"twin", "twin.r2"}
        async with http.get(d.url + "/v1/models") as r:
            listed = [m for m in (await r.json())["data"] if m["id"] == "twin"]
    assert len(listed) == 1  # the model once, its replicas inside
    replicas = listed[0]["traylm"]["replicas"]
    assert [(r["engine_id"], r["state"]) for r in replicas] == [
        ("twin", "ready"),
        ("twin.r2", "ready"),
    ]
    assert sorted(listed[0]["gpus"]) == [0, 1]
    rows = await d.client.loaded_models()
    assert [(r.name, r.engine_id, r.replica, r.gpus) for r in rows] == [
        ("twin", "twin", "1/2", gpus["twin"]),
        ("twin", "twin.r2", "2/2", gpus["twin.r2"]),
    ]
    assert "replica 2/2" in _ps_line(rows[1])
    statuses = {s.engine_id: s for s in await d.client.engines()}
    second = gpus["twin.r2"][0]
    assert f"replica 2/2 on GPU {second}" in _engine_line(statuses["twin.r2"], 2)  # status


@pytest.mark.slow
async def test_concurrent_streams_spread_over_the_replicas(
    daemon_factory: DaemonFactory, fake_env: object
) -> None:
    d = await daemon_factory(settings(gpus=2))  # no concurrency limit: nothing queues
    await load_two(d, "spread")
    async with aiohttp.ClientSession() as http:
        streams = [Stream(d, chat("spread", f"talk {i}", stream=True, tokens=50)) for i in range(4)]
        running = []
        for s in streams:  # each begins while the ones before it still stream (5 s each)
            running.append(asyncio.create_task(s.run(http)))
            await asyncio.wait_for(s.started.wait(), 30)
        await asyncio.gather(*running)
    taken = [s.engine for s in streams]
    assert sorted(taken) == ["spread", "spread", "spread.r2", "spread.r2"], taken


async def test_a_conversation_sticks_to_its_replica(two_gpus: RunningDaemon) -> None:
    d = two_gpus
    await load_two(d, "stick", args="")
    async with aiohttp.ClientSession() as http:
        homes = set()
        body = chat("stick", "the same conversation")
        for turn in range(6):
            homes.add(await engine_of(http, d, body))
            body["messages"] += [
                {"role": "assistant", "content": "w0 w1"},
                {"role": "user", "content": f"turn {turn}"},
            ]
        assert len(homes) == 1, homes
        other = {await engine_of(http, d, chat("stick", f"another {i}")) for i in range(4)}
        assert other == {"stick", "stick.r2"}  # other conversations still use both


@pytest.mark.slow
async def test_a_killed_replica_moves_what_had_not_started(
    daemon_factory: DaemonFactory, fake_env: object
) -> None:
    """max_concurrent = 1 per engine: one stream runs on each replica and a third request waits
    in one's queue. SIGKILL of that replica: its stream ends with the error event, the queued
    request is served by the other, and the killed one restarts. Warm starts off: a SIGKILLed
    engine that was launched in a warm process sometimes leaves its asyncio subprocess
    transport unclosed (a ResourceWarning in a later test), a warm-pool matter of its own."""
    base = settings(gpus=2, warm_starts=0)
    one_at_a_time = dataclasses.replace(base.gateway, max_concurrent=1)
    d = await daemon_factory(dataclasses.replace(base, gateway=one_at_a_time))
    await load_two(d, "kill", args="--token-delay 0.2")
    async with aiohttp.ClientSession() as http:
        long = [Stream(d, chat("kill", f"long {i}", stream=True, tokens=15)) for i in range(2)]
        running = [asyncio.create_task(s.run(http)) for s in long]
        for s in long:
            await asyncio.wait_for(s.started.wait(), 30)
        assert {s.engine for s in long} == {"kill", "kill.r2"}
        queued = Stream(d, chat("kill", "waits", stream=True, tokens=2))
        waiting = asyncio.create_task(queued.run(http))
        gateway = d.daemon.ctx

        def queue_of() -> str:
            return next((e for e in ("kill", "kill.r2") if gateway.activity(e)[1]), "")

        await wait_until(lambda: bool(queue_of()), "the third request queued")
        victim = d.daemon.engine(queue_of())
        leader = victim.pid
        assert leader is not None
        os.kill(leader, signal.SIGKILL)
        await asyncio.wait_for(asyncio.gather(*running, waiting), 60)
    [killed] = [s for s in long if s.engine == victim.engine_id]
    [survivor] = [s for s in long if s.engine != victim.engine_id]
    assert killed.error, killed.events[-3:]  # the error event, not a cut stream
    assert survivor.error == "" and survivor.events[-1] == "data: [DONE]"
    assert queued.engine == survivor.engine  # moved: it had not started on the killed one
    assert queued.error == "" and queued.events[-1] == "data: [DONE]"
    await wait_until(
        lambda: victim.state == EngineState.READY and victim.pid != leader, "the restart"
    )
    assert victim.restarts == 1


async def test_unload_stops_every_replica(two_gpus: RunningDaemon) -> None:
    d = two_gpus
    await load_two(d, "gone", args="")
    result = await d.client.unload_model("gone")
    assert result["unloaded"] is True
    for engine_id in ("gone", "gone.r2"):
        assert d.daemon.engine(engine_id).state == EngineState.STOPPED
    assert await d.client.loaded_models() == []


async def test_profile_replicas_load_on_the_first_request(two_gpus: RunningDaemon) -> None:
    d = two_gpus
    fake_profile(d, "jit2", gpus="auto", replicas=2)
    async with aiohttp.ClientSession() as http:
        assert await engine_of(http, d, chat("jit2", "cold")) in ("jit2", "jit2.r2")
    assert d.daemon.engine("jit2.r2").state == EngineState.READY


async def test_three_replicas_on_two_cards_refused_naming_the_room(
    two_gpus: RunningDaemon,
) -> None:
    d = two_gpus
    fake_profile(d, "many", gpus="auto", replicas=3)
    with pytest.raises(ModelUnavailable) as err:
        await d.daemon.ondemand.load("many", None)
    assert "replica 3 of 3 cannot be placed" in err.value.message
    assert "--replicas 2" in err.value.message
    assert all(e.state != EngineState.STARTING for e in d.daemon.ondemand.engines.values())


async def test_keep_alive_0_unloads_every_replica_once_idle(two_gpus: RunningDaemon) -> None:
    d = two_gpus
    fake_profile(d, "brief", gpus="auto", replicas=2)
    async with aiohttp.ClientSession() as http:
        await engine_of(http, d, {**chat("brief", "once"), "keep_alive": 0})
    for engine_id in ("brief", "brief.r2"):
        engine = d.daemon.engine(engine_id)
        await wait_until(lambda e=engine: e.state == EngineState.STOPPED, f"{engine_id} unloaded")


async def test_a_new_request_passes_over_a_sigstopped_replica(
    daemon_factory: DaemonFactory, fake_env: object
) -> None:
    """A replica SIGSTOPped with a stream in flight (less busy than the other, so the fewest
    outstanding would pick it): a request sent a moment later, long before the stopped verdict
    (3 s and the next look), goes to the replica that still makes progress and streams at once."""
    d = await daemon_factory(settings(gpus=2, warm_starts=0))
    await load_two(d, "halt")
    victim_pid = 0
    async with aiohttp.ClientSession() as http:
        streams = [Stream(d, chat("halt", f"long {i}", stream=True, tokens=150)) for i in range(3)]
        running = []
        for s in streams:
            running.append(asyncio.create_task(s.run(http)))
            await asyncio.wait_for(s.started.wait(), 30)
        taken = [s.engine for s in streams]
        victim = min(("halt", "halt.r2"), key=taken.count)  # one stream; the other has two
        other = "halt.r2" if victim == "halt" else "halt"
        assert taken.count(victim) == 1, taken
        engine = d.daemon.engine(victim)
        victim_pid = engine.pid or 0
        try:
            os.kill(victim_pid, signal.SIGSTOP)
            await asyncio.sleep(1.5)  # its stream's tokens stop; no verdict yet
            assert engine.state == EngineState.READY
            t0 = time.monotonic()
            late = Stream(d, chat("halt", "a new request", stream=True, tokens=2))
            await asyncio.wait_for(late.run(http), 30)
            took_s = time.monotonic() - t0
            assert late.engine == other, (late.engine, took_s)
            assert late.events[-1] == "data: [DONE]" and took_s < 3.0, took_s
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim_pid, signal.SIGCONT)
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
