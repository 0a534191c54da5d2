"""The remote fallback and the usage log, through the real daemon and gateway, against a second
local OpenAI-compatible server on another port (a small real aiohttp server that records what it
was sent). The OS keyring is replaced by an in-memory FAKE keyring backend (this machine has
none)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import keyring
import keyring.backend
import keyring.errors
import pytest
from aiohttp import web

from engines.config.sections import RemoteSettings, Settings
from engines.core.procs import free_loopback_port
from engines.errors import ConfigError
from engines.events import EngineState, RemoteRouted
from engines.remote.service import base_url_problem, read_keyring, store_keyring, upstream_base
from tests.conftest import RunningDaemon, fast_settings
from tests.engines.runtime.test_engine_liveness import wait_until

KEY_ENV = "TRAYLM_TEST_REMOTE_KEY"


class RemoteServer:
    """A second OpenAI-compatible server: answers chat completions (JSON or SSE) and records
    each request's path and Authorization header."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None, str]] = []
        self.port = free_loopback_port()

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen.append((request.path, request.headers.get("Authorization"), body["model"]))
        if body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for word in ("remote", " reply"):
                chunk = {"choices": [{"index": 0, "delta": {"content": word}}]}
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            return resp
        return web.json_response(
            {
                "id": "r1",
                "object": "chat.completion",
                "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "remote"}}],
                "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9},
            }
        )


@pytest.fixture
async def remote_server() -> AsyncIterator[RemoteServer]:
    server = RemoteServer()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", server.chat)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", server.port).start()
    yield server
    await runner.cleanup()


def remote_settings(server: RemoteServer, *aliases: str, **gateway: Any) -> Settings:
    base = fast_settings(free_loopback_port(), **gateway)
    remote = RemoteSettings(
        enabled=True,
        base_url=f"http://127.0.0.1:{server.port}/v1",
        api_key_env=KEY_ENV,
        aliases=aliases,
    )
    return dataclasses.replace(base, remote=remote)


async def post(d: RunningDaemon, model: str, **extra: Any) -> tuple[int, dict[str, str], str]:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}
    async with (
        aiohttp.ClientSession() as http,
        http.post(d.url + "/v1/chat/completions", json=body) as r,
    ):
        return r.status, dict(r.headers), await r.text()


async def usage_rows(d: RunningDaemon, count: int) -> list[dict[str, Any]]:
    for _ in range(100):
        rows = await asyncio.to_thread(d.daemon.store.query, "SELECT * FROM usage ORDER BY id")
        if len(rows) >= count:
            return rows
        await asyncio.sleep(0.05)
    raise AssertionError(f"usage log has {len(rows)} rows, expected {count}")


async def test_off_by_default(daemon: RunningDaemon) -> None:
    status = (await daemon.client.status())["remote"]
    assert status["enabled"] is False and "off" in status["detail"]
    code, _, _ = await post(daemon, "gpt-remote")
    assert code == 404


async def test_not_served_alias_goes_remote_marked_with_the_key_and_logged(
    daemon_factory: Any, fake_env: Any, remote_server: RemoteServer, monkeypatch: Any
) -> None:
    monkeypatch.setenv(KEY_ENV, "sekrit")
    d = await daemon_factory(remote_settings(remote_server, "gpt-remote"))
    with d.daemon.bus.subscribe(frozenset({"remote"})) as sub:
        code, headers, text = await post(d, "gpt-remote")
        event = await asyncio.wait_for(sub.get(), 2)
    assert code == 200
    assert headers["X-Traylm-Route"] == "remote" and headers["X-Traylm-Engine"] == "remote"
    assert json.loads(text)["choices"][0]["message"]["content"] == "remote"
    assert remote_server.seen == [("/v1/chat/completions", "Bearer sekrit", "gpt-remote")]
    assert isinstance(event, RemoteRouted) and event.why == "not_served"
    code, headers, text = await post(d, "gpt-remote", stream=True)
    assert code == 200 and headers["X-Traylm-Route"] == "remote"
    assert '"remote"' in text and "[DONE]" in text
    code, _, _ = await post(d, "not-listed")
    assert code == 404  # only the listed aliases ever leave the machine
    rows = await usage_rows(d, 3)
    assert [(r["model"], r["status"], r["remote"]) for r in rows if not r["remote"]] == [
        ("(unknown)", 404, 0)  # logged too, but never with a name that nothing serves
    ]
    remote = [r for r in rows if r["remote"]]
    assert [(r["model"], r["engine_id"], r["status"]) for r in remote] == [
        ("gpt-remote", "remote", 200),
        ("gpt-remote", "remote", 200),
    ]
    assert remote[0]["prompt_tokens"] == 7 and remote[0]["completion_tokens"] == 2
    status = (await d.client.status())["remote"]
    assert status["ready"] is True and status["key_source"] == "env"
    assert status["routed_requests"] == 2


async def one_slot_chat(
    daemon_factory: Any, remote_server: RemoteServer, fake_args: str
) -> RunningDaemon:
    """A daemon whose FAKE engine "chat" (started, not waited for) takes one request at a time
    and queues none: the next goes to the remote fallback, listed for "chat"."""
    d: RunningDaemon = await daemon_factory(
        remote_settings(remote_server, "chat", max_concurrent=1, max_queue=0, queue_timeout_s=5)
    )
    d.write_profile(
        "chat",
        model="org/chat",
        served_name="chat",
        device="cpu",
        env={"FAKE_ENGINE_ARGS": fake_args},
    )
    await d.client.start("chat")
    return d


@pytest.mark.slow
async def test_starting_engine_and_full_queue_fall_back(
    daemon_factory: Any, fake_env: Any, remote_server: RemoteServer
) -> None:
    d = await one_slot_chat(
        daemon_factory, remote_server, "--startup-delay 2 --first-token-delay 1"
    )
    code, headers, _ = await post(d, "chat", max_tokens=1)  # still starting
    assert code == 200 and headers["X-Traylm-Route"] == "remote"
    await d.client.wait_for_engine("chat", (EngineState.READY,), 30)
    results = await asyncio.gather(post(d, "chat", max_tokens=1), post(d, "chat", max_tokens=1))
    routes = sorted(h.get("X-Traylm-Route", "local") for _, h, _ in results)
    assert [c for c, _, _ in results] == [200, 200]
    assert routes == ["local", "remote"]  # one slot, no queue: the second goes remote
    rows = await usage_rows(d, 3)
    assert sorted((r["remote"], r["status"]) for r in rows) == [(0, 200), (1, 200), (1, 200)]


async def test_a_stream_sent_remote_by_a_full_queue_is_recorded_with_its_reply(
    daemon_factory: Any, fake_env: Any, remote_server: RemoteServer
) -> None:
    """The flight recorder keeps the remote fallback's streamed reply like an engine's."""
    d = await one_slot_chat(daemon_factory, remote_server, "--first-token-delay 2")
    await d.client.wait_for_engine("chat", (EngineState.READY,), 30)
    local = asyncio.create_task(post(d, "chat", max_tokens=1))  # holds the one slot
    await wait_until(lambda: d.daemon.ctx.activity("chat")[0] == 1, "the slot taken")
    code, headers, _ = await post(d, "chat", stream=True)
    assert code == 200 and headers["X-Traylm-Route"] == "remote"
    await local
    await d.daemon.requests.flush()
    rid = next(v for k, v in headers.items() if k.lower() == "x-request-id")
    row = await d.client.request_detail(rid)
    assert row["engine_id"] == "remote" and row["reply"]["text"] == "remote reply"


async def test_plain_http_to_another_host_is_never_used(
    daemon_factory: Any, fake_env: Any, remote_server: RemoteServer
) -> None:
    settings = remote_settings(remote_server, "gpt-remote")
    insecure = dataclasses.replace(settings.remote, base_url="http://api.example.com/v1")
    d = await daemon_factory(dataclasses.replace(settings, remote=insecure))
    code, _, _ = await post(d, "gpt-remote")
    assert code == 404 and remote_server.seen == []
    status = await d.client.remote_status()
    assert status.ready is False and "use https" in status.detail


class FakeKeyring(keyring.backend.KeyringBackend):
    """FAKE OS keyring: an in-memory backend (the machine running the tests has no D-Bus secret
    service)."""

    priority = 1  # type: ignore[assignment]

    def __init__(self) -> None:
        super().__init__()
        self.store: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, username: str) -> str | None:
        return self.store.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self.store[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        self.store.pop((service, username), None)


async def test_key_from_the_os_keyring(
    daemon_factory: Any, fake_env: Any, remote_server: RemoteServer, monkeypatch: Any
) -> None:
    previous = keyring.get_keyring()
    keyring.set_keyring(FakeKeyring())
    try:
        monkeypatch.delenv(KEY_ENV, raising=False)
        d = await daemon_factory(remote_settings(remote_server, "gpt-remote"))
        assert (await d.client.remote_status()).key_source == "none"
        await asyncio.to_thread(store_keyring, "from-keyring")
        status = await d.client.remote_refresh_key()
        assert status.key_source == "keyring"
        assert (await post(d, "gpt-remote"))[0] == 200
        assert remote_server.seen[-1][1] == "Bearer from-keyring"
        config = d.paths.config_file.read_text() if d.paths.config_file.exists() else ""
        assert "from-keyring" not in config
        await asyncio.to_thread(store_keyring, None)
        assert read_keyring() == (None, "no key stored in the OS keyring")
    finally:
        keyring.set_keyring(previous)


def test_no_keyring_backend_gives_the_env_var_alternative(monkeypatch: Any) -> None:
    def refuse(*args: Any) -> None:
        raise keyring.errors.NoKeyringError("no backend")

    monkeypatch.setattr(keyring, "get_password", refuse)
    monkeypatch.setattr(keyring, "set_password", refuse)
    key, detail = read_keyring()
    assert key is None and "no usable OS keyring" in detail
    with pytest.raises(ConfigError, match=r"remote\.api_key_env"):
        store_keyring("k")


def test_url_rules() -> None:
    assert upstream_base("https://api.example.com/v1/") == "https://api.example.com"
    assert upstream_base("https://openrouter.ai/api/v1") == "https://openrouter.ai/api"
    assert base_url_problem("https://api.example.com/v1") == ""
    assert base_url_problem("http://localhost:9000/v1") == ""
    assert base_url_problem("http://[::1]:9000/v1") == ""
    assert "https" in base_url_problem("http://10.0.0.2/v1")
    assert "not an http(s) URL" in base_url_problem("ftp://x")


async def test_tools_for_a_remote_alias_not_loaded_go_remote_not_refused(
    daemon_factory: Any, fake_env: Any, remote_server: RemoteServer, tmp_path: Any
) -> None:
    """A local profile without a tool-call parser that is also a remote alias: while it is
    not loaded, a request with tools goes to the remote API (which may serve tools), it is not
    refused for the local engine's missing parser."""
    d = await daemon_factory(remote_settings(remote_server, "llama-both"))
    folder = tmp_path / "Llama-3-8B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    d.write_profile("llama-both", model=str(folder), served_name="llama-both", device="cpu")
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    code, headers, text = await post(d, "llama-both", tools=tools)
    assert code == 200 and headers["X-Traylm-Route"] == "remote", text
