"""Models on demand through the real daemon and gateway with the FAKE vLLM env: a request for a
model that is not loaded starts it once (single flight) and every waiting request is answered;
a failed load answers every waiter with the engine's diagnosis; streaming clients get SSE
comment lines while they wait; `engines.jit = false` turns it off."""

from __future__ import annotations

import asyncio

import aiohttp
import openai
import pytest

from engines.core.procs import free_loopback_port
from engines.events import EngineState, EngineStateChanged, ModelLoading, ModelStateChanged
from engines.runtime.adapters.vllm_start import PHASES
from tests.conftest import DaemonFactory, RunningDaemon
from tests.engines.ondemand.conftest import ask, fake_profile, sdk, settings

DIAGNOSED = (
    "--print 'ValueError: No available memory for the cache blocks. Try increasing "
    "`gpu_memory_utilization` when initializing the engine.' --exit-after-print 1"
)


async def test_fifty_concurrent_cold_requests_start_the_model_once(
    od: RunningDaemon, events_of
) -> None:
    fake_profile(od, "cold", args="--startup-delay 1")
    events = events_of(od, "engine.state")
    client = sdk(od, timeout=60)
    answers = await asyncio.gather(*(ask(client, "cold") for _ in range(50)))
    assert answers == ["w0 w1"] * 50
    launches = [
        e for e in events.drain() if isinstance(e, EngineStateChanged) and e.detail == "launching"
    ]
    assert len(launches) == 1
    assert od.daemon.engine("cold").state == EngineState.READY
    await client.close()


async def test_a_failed_load_answers_every_waiter_with_the_diagnosis(
    od: RunningDaemon, events_of
) -> None:
    fake_profile(od, "broken", args=DIAGNOSED)
    events = events_of(od, "engine.state", "model.state")
    async with aiohttp.ClientSession() as http:

        async def one() -> tuple[int, dict[str, str], dict[str, object]]:
            async with http.post(
                od.url + "/v1/chat/completions", json={"model": "broken", "messages": []}
            ) as r:
                return r.status, dict(r.headers), await r.json()

        results = await asyncio.gather(*(one() for _ in range(10)))
    for status, headers, body in results:
        assert status == 503
        assert headers["x-should-retry"] == "false"  # the openai SDK would retry 5xx else
        error = body["error"]
        assert isinstance(error, dict)
        assert error["type"] == "model_load_failed"
        assert "No memory left for the KV cache after loading the weights" in str(error["message"])
        assert "Raise gpu_memory_utilization" in str(error["message"])
    failed = await events.wait(lambda e: isinstance(e, ModelStateChanged) and e.reason == "failed")
    assert failed.name == "broken"
    launches = [
        e for e in events.drain() if isinstance(e, EngineStateChanged) and e.detail == "launching"
    ]
    assert len(launches) == 1


@pytest.mark.slow
async def test_streaming_cold_request_gets_comments_then_the_reply(od: RunningDaemon) -> None:
    fake_profile(od, "slow", args="--startup-delay 4")
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            od.url + "/v1/chat/completions",
            json={"model": "slow", "messages": [], "max_tokens": 3, "stream": True},
        ) as r,
    ):
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        first = await r.content.readline()
        # bytes at once, long before the engine is ready: no client idle timeout fires
        engine = od.daemon.supervisor.get("slow")
        assert engine is None or engine.state == EngineState.STARTING
        assert first.startswith(b": loading slow (")
        rest = (await r.content.read()).decode()
    assert rest.count(": loading slow") >= 1  # another one every few seconds
    # ... saying which phase of its start the engine is in
    assert any(f"(starting: {rule.label}, " in rest for rule in PHASES), rest
    assert '"content": "w2 "' in rest and rest.rstrip().endswith("data: [DONE]")


async def test_a_loads_progress_follows_the_engines_start_phases(
    od: RunningDaemon, events_of
) -> None:
    """`model.loading` events (what `traylm load`, the chat window and the SSE comments show)
    name each start phase the engine's log begins, in order, however short."""
    fake_profile(od, "phased", args="--startup-delay 2")
    events = events_of(od, "model.loading")
    client = sdk(od, timeout=60)
    assert await ask(client, "phased") == "w0 w1"
    await client.close()
    details = [
        e.detail for e in events.drain() if isinstance(e, ModelLoading) and e.phase == "starting"
    ]
    cpu = ("import", "config", "engine", "weights", "compile", "kv_cache", "server")
    labels = [r.label for r in PHASES if r.phase in cpu]  # the CPU build's phases
    assert [d for d in details if d in labels] == labels, details


async def test_the_openai_sdk_ignores_the_comments_and_raises_a_failed_load(
    od: RunningDaemon,
) -> None:
    fake_profile(od, "later", args="--startup-delay 1")
    fake_profile(od, "never", args=DIAGNOSED)
    client = sdk(od, timeout=60)
    stream = await client.chat.completions.create(
        model="later", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text.split() == ["w0", "w1", "w2"]
    with pytest.raises(openai.APIError) as err:
        stream = await client.chat.completions.create(
            model="never", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        async for _ in stream:
            pass
    assert "No memory left for the KV cache" in str(err.value)
    await client.close()


async def test_jit_off_says_how_to_load(daemon_factory: DaemonFactory, fake_env: object) -> None:
    d = await daemon_factory(settings(jit=False))
    fake_profile(d, "manual")
    client = sdk(d)
    with pytest.raises(openai.NotFoundError) as err:
        await ask(client, "manual")
    assert "'manual' is not loaded (engines.jit is off)" in str(err.value)
    assert "`traylm load manual`" in str(err.value)
    await d.client.load_model("manual")
    await d.client.wait_for_engine("manual", (EngineState.READY,), 30)
    assert await ask(client, "manual") == "w0 w1"
    await client.close()


async def test_unknown_names_get_the_404_listing_what_exists(od: RunningDaemon) -> None:
    fake_profile(od, "known")
    client = sdk(od)
    with pytest.raises(openai.NotFoundError) as err:
        await ask(client, "nope")
    assert "the model 'nope' is not served; served models:" in str(err.value)
    assert "known" in str(err.value)
    models = {m.id: m for m in (await client.models.list()).data}
    assert models["known"].status["value"] == "unloaded"  # type: ignore[attr-defined]
    await client.close()


async def test_anthropic_streams_wait_for_a_cold_model_too(od: RunningDaemon) -> None:
    """/v1/messages through the anthropic SDK: the comments while the model loads are skipped,
    and a failed load ends the stream with Anthropic's error event, which the SDK raises."""
    import anthropic

    fake_profile(od, "claude-ish", args="--startup-delay 1")
    fake_profile(od, "claude-broken", args=DIAGNOSED)
    client = anthropic.AsyncAnthropic(base_url=od.url, api_key="unused", max_retries=0)
    hi = [{"role": "user", "content": "hi"}]
    async with client.messages.stream(model="claude-ish", max_tokens=3, messages=hi) as stream:
        text = "".join([t async for t in stream.text_stream])
    assert text.split() == ["w0", "w1", "w2"]
    with pytest.raises(anthropic.APIError, match="No memory left for the KV cache"):
        async with client.messages.stream(
            model="claude-broken", max_tokens=3, messages=hi
        ) as stream:
            async for _ in stream.text_stream:
                pass
    await client.close()


async def test_a_cold_hub_model_not_downloaded_offline_fails_at_once_and_evicts_nothing(
    daemon_factory: DaemonFactory, fake_env: object, events_of, monkeypatch
) -> None:
    """The JIT path makes the start's own checks before it places anything: a Hub model that is
    not downloaded while the Hub cannot be reached is refused in traylm's words to every waiter,
    and the idle model that a placement would have unloaded keeps running."""
    d = await daemon_factory(settings(gpus=1))
    fake_profile(d, "resident", gpus="auto")
    client = sdk(d, timeout=60)
    assert await ask(client, "resident") == "w0 w1"  # the card is now full
    d.write_profile("qwen", model="Qwen/Qwen2.5-0.5B-Instruct", device="cpu", gpus="auto")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_loopback_port()}")  # no Hub
    events = events_of(d, "model.state", "engine.state")
    async with aiohttp.ClientSession() as http:

        async def one() -> tuple[int, dict[str, object]]:
            async with http.post(
                d.url + "/v1/chat/completions",
                json={"model": "Qwen/Qwen2.5-0.5B-Instruct", "messages": []},
            ) as r:
                return r.status, await r.json()

        results = await asyncio.gather(*(one() for _ in range(5)))
    for status, body in results:
        assert status == 503
        error = body["error"]
        assert isinstance(error, dict) and error["type"] == "hub_unavailable"
        message = str(error["message"])
        assert "Qwen/Qwen2.5-0.5B-Instruct (profile 'qwen') is not downloaded" in message
        assert "`traylm models pull Qwen/Qwen2.5-0.5B-Instruct`" in message
    assert d.daemon.supervisor.get("qwen") is None  # nothing launched to fail a minute later
    assert d.daemon.engine("resident").state == EngineState.READY
    seen = events.drain()
    assert not [e for e in seen if isinstance(e, ModelStateChanged) and e.reason == "evicted"]
    failed = [e for e in seen if isinstance(e, ModelStateChanged) and e.reason == "failed"]
    # said as a failed load (a request that arrives after a refusal asks again: refused again)
    assert failed and {e.name for e in failed} == {"Qwen2.5-0.5B-Instruct"}
    assert len(failed) <= len(results)
    await client.close()
