"""/api/chats and /api/metrics of the desktop feature, against a real daemon and SQLite file."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from engines.client import DaemonClient
from engines.errors import ControlAPIError
from engines.events import ChatChanged
from tests.conftest import RunningDaemon

PNG_URL = (  # a 1×1 PNG
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8Dw"
    "HwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)


async def test_images_are_kept_with_their_message(daemon: RunningDaemon) -> None:
    """A message's images are stored with it and come back in order."""
    c = daemon.client
    chat = await c.create_chat(model="see")
    message = {"role": "user", "content": "what is this?", "images": [PNG_URL, PNG_URL]}
    t = await c.add_chat_messages(chat.chat_id, [message, {"role": "assistant", "content": "a"}])
    assert t.messages[0].images == (PNG_URL, PNG_URL) and t.messages[1].images == ()
    assert (await c.chat(chat.chat_id)).messages[0].images == (PNG_URL, PNG_URL)


async def test_tool_calls_are_kept_with_their_reply(daemon: RunningDaemon) -> None:
    """A reply's tool calls (the chat's MCP tools) are stored with it, in order; a bad one is
    refused with the field named, and nothing is stored."""
    c = daemon.client
    chat = await c.create_chat(model="fake")
    run = {"name": "add", "server": "calc", "arguments": '{"a": 1}', "outcome": "allowed"}
    reply = {"role": "assistant", "content": "3", "tools": [{**run, "result": "3"}]}
    denied = {**run, "outcome": "denied", "result": "the user denied it"}
    await c.add_chat_messages(chat.chat_id, [{"role": "user", "content": "add"}, reply])
    await c.add_chat_messages(chat.chat_id, [{**reply, "tools": [denied, {**run, "result": "3"}]}])
    messages = (await c.chat(chat.chat_id)).messages
    assert messages[0].tools == ()
    assert [(t.name, t.outcome, t.result) for t in messages[1].tools] == [("add", "allowed", "3")]
    assert [t.outcome for t in messages[2].tools] == ["denied", "allowed"]
    assert messages[2].tools[0].arguments == '{"a": 1}' and messages[2].tools[0].server == "calc"
    with pytest.raises(ControlAPIError, match=r"messages\[0\]\.tools\[0\]\.outcome"):
        await c.add_chat_messages(chat.chat_id, [{**reply, "tools": [{**run, "outcome": "x"}]}])
    assert len((await c.chat(chat.chat_id)).messages) == 3


async def test_conversation_lifecycle(daemon: RunningDaemon) -> None:
    c = daemon.client
    chat = await c.create_chat(model="fake", params={"temperature": 0.5, "max_tokens": 64})
    assert chat.title == "" and chat.message_count == 0
    assert chat.params == {"temperature": 0.5, "max_tokens": 64.0}
    t = await c.add_chat_messages(
        chat.chat_id,
        [
            {"role": "user", "content": "  What is   a KV cache, in one line? " + "x" * 80},
            {
                "role": "assistant",
                "content": "Memory for attention keys and values.",
                "model": "fake",
                "stats": {"ttft_s": 0.12, "tokens_per_s": 41.5, "completion_tokens": 7},
                "finish_reason": "stop",
            },
        ],
    )
    assert [m.position for m in t.messages] == [0, 1]
    assert t.chat.title.startswith("What is a KV cache, in one line?")
    assert t.chat.title.endswith("…") and len(t.chat.title) == 60
    assert t.messages[1].stats == {"ttft_s": 0.12, "tokens_per_s": 41.5, "completion_tokens": 7.0}
    assert t.messages[1].finish_reason == "stop"

    # regenerate: replace the reply at position 1
    t = await c.add_chat_messages(
        chat.chat_id,
        [{"role": "assistant", "content": "partial", "finish_reason": "stopped"}],
        truncate_from=1,
    )
    assert [(m.position, m.content, m.finish_reason) for m in t.messages][1:] == [
        (1, "partial", "stopped")
    ]
    # edit and resend: replace from the user message on
    t = await c.add_chat_messages(
        chat.chat_id, [{"role": "user", "content": "edited"}], truncate_from=0
    )
    assert [m.content for m in t.messages] == ["edited"]
    assert t.chat.title == "edited"  # a title taken from the first question follows it

    renamed = await c.update_chat(chat.chat_id, title="KV", system_prompt="Be brief.")
    assert (renamed.title, renamed.system_prompt) == ("KV", "Be brief.")
    t = await c.add_chat_messages(
        chat.chat_id, [{"role": "user", "content": "edited again"}], truncate_from=0
    )
    assert t.chat.title == "KV"  # a title the user gave stays
    assert [s.chat_id for s in await c.chats()] == [chat.chat_id]
    await c.delete_chat(chat.chat_id)
    assert await c.chats() == []
    with pytest.raises(ControlAPIError, match="no conversation") as err:
        await c.chat(chat.chat_id)
    assert err.value.http_status == 404


async def test_newest_conversation_first(daemon: RunningDaemon) -> None:
    first = await daemon.client.create_chat(title="first")
    second = await daemon.client.create_chat(title="second")
    assert [s.title for s in await daemon.client.chats()] == ["second", "first"]
    await daemon.client.add_chat_messages(first.chat_id, [{"role": "user", "content": "hi"}])
    listed = await daemon.client.chats()
    assert [s.chat_id for s in listed] == [first.chat_id, second.chat_id]
    assert listed[0].message_count == 1


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ({"messages": [{"role": "wizard", "content": "x"}]}, "role must be one of"),
        ({"messages": [{"role": "user"}]}, "content must be text"),
        ({"messages": []}, "messages must be a list of 1 to"),
        (
            {"messages": [{"role": "user", "content": "x", "stats": {"speed": 1}}]},
            "stats.speed is unknown",
        ),
        (
            {"messages": [{"role": "user", "content": "x", "finish_reason": "maybe"}]},
            "finish_reason must be one of",
        ),
        ({"messages": [{"role": "user", "content": "x"}], "truncate_from": "1"}, "truncate_from"),
        (
            {"messages": [{"role": "user", "content": "x", "images": ["http://x/cat.png"]}]},
            "images[0] must be a data:image/png, jpeg, webp or gif;base64 URL",
        ),
        (
            {"messages": [{"role": "user", "content": "x", "images": ["data:image/png;base64,a"]}]},
            "images[0] is not valid base64",
        ),
        (
            {"messages": [{"role": "user", "content": "x", "images": [PNG_URL] * 5}]},
            "images must be a list of at most 4 images",
        ),
    ],
)
async def test_bad_messages_get_one_clear_error(
    daemon: RunningDaemon, call: dict[str, object], message: str
) -> None:
    chat = await daemon.client.create_chat()
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {daemon.daemon.token}"}) as http,
        http.post(f"{daemon.url}/api/chats/{chat.chat_id}/messages", json=call) as r,
    ):
        assert r.status == 400
        assert message in (await r.json())["error"]["message"]
    assert (await daemon.client.chat(chat.chat_id)).messages == ()  # nothing half-written


async def test_bad_params_and_ids(daemon: RunningDaemon) -> None:
    with pytest.raises(ControlAPIError, match=r"params\.temperature must be a number from 0 to 2"):
        await daemon.client.create_chat(params={"temperature": 7})
    with pytest.raises(ControlAPIError, match=r"params\.seed is unknown"):
        await daemon.client.create_chat(params={"seed": 1})
    with pytest.raises(ControlAPIError, match="cannot change created_s"):
        chat = await daemon.client.create_chat()
        await daemon.client.update_chat(chat.chat_id, created_s=0)
    with pytest.raises(ControlAPIError, match="no conversation 999"):
        await daemon.client.add_chat_messages(999, [{"role": "user", "content": "x"}])
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {daemon.daemon.token}"}) as http,
        http.get(f"{daemon.url}/api/chats/abc") as r,
    ):
        assert r.status == 400 and "must be a whole number" in (await r.json())["error"]["message"]


async def test_changes_are_published(daemon: RunningDaemon) -> None:
    with daemon.daemon.bus.subscribe(frozenset({"chat"})) as sub:
        chat = await daemon.client.create_chat()
        await daemon.client.add_chat_messages(chat.chat_id, [{"role": "user", "content": "x"}])
        await daemon.client.delete_chat(chat.chat_id)
        seen = [await asyncio.wait_for(sub.get(), 2) for _ in range(3)]
    assert all(isinstance(e, ChatChanged) and e.chat_id == chat.chat_id for e in seen)
    assert [e.change for e in seen if isinstance(e, ChatChanged)] == [
        "created",
        "messages",
        "deleted",
    ]


async def test_history_survives_a_daemon_restart(daemon_factory, fake_env) -> None:
    d = await daemon_factory()
    chat = await d.client.create_chat(title="kept")
    await d.client.add_chat_messages(chat.chat_id, [{"role": "user", "content": "remember me"}])
    d.daemon.request_stop("test")
    while d.paths.daemon_json.exists():  # the daemon removes daemon.json once it is down
        await asyncio.sleep(0.05)
    d2 = await daemon_factory(d.daemon.settings)
    transcript = await d2.client.chat(chat.chat_id)
    assert transcript.chat.title == "kept"
    assert [m.content for m in transcript.messages] == ["remember me"]


async def test_metrics_route_needs_the_control_token(daemon: RunningDaemon) -> None:
    text = await daemon.client.gateway_metrics()
    assert "traylm_requests_total" in text
    async with aiohttp.ClientSession() as http, http.get(f"{daemon.url}/api/metrics") as r:
        assert r.status == 401


async def test_api_keys_added_by_the_client_are_accepted(daemon: RunningDaemon) -> None:
    key = await daemon.client.add_api_key()
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{daemon.url}/v1/models") as r:
            assert r.status == 401  # keys now guard /v1
        async with http.get(
            f"{daemon.url}/v1/models", headers={"Authorization": f"Bearer {key}"}
        ) as r:
            assert r.status == 200
        settings = await daemon.client.settings()
        (digest,) = settings["settings"]["gateway"]["api_key_sha256"]
        await daemon.client.remove_api_key(digest)
        async with http.get(f"{daemon.url}/v1/models") as r:
            assert r.status == 200
    with pytest.raises(ControlAPIError, match="no such API key"):
        await daemon.client.remove_api_key(digest)


async def test_client_reads_chats_after_reconnect(daemon: RunningDaemon) -> None:
    await daemon.client.create_chat(title="x")
    async with await DaemonClient.connect(daemon.paths) as other:
        assert [s.title for s in await other.chats()] == ["x"]


async def test_changing_the_port_keeps_the_running_daemon_reachable(daemon: RunningDaemon) -> None:
    """gateway.port applies at the next start; until then clients keep using the old port
    (before the fix the Host check moved at once and locked every client out)."""
    new_port = daemon.port + 1
    await daemon.client.update_settings({"gateway.port": new_port})
    assert (await daemon.client.status())["version"]
    assert f"port = {new_port}" in daemon.paths.config_file.read_text()
