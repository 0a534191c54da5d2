"""Attached servers: an OpenAI-compatible server traylm did not start (here a FAKE engine
process and small aiohttp apps on loopback) is routed like an engine, health-checked, shown as
external, and never stopped; a URL that is down, not OpenAI or public is refused at once."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import openai
import pytest
from aiohttp import web

from engines.core.procs import free_loopback_port
from engines.errors import ControlAPIError
from tests.conftest import RunningDaemon
from tests.engines.ondemand.conftest import ask, sdk

ENGINE = Path(__file__).parents[2] / "fakes" / "openai_engine.py"


async def until_up(url: str) -> None:
    async with aiohttp.ClientSession() as http:
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(url + "/health") as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.05)


@pytest.fixture
def external() -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A FAKE engine the user started themselves (served name "mine")."""
    port = free_loopback_port()
    proc = subprocess.Popen(
        [sys.executable, str(ENGINE), "--port", str(port), "--served-model-name", "mine"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    yield proc, f"http://127.0.0.1:{port}"
    proc.kill()
    proc.wait()


@contextlib.asynccontextmanager
async def app_server(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_loopback_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_attached_server_is_routed_shown_external_and_never_stopped(
    od: RunningDaemon, external: tuple[subprocess.Popen[bytes], str]
) -> None:
    proc, url = external
    await asyncio.wait_for(until_up(url), 30)
    server = await od.client.attach("ext", url + "/v1")
    assert server.state == "ready" and server.models == ("mine",) and server.url == url
    client = sdk(od)
    assert await ask(client, "ext") == "w0 w1"  # the attach name, rewritten to "mine"
    assert await ask(client, "mine") == "w0 w1"  # and the server's own model id
    listed = {m.id: m for m in (await client.models.list()).data}
    assert listed["ext"].traylm["external"] is True  # type: ignore[attr-defined]
    assert listed["ext"].status["value"] == "loaded"  # type: ignore[attr-defined]
    rows = {r.name: r for r in await od.client.loaded_models()}
    assert rows["ext"].external and rows["ext"].origin == "attached" and rows["ext"].url == url
    with pytest.raises(ControlAPIError, match="traylm never stops it"):
        await od.client.unload_model("ext")
    assert proc.poll() is None
    # it goes down: the health check says so and requests get a clear 503
    proc.kill()
    proc.wait()
    checked = await od.daemon.ondemand.attached.check("ext")
    assert checked.state == "unreachable" and "does not answer" in checked.detail
    with pytest.raises(openai.InternalServerError, match="attached server ext .* unreachable"):
        await ask(client, "ext")
    await od.client.detach("ext")
    with pytest.raises(openai.NotFoundError):
        await ask(client, "ext")
    await client.close()


async def test_the_daemon_stopping_leaves_an_attached_server_running(
    od: RunningDaemon, external: tuple[subprocess.Popen[bytes], str]
) -> None:
    proc, url = external
    await asyncio.wait_for(until_up(url), 30)
    await od.client.attach("ext", url)
    od.daemon.request_stop("test")
    while od.paths.daemon_json.exists():  # removed at the very end of the shutdown
        await asyncio.sleep(0.05)
    assert proc.poll() is None
    await until_up(url)


async def test_the_key_comes_from_the_named_variable_and_is_never_stored(
    od: RunningDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []

    async def models(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        if request.headers.get("Authorization") != "Bearer s3cret":
            return web.json_response({"error": "no"}, status=401)
        return web.json_response({"object": "list", "data": [{"id": "keyed"}]})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    async with app_server(app) as url:
        with pytest.raises(ControlAPIError, match="refused the key"):
            await od.client.attach("k", url)
        with pytest.raises(ControlAPIError, match="MY_KEY is empty"):
            await od.client.attach("k", url, key_env="MY_KEY")
        monkeypatch.setenv("MY_KEY", "s3cret")  # the daemon's own environment
        server = await od.client.attach("k", url, key_env="MY_KEY")
        assert server.state == "ready" and server.key_env == "MY_KEY"
    stored = (od.paths.config_dir / "attached.toml").read_text()
    assert "MY_KEY" in stored and "s3cret" not in stored
    assert seen[-1] == "Bearer s3cret"


async def test_down_not_openai_and_public_urls_are_refused(od: RunningDaemon) -> None:
    down = f"http://127.0.0.1:{free_loopback_port()}"
    with pytest.raises(ControlAPIError, match="does not answer") as err:
        await od.client.attach("x", down)
    assert err.value.http_status == 400

    async def html(request: web.Request) -> web.Response:
        return web.Response(text="<html>hello</html>")

    app = web.Application()
    app.router.add_get("/v1/models", html)
    async with app_server(app) as url:
        with pytest.raises(ControlAPIError, match="is not JSON: not an OpenAI server"):
            await od.client.attach("x", url)
    async with app_server(web.Application()) as url:
        with pytest.raises(ControlAPIError, match="answered 404: not an OpenAI-compatible"):
            await od.client.attach("x", url)
    # a public address is refused before any connection is made (an IP literal: no DNS)
    with pytest.raises(ControlAPIError, match="public address"):
        await od.client.attach("x", "http://8.8.8.8:8000/v1")
    with pytest.raises(ControlAPIError, match="not an http"):
        await od.client.attach("x", "ftp://127.0.0.1/")
    with pytest.raises(ControlAPIError, match="give the server's base URL"):
        await od.client.attach("x", "http://127.0.0.1:9/api/v2")
    assert await od.client.attached_servers() == []
    assert not (od.paths.config_dir / "attached.toml").exists()


async def test_a_kept_connection_closed_as_a_request_goes_out_is_retried(
    od: RunningDaemon,
) -> None:
    """A server that closes a kept-alive connection the moment the next request arrives on it
    (what uvicorn's 5 s keep-alive does to a request that goes out at that moment) and answers
    on new connections: every request through the gateway is answered, each after one resend
    on a new connection; the server saw each request twice, never answered twice."""
    served: set[tuple[str, int]] = set()  # the gateway's connections that had an answer
    seen: list[int] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append(body["max_tokens"])
        transport = request.transport
        assert transport is not None
        peer = transport.get_extra_info("peername")
        if peer in served:
            transport.close()  # no byte of a reply: as if it had closed while idle
            raise web.HTTPServiceUnavailable()  # written to nobody
        served.add(peer)
        return web.json_response(
            {"id": "x", "object": "chat.completion", "model": "m", "created": 0,
             "choices": [{"index": 0, "finish_reason": "stop",
                          "message": {"role": "assistant", "content": str(body["max_tokens"])}}]}
        )  # fmt: skip

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    async with app_server(app) as url:
        await od.client.attach("closing", url)
        client = sdk(od)
        answers = []
        for n in (1, 2, 3):
            reply = await client.chat.completions.create(model="closing", messages=[], max_tokens=n)
            answers.append(reply.choices[0].message.content)
        await client.close()
    assert answers == ["1", "2", "3"]
    assert seen == [1, 2, 2, 3, 3]  # the first on a new connection; then each sent again
    assert od.daemon.ctx.upstreams.resent_total == 2
