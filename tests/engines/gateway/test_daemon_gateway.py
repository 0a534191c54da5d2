"""The real daemon and gateway with the FAKE vLLM env (tests/fakes): routing, streaming, errors,
admission, security. Each engine start takes about a second here."""

from __future__ import annotations

import asyncio
import json
import logging
import shlex
import socket
from collections.abc import AsyncIterator

import aiohttp
import openai
import pytest
import yarl

from engines.core.procs import free_loopback_port
from engines.errors import ControlAPIError
from engines.events import EngineState, EngineStateChanged, Notice
from tests.conftest import RunningDaemon, fast_settings


async def start_fake(
    d: RunningDaemon,
    name: str = "fake",
    *,
    args: str = "",
    wait: bool = True,
    device: str = "cpu",
    **fields: object,
) -> None:
    d.write_profile(
        name,
        model="org/" + name,
        served_name=name,
        device=device,
        env={"FAKE_ENGINE_ARGS": args},
        **fields,
    )
    await d.client.start(name)
    if wait:
        status = await d.client.wait_for_engine(name, (EngineState.READY, EngineState.FAILED), 20)
        assert status.state == EngineState.READY, status.detail


def sdk(d: RunningDaemon, **kw: object) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0, **kw)


async def test_chat_streaming_and_not_through_gateway(daemon: RunningDaemon) -> None:
    await start_fake(daemon)
    daemon.write_profile("idle", model="org/idle", served_name="idle", device="cpu")
    client = sdk(daemon)
    models = await client.models.list()  # every model that can be served here, unloaded too
    by_id = {m.id: m for m in models.data}
    assert by_id["fake"].status["value"] == "loaded"  # type: ignore[attr-defined]
    assert by_id["idle"].status["value"] == "unloaded"  # type: ignore[attr-defined]
    assert "llama-3.1-8b" not in by_id  # a GPU preset, on a computer without a GPU
    reply = await client.chat.completions.create(
        model="fake", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert reply.choices[0].message.content == "w0 w1 w2 w3"
    stream = await client.chat.completions.create(
        model="fake", messages=[{"role": "user", "content": "hi"}], max_tokens=5, stream=True
    )
    pieces = [c.choices[0].delta.content async for c in stream if c.choices]
    assert "".join(p or "" for p in pieces).split() == ["w0", "w1", "w2", "w3", "w4"]
    emb = await client.embeddings.create(model="fake", input=["a", "b"])
    assert len(emb.data) == 2
    await client.close()


async def test_unknown_model_lists_served_ones(daemon: RunningDaemon) -> None:
    await start_fake(daemon)
    client = sdk(daemon)
    with pytest.raises(openai.NotFoundError) as err:
        await client.chat.completions.create(model="nope", messages=[], max_tokens=1)
    assert "served models: fake" in str(err.value)
    await client.close()


async def test_malformed_and_oversized_bodies(daemon_factory, fake_env) -> None:
    d = await daemon_factory(fast_settings(free_loopback_port(), max_body_bytes=4096))
    async with aiohttp.ClientSession() as http:
        async with http.post(d.url + "/v1/chat/completions", data=b"{not json") as r:
            assert r.status == 400
            assert "not valid JSON" in (await r.json())["error"]["message"]
        async with http.post(d.url + "/v1/chat/completions", json={"messages": []}) as r:
            body = await r.json()
            assert r.status == 400 and body["error"]["param"] == "model"
        async with http.post(d.url + "/v1/chat/completions", data=b"x" * 10000) as r:
            assert r.status == 413
            assert "max_body_bytes" in (await r.json())["error"]["message"]

        async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: the size shows only
            yield b"x" * 3000  # once the whole body is there
            yield b"x" * 3000

        async with http.post(d.url + "/v1/chat/completions", data=chunked()) as r:
            assert r.request_info.headers.get("Transfer-Encoding") == "chunked"
            assert r.status == 413
            assert "max_body_bytes" in (await r.json())["error"]["message"]
        async with http.post(d.url + "/v1/chat/completions", json={"model": "m", "n": 1000}) as r:
            assert r.status == 400 and (await r.json())["error"]["param"] == "n"


async def test_a_request_while_its_engine_starts_waits_for_it(daemon: RunningDaemon) -> None:
    """Models on demand: a request for a model that is starting is answered once it is ready
    (it used to get 503 + Retry-After)."""
    await start_fake(daemon, args="--startup-delay 2", wait=False)
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            daemon.url + "/v1/chat/completions",
            json={"model": "fake", "messages": [], "max_tokens": 2},
        ) as r,
    ):
        assert r.status == 200
        assert (await r.json())["choices"][0]["message"]["content"] == "w0 w1"


async def test_engine_killed_mid_stream_gives_clean_error_then_restarts(
    daemon: RunningDaemon,
) -> None:
    await start_fake(daemon, args="--crash-after-tokens 3 --token-delay 0.05")
    client = sdk(daemon)
    received: list[str] = []
    with pytest.raises(openai.APIError) as err:
        stream = await client.chat.completions.create(
            model="fake", messages=[], max_tokens=50, stream=True
        )
        async for chunk in stream:
            received.append(chunk.choices[0].delta.content or "")
    assert "stopped in the middle of the reply" in str(err.value)
    assert len(received) == 3  # what was generated before the crash did arrive
    # the supervisor notices within 2 s and restarts it (restart 1 of 3)
    with daemon.daemon.bus.subscribe(frozenset({"engine.state"})) as sub:
        while True:
            event = await asyncio.wait_for(sub.get(), 20)
            assert isinstance(event, EngineStateChanged)
            if event.state == EngineState.READY:
                break
    assert event.restarts == 1
    reply = await client.chat.completions.create(model="fake", messages=[], max_tokens=1)
    assert reply.choices[0].message.content == "w0"
    await client.close()


async def test_client_disconnect_cancels_upstream(daemon: RunningDaemon) -> None:
    await start_fake(daemon, args="--token-delay 0.05")
    engine = daemon.daemon.engine("fake")
    async with aiohttp.ClientSession() as http:
        resp = await http.post(
            daemon.url + "/v1/chat/completions",
            json={"model": "fake", "messages": [], "max_tokens": 1000, "stream": True},
        )
        await resp.content.readline()
        resp.close()  # the client goes away mid-stream
        stats_url = f"{engine.base_url}/fake/stats"
        for _ in range(50):
            async with http.get(stats_url) as r:
                stats = await r.json()
            if stats["aborted"]:
                break
            await asyncio.sleep(0.1)
    assert stats["aborted"] == 1
    assert stats["generated"] < 200  # it stopped generating for nobody
    async with aiohttp.ClientSession() as http, http.get(daemon.url + "/metrics") as r:
        assert 'traylm_requests_total{route="/v1/chat/completions",status="499"} 1' in (
            await r.text()
        )


async def test_queue_full_gives_429_with_retry_after(daemon_factory, fake_env) -> None:
    d = await daemon_factory(
        fast_settings(free_loopback_port(), max_concurrent=1, max_queue=1, queue_timeout_s=10)
    )
    await start_fake(d, args="--first-token-delay 1.0")
    async with aiohttp.ClientSession() as http:

        async def call() -> tuple[int, str | None]:
            async with http.post(
                d.url + "/v1/chat/completions",
                json={"model": "fake", "messages": [], "max_tokens": 1},
            ) as r:
                await r.read()
                return r.status, r.headers.get("Retry-After")

        results = await asyncio.gather(*(call() for _ in range(4)))
    statuses = sorted(s for s, _ in results)
    assert statuses == [200, 200, 429, 429]  # one running, one queued, two refused
    assert all(ra == "5" for s, ra in results if s == 429)


async def test_only_openai_routes_are_forwarded(daemon: RunningDaemon) -> None:
    await start_fake(daemon)
    async with aiohttp.ClientSession() as http:
        for path in ("/pause", "/collective_rpc", "/v1/load_lora_adapter", "/invocations"):
            async with http.post(daemon.url + path, json={"model": "fake"}) as r:
                assert r.status == 404, path
                assert "admin" not in await r.text()
        for raw in ("/v1/%2e%2e/api/status", "/v1//models", "/v1/models/../../api/status"):
            url = yarl.URL(daemon.url + raw, encoded=True)  # sent exactly as written
            async with http.get(url) as r:
                assert r.status == 400, raw


async def test_host_origin_and_api_key_guards(daemon_factory, fake_env) -> None:
    from engines.gateway.security import hash_key

    d = await daemon_factory(
        fast_settings(
            free_loopback_port(),
            api_key_sha256=(hash_key("sekret"),),
            allowed_origins=("http://localhost:3000",),
        )
    )
    await start_fake(d)
    url = d.url + "/v1/models"
    async with aiohttp.ClientSession() as http:
        async with http.get(url) as r:
            assert r.status == 401
        good = {"Authorization": "Bearer sekret"}
        async with http.get(url, headers=good) as r:
            assert r.status == 200
        async with http.get(url, headers={**good, "Host": f"evil.example:{d.port}"}) as r:
            assert r.status == 403 and "DNS-rebinding" in (await r.json())["error"]["message"]
        async with http.get(url, headers={**good, "Origin": "https://evil.example"}) as r:
            assert r.status == 403
            assert "Access-Control-Allow-Origin" not in r.headers
        async with http.get(url, headers={**good, "Origin": "http://localhost:3000"}) as r:
            assert r.status == 200
            assert r.headers["Access-Control-Allow-Origin"] == "http://localhost:3000"
        async with http.get(d.url + "/health") as r:  # health stays open for probes
            assert r.status == 200
        async with http.get(d.url + "/api/status") as r:  # control API needs its token
            assert r.status == 401


async def test_metrics_exposes_gateway_series(daemon: RunningDaemon) -> None:
    await start_fake(daemon)
    client = sdk(daemon)
    stream = await client.chat.completions.create(
        model="fake", messages=[], max_tokens=3, stream=True, stream_options={"include_usage": True}
    )
    async for _ in stream:
        pass
    await client.close()
    async with aiohttp.ClientSession() as http, http.get(daemon.url + "/metrics") as r:
        text = await r.text()
    assert 'traylm_requests_total{route="/v1/chat/completions",status="200"} 1' in text
    assert 'traylm_time_to_first_token_seconds_count{model="fake"} 1' in text
    assert 'traylm_generation_tokens_total{model="fake"} 3' in text
    assert 'traylm_queue_depth{engine="fake"} 0' in text


async def test_bad_input_gets_one_clear_message_everywhere(
    daemon: RunningDaemon, caplog: pytest.LogCaptureFixture
) -> None:
    with daemon.daemon.bus.subscribe(frozenset({"notice"})) as sub:
        daemon.write_profile(
            "typo", model="org/x", device="cpu", extra_flags=["--max-num-seq", "4"]
        )
        with pytest.raises(ControlAPIError) as err:
            await daemon.client.start("typo")
        assert "does not accept --max-num-seq; did you mean --max-num-seqs?" in err.value.message
        event = await asyncio.wait_for(sub.get(), 2)
        assert isinstance(event, Notice) and "--max-num-seqs" in event.message
    daemon.write_profile("nopath", model="/does/not/exist", device="cpu")
    with pytest.raises(ControlAPIError, match="does not exist"):
        await daemon.client.start("nopath")
    with (
        caplog.at_level(logging.WARNING, logger="engines"),
        pytest.raises(ControlAPIError, match="no profile named 'nosuch'"),
    ):
        await daemon.client.start("nosuch")
    # a refused start is in the daemon's log, not only in the client's answer
    assert any(
        r.getMessage().startswith("cannot start nosuch: no profile named 'nosuch'")
        for r in caplog.records
    )
    daemon.write_profile("gpu", model="org/x", device="cuda")  # and no CUDA engine: GPU first
    with pytest.raises(
        ControlAPIError, match=r"gpu needs an NVIDIA GPU \(this computer has none\)"
    ):
        await daemon.client.start("gpu")
    # the daemon is still serving
    assert (await daemon.client.status())["version"]


async def test_start_failure_reports_the_diagnosis(daemon: RunningDaemon) -> None:
    line = (
        "ValueError: To serve at least one request with the model's max seq len (8192), "
        "(1.0 GiB KV cache is needed, which is larger than the available KV cache memory "
        "(0.5 GiB). Based on the available memory, the estimated maximum model length is "
        "4096. Try increasing `gpu_memory_utilization`"
    )
    await start_fake(daemon, args=f"--print {shlex.quote(line)} --exit-after-print 1", wait=False)
    status = await daemon.client.wait_for_engine("fake", (EngineState.FAILED,), 20)
    assert status.diagnosis is not None
    assert status.diagnosis.code == "kv_cache_too_small"
    assert status.diagnosis.suggested == {"max_model_len": "4096"}
    assert "max_model_len = 4096" in status.detail
    assert status.restarts == 0  # a failed start is not retried: the fix is in the profile


async def test_events_stream_reports_engine_states(daemon: RunningDaemon) -> None:
    seen: list[EngineState] = []

    async def watch() -> None:
        async for event in daemon.client.events(kinds=("engine.state",)):
            assert isinstance(event, EngineStateChanged)
            seen.append(event.state)
            if event.state == EngineState.STOPPED:
                return

    bus = daemon.daemon.bus
    before = bus.subscriber_count
    watcher = asyncio.create_task(watch())
    while bus.subscriber_count == before:  # the stream is subscribed before the engine starts
        assert not watcher.done(), watcher.result()
        await asyncio.sleep(0.02)
    await start_fake(daemon)
    await daemon.client.stop("fake")
    await asyncio.wait_for(watcher, 10)
    assert seen == [
        EngineState.STARTING,  # launching
        EngineState.STARTING,  # spawned: its port and pid
        EngineState.READY,
        EngineState.STOPPING,
        EngineState.STOPPED,
    ]


async def test_port_in_use_names_the_holder(daemon_factory, fake_env) -> None:
    from engines.errors import PortInUseError

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        with pytest.raises(PortInUseError) as err:
            await daemon_factory(fast_settings(port))
        assert f"port {port} is held by pid" in err.value.message
        assert "gateway.port" in err.value.message
    finally:
        holder.close()


async def test_second_daemon_is_refused(daemon: RunningDaemon, daemon_factory) -> None:
    from engines.daemon import DaemonAlreadyRunning

    with pytest.raises(DaemonAlreadyRunning, match="already running"):
        await daemon_factory()


async def test_settings_patch_applies_live_and_persists(daemon: RunningDaemon) -> None:
    await daemon.client.update_settings({"gateway.allowed_hosts": ["box.lan"]})
    async with (
        aiohttp.ClientSession() as http,
        http.get(daemon.url + "/v1/models", headers={"Host": f"box.lan:{daemon.port}"}) as r,
    ):
        assert r.status == 200
    text = daemon.paths.config_file.read_text()
    assert "box.lan" in text
    with pytest.raises(ControlAPIError, match="no API key"):
        await daemon.client.update_settings({"gateway.lan_sharing": True})
    assert (
        json.loads(json.dumps(await daemon.client.settings()))["settings"]["gateway"]["lan_sharing"]
        is False
    )


async def test_unknown_engine_install_is_refused(daemon: RunningDaemon) -> None:
    with pytest.raises(ControlAPIError, match="cannot install 'llamacpp'"):
        await daemon.client.install_env("llamacpp", device="cpu")


@pytest.mark.slow
async def test_engine_install_through_the_api_reports_progress(
    daemon: RunningDaemon, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engines.envs.manager import RECIPES, EngineRecipe
    from engines.events import EnvInstallProgress

    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "setup.py").write_text("from setuptools import setup; setup(name='p', version='1')")
    monkeypatch.setitem(
        RECIPES,
        ("vllm", "cpu"),
        EngineRecipe(
            "vllm",
            "cpu",
            "0.0.9",
            str(pkg),
            import_check="print('ok')",
            probe_flags=False,
            extra_index_urls=(),
        ),
    )
    with daemon.daemon.bus.subscribe(frozenset({"env.install"})) as sub:
        job = await daemon.client.install_env("vllm", device="cpu")
        assert job["engine"] == "vllm"
        with pytest.raises(ControlAPIError, match="already running"):
            await daemon.client.install_env("vllm", device="cpu")
        phases = []
        while not phases or phases[-1] not in ("done", "failed"):
            event = await asyncio.wait_for(sub.get(), 120)
            assert isinstance(event, EnvInstallProgress)
            phases.append(event.phase)
    assert phases[-1] == "done" and "install" in phases
    names = [e["name"] for e in await daemon.client.envs()]
    assert "vllm-0.0.9-cpu" in names
