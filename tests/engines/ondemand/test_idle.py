"""Idle unload through the real daemon (FAKE engine): the idle TTL, requests in flight keep a
model loaded, Ollama's keep_alive (stripped before the engine sees it), pins, explicit loads,
and an unload asked during a stream waits for it instead of cutting it."""

from __future__ import annotations

import time

import aiohttp
import pytest

from engines.errors import ControlAPIError
from engines.events import EngineState, ModelStateChanged
from tests.conftest import RunningDaemon
from tests.engines.ondemand.conftest import ask, fake_profile, sdk


def unloaded(name: str):
    return lambda e: isinstance(e, ModelStateChanged) and e.name == name and e.state == "stopped"


async def stats(d: RunningDaemon, engine_id: str) -> dict[str, object]:
    engine = d.daemon.engine(engine_id)
    async with aiohttp.ClientSession() as http, http.get(f"{engine.base_url}/fake/stats") as r:
        data: dict[str, object] = await r.json()
        return data


async def test_idle_ttl_unloads_the_model(od: RunningDaemon, events_of) -> None:
    fake_profile(od, "brief", idle_ttl_s=1)
    events = events_of(od, "model.state")
    client = sdk(od)
    assert await ask(client, "brief") == "w0 w1"
    [row] = await od.client.loaded_models()
    assert row.origin == "jit" and row.ttl_s == 1 and row.unloads_in_s is not None
    gone = await events.wait(unloaded("brief"))
    assert gone.reason == "idle"
    assert od.daemon.engine("brief").state == EngineState.STOPPED
    assert await od.client.loaded_models() == []
    await client.close()


@pytest.mark.slow
async def test_a_request_in_flight_keeps_the_model_loaded(od: RunningDaemon, events_of) -> None:
    fake_profile(od, "busy", idle_ttl_s=0.5, args="--token-delay 0.1")
    events = events_of(od, "model.state")
    client = sdk(od, timeout=60)
    stream = await client.chat.completions.create(
        model="busy", messages=[{"role": "user", "content": "x"}], max_tokens=30, stream=True
    )
    words = []
    async for chunk in stream:  # 3 s of streaming, six times the TTL
        words.append(chunk.choices[0].delta.content if chunk.choices else "")
        assert not any(unloaded("busy")(e) for e in events.drain())
    assert len([w for w in words if w]) == 30
    gone = await events.wait(unloaded("busy"))
    assert gone.reason == "idle"
    await client.close()


async def test_keep_alive_is_honoured_and_stripped(od: RunningDaemon, events_of) -> None:
    fake_profile(od, "ka", idle_ttl_s=3600)
    events = events_of(od, "model.state")
    async with aiohttp.ClientSession() as http:
        body = {"model": "ka", "messages": [], "max_tokens": 1, "keep_alive": "5m"}
        async with http.post(od.url + "/v1/chat/completions", json=body) as r:
            assert r.status == 200
        assert "keep_alive" not in (await stats(od, "ka"))["last_keys"]  # type: ignore[operator]
        [row] = await od.client.loaded_models()
        assert row.unloads_in_s is not None and 290 < row.unloads_in_s <= 300
        body["keep_alive"] = -1  # forever
        async with http.post(od.url + "/v1/chat/completions", json=body) as r:
            assert r.status == 200
        [row] = await od.client.loaded_models()
        assert row.unloads_in_s is None
        body["keep_alive"] = "soon"
        async with http.post(od.url + "/v1/chat/completions", json=body) as r:
            assert r.status == 400
            error = (await r.json())["error"]
            assert error["param"] == "keep_alive" and "is not a duration" in error["message"]
        body["keep_alive"] = 0  # unload as soon as this request ends
        async with http.post(od.url + "/v1/chat/completions", json=body) as r:
            assert r.status == 200
    gone = await events.wait(unloaded("ka"))
    assert gone.reason == "keep_alive"


async def test_unload_during_a_stream_waits_for_it(od: RunningDaemon, events_of) -> None:
    fake_profile(od, "long", args="--token-delay 0.05")
    events = events_of(od, "model.state")
    client = sdk(od, timeout=60)
    stream = await client.chat.completions.create(
        model="long", messages=[{"role": "user", "content": "x"}], max_tokens=40, stream=True
    )
    words = []
    async for chunk in stream:
        words.append(chunk.choices[0].delta.content if chunk.choices else "")
        if len(words) == 3:
            result = await od.client.unload_model("long")
            assert result["deferred"] and not result["unloaded"]
            assert "unloads as soon as the last one ends" in result["message"]
    assert len([w for w in words if w]) == 40  # the stream was not cut
    gone = await events.wait(unloaded("long"))
    assert gone.reason == "asked"
    with pytest.raises(ControlAPIError, match="long is not loaded"):
        await od.client.unload_model("long")
    await client.close()


async def test_explicit_load_with_ttl_and_pin(od: RunningDaemon) -> None:
    fake_profile(od, "kept", idle_ttl_s=0.5)
    row = await od.client.load_model("kept", pin=True)
    assert row.pinned and row.origin == "load"
    await od.client.wait_for_model("kept", 30)
    client = sdk(od)
    body = {"keep_alive": 0}
    await client.chat.completions.create(model="kept", messages=[], max_tokens=1, extra_body=body)
    [row] = await od.client.loaded_models()
    assert row.state == "ready" and row.pinned and row.unloads_in_s is None
    row = await od.client.load_model("kept", ttl="10m")  # unpinned, with a TTL of its own
    assert not row.pinned and row.ttl_s == 600
    result = await od.client.unload_model("kept")
    assert result["unloaded"]
    await client.close()


async def test_bad_ttl_and_gpus_are_refused_with_the_fix(od: RunningDaemon) -> None:
    fake_profile(od, "m")
    with pytest.raises(ControlAPIError) as err:
        await od.client.load_model("m", ttl="-5")
    assert err.value.http_status == 400
    assert "ttl '-5' is negative; a TTL is a duration of 0 or more" in err.value.message
    with pytest.raises(ControlAPIError) as err:
        await od.client.load_model("m", ttl="5 minutes")
    assert "is not a duration" in err.value.message
    with pytest.raises(ControlAPIError) as err:
        await od.client.load_model("m", gpus=[0])
    assert "this machine has no GPU traylm can see" in err.value.message
    with pytest.raises(ControlAPIError) as err:
        await od.client.load_model("nope")
    assert err.value.http_status == 404 and "served models:" in err.value.message
    assert await od.client.loaded_models() == []


async def test_idle_time_counts_from_ready_not_from_the_booking(od: RunningDaemon) -> None:
    """A start slower than the TTL must not use the TTL up before the first request: its idle
    time starts when the engine is ready (it was counted from the booking)."""
    delay_s = 2.0
    fake_profile(od, "slow", idle_ttl_s=60, args=f"--startup-delay {delay_s}")
    asked_s = time.monotonic()
    await od.client.load_model("slow", ttl=60)
    await od.client.wait_for_model("slow", 60)
    [row] = await od.client.loaded_models()
    read_s = time.monotonic()
    assert row.idle_for_s is not None
    # ready no sooner than delay_s after the ask, so idle for at most the rest
    assert row.idle_for_s <= read_s - asked_s - delay_s, row
