"""Ollama's API through the real daemon (FAKE vLLM engine) with the real `ollama` client:
list, show, chat and generate streamed and not (a tool, an image), embed, ps, keep_alive 0,
a pull of a FAKE-Hub repo; raw HTTP for the error shape and the DNS-rebinding case; a port
that is taken leaves the daemon serving and says so."""

from __future__ import annotations

import base64
import dataclasses
import logging
import socket
from collections.abc import AsyncIterator

import aiohttp
import ollama
import pytest

from engines.config.sections import OllamaSettings
from engines.core.procs import free_loopback_port
from engines.gateway.security import hash_key
from tests.conftest import RunningDaemon, fast_settings
from tests.engines.gateway.test_client_trips import NO_GPU
from tests.engines.gateway.test_daemon_gateway import start_fake
from tests.traylm_cli import traylm

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 16).decode()
TOOL = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "the weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def with_ollama(port: int, **gateway: object) -> object:
    settings = fast_settings(free_loopback_port(), **gateway)
    return dataclasses.replace(settings, ollama=OllamaSettings(enabled=True, port=port))


@pytest.fixture
async def served(daemon_factory, fake_env) -> AsyncIterator[tuple[RunningDaemon, str]]:  # type: ignore[no-untyped-def]
    port = free_loopback_port()
    d: RunningDaemon = await daemon_factory(with_ollama(port))
    await start_fake(d, args="--enable-auto-tool-choice --tool-call-parser hermes")
    yield d, f"http://127.0.0.1:{port}"


async def test_the_ollama_client_lists_chats_generates_and_embeds(
    served: tuple[RunningDaemon, str],
) -> None:
    d, url = served
    async with ollama.AsyncClient(host=url) as client:
        await chat_and_generate(client)
    rows = await d.client.requests_list(limit=10, client="ollama")
    assert rows, "the recorder keeps what came through Ollama's API"


async def chat_and_generate(client: ollama.AsyncClient) -> None:
    assert (await client.list()).models[
        0
    ].model == "fake:latest"  # Ollama lists names with their tag
    shown = await client.show("fake")
    assert "completion" in (shown.capabilities or [])
    reply = await client.chat(
        model="fake",
        messages=[{"role": "user", "content": "hi", "images": [PNG]}],
        options={"num_predict": 3, "temperature": 0.1},
        stream=False,
    )
    assert reply.message.content == "w0 w1 w2"
    assert reply.done and reply.eval_count == 3
    assert reply.model == "fake"  # the reply names the model as the request did
    parts = [
        c
        async for c in await client.chat(
            model="fake:latest",
            messages=[{"role": "user", "content": "weather?"}],
            tools=[TOOL],
            options={"num_predict": 4},
            stream=True,
        )
    ]
    assert "".join(c.message.content or "" for c in parts).split() == ["w0", "w1", "w2", "w3"]
    assert parts[-1].done and parts[-1].eval_count == 4
    assert {c.model for c in parts} == {"fake:latest"}  # every line, as Ollama's
    gen = await client.generate(model="fake:latest", prompt="hello", options={"num_predict": 2})
    assert (gen.response, gen.model) == ("w0 w1", "fake:latest")
    streamed = [c async for c in await client.generate("fake", "hi", stream=True, raw=True)]
    assert streamed[-1].done
    emb = await client.embed(model="fake:latest", input=["a", "b"])
    assert len(emb.embeddings) == 2 and emb.model == "fake:latest"
    old = await client.embeddings(model="fake", prompt="a")
    assert len(old.embedding) == 3


async def test_ps_and_keep_alive_zero_unloads(served: tuple[RunningDaemon, str]) -> None:
    _, url = served
    async with ollama.AsyncClient(host=url) as client:
        ps = await client.ps()
        assert [m.model for m in ps.models] == ["fake:latest"]
        assert ps.models[0].expires_at is not None
        out = await client.generate(model="fake", prompt="", keep_alive=0)
        assert out.done_reason == "unload"
        assert (await client.ps()).models == []
        loaded = await client.generate(model="fake:latest", prompt="")  # loads, as Ollama does
        assert (loaded.done_reason, loaded.model) == ("load", "fake:latest")
        assert [m.model for m in (await client.ps()).models] == ["fake:latest"]


async def test_errors_in_ollamas_shape_and_dns_rebinding_refused(
    served: tuple[RunningDaemon, str],
) -> None:
    _, url = served
    async with aiohttp.ClientSession() as http:
        async with http.get(url + "/api/nothing") as resp:
            assert resp.status == 404
            assert "/api/chat" in (await resp.json())["error"]
        async with http.post(url + "/api/chat", json={"model": "nope", "messages": []}) as resp:
            assert resp.status == 404
            assert "fake" in (await resp.json())["error"]
        async with http.get(url + "/api/tags", headers={"Host": "attacker.example"}) as resp:
            assert resp.status == 403
            assert "DNS-rebinding" in (await resp.json())["error"]
        headers = {"Origin": "http://attacker.example"}
        async with http.post(url + "/api/generate", json={}, headers=headers) as resp:
            assert resp.status == 403
        async with http.post(url + "/api/pull", json={"model": "llama3.1:8b"}) as resp:
            assert resp.status == 400
            assert "meta-llama/Llama-3.1-8B-Instruct" in (await resp.json())["error"]


async def test_keys_apply_as_at_the_gateway(daemon_factory, fake_env) -> None:  # type: ignore[no-untyped-def]
    port = free_loopback_port()
    d: RunningDaemon = await daemon_factory(with_ollama(port, api_key_sha256=(hash_key("sekret"),)))
    await start_fake(d)
    url = f"http://127.0.0.1:{port}"
    async with ollama.AsyncClient(host=url) as client:
        with pytest.raises(ollama.ResponseError) as err:
            await client.list()
    assert err.value.status_code == 401
    bearer = {"Authorization": "Bearer sekret"}
    async with ollama.AsyncClient(host=url, headers=bearer) as keyed:
        assert (await keyed.list()).models


async def test_a_taken_port_fails_nothing_and_status_says_so(daemon_factory, fake_env) -> None:  # type: ignore[no-untyped-def]
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        d: RunningDaemon = await daemon_factory(with_ollama(port))
        status = await d.client.status()
        ollama_status = status["ollama"]
        assert ollama_status["state"] == "taken"
        assert "ollama.port" in ollama_status["detail"]
        code, out = await traylm("status")
        assert code == 0 and f"Ollama's API NOT served: port {port} is held by" in out, out
        assert f"`traylm config set ollama.port {port + 1}`" in out
    await start_fake(d)  # the daemon serves on


async def test_the_port_and_on_off_apply_live(daemon_factory, fake_env) -> None:  # type: ignore[no-untyped-def]
    first, second = free_loopback_port(), free_loopback_port()
    d: RunningDaemon = await daemon_factory(with_ollama(first))
    await d.client.update_settings({"ollama.port": second})  # answered once moved
    status = (await d.client.status())["ollama"]
    assert status["state"] == "serving" and status["port"] == second
    async with ollama.AsyncClient(host=f"http://127.0.0.1:{second}") as client:
        assert (await client.ps()).models == []
    await d.client.update_settings({"ollama.enabled": False})
    assert (await d.client.status())["ollama"]["state"] == "off"
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.ClientConnectionError):
            await http.get(f"http://127.0.0.1:{second}/api/version")


async def test_a_model_that_cannot_start_here_is_not_listed_and_refused_as_permanent(
    served: tuple[RunningDaemon, str],
) -> None:
    """On a computer without a GPU the GPU presets are neither in /api/tags nor in llama.cpp's
    /models (Open WebUI lists both), and a request for one is a 4xx saying why, not a 5xx a
    client retries."""
    d, url = served
    blocked = {m.name: m.blocked for m in await d.client.servable_models()}
    assert blocked["llama-3.1-8b"] == NO_GPU
    async with ollama.AsyncClient(host=url) as client:
        assert [m.model for m in (await client.list()).models] == ["fake:latest"]
        with pytest.raises(ollama.ResponseError) as refused:
            await client.chat(model="llama-3.1-8b", messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(ollama.ResponseError) as unshown:  # nor shown, as it is not listed
            await client.show("llama-3.1-8b")
    assert refused.value.status_code == 400 and NO_GPU in refused.value.error
    assert unshown.value.status_code == 400 and NO_GPU in unshown.value.error
    async with aiohttp.ClientSession() as http, http.get(d.url + "/models") as resp:
        ids = [m["id"] for m in (await resp.json())["data"]]
    assert "fake" in ids and "llama-3.1-8b" not in ids


async def test_refusals_are_logged_once_counted_and_recorded(
    daemon_factory,  # type: ignore[no-untyped-def]
    fake_env,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An app with a wrong key on GET /api/tags (Open WebUI lists nothing) is told in the log
    once per client and kind, counted and in `traylm requests`, as at :8000."""
    port = free_loopback_port()
    d: RunningDaemon = await daemon_factory(with_ollama(port, api_key_sha256=(hash_key("sekret"),)))
    url = f"http://127.0.0.1:{port}"
    caplog.set_level(logging.WARNING, logger="engines.gateway.refusals")
    wrong = {"Authorization": "Bearer wrong", "User-Agent": "ollama-app"}
    rids = []
    async with aiohttp.ClientSession() as http:
        for _ in range(3):
            async with http.get(url + "/api/tags", headers=wrong) as r:
                assert r.status == 401
                rids.append(r.headers["x-request-id"])
    told = [rec.getMessage() for rec in caplog.records if "refused" in rec.getMessage()]
    assert len(told) == 1 and "refused GET /api/tags" in told[0], told
    assert "missing or wrong API key" in told[0] and "ollama-app" in told[0]
    await d.daemon.requests.flush()
    rows = {r["id"]: r for r in await d.client.requests_list(limit=20, client="ollama")}
    assert [rows[rid]["status"] for rid in rids] == [401, 401, 401]
    values = d.daemon.ctx.metrics.requests.values
    assert sum(n for k, n in values.items() if ("status", "401") in k) == 3
