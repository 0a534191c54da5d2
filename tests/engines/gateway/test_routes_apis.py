"""The routes beyond chat through the real daemon and gateway, with the FAKE vLLM env (its fake
engine mounts routes per model task as vLLM 0.32 does): Responses, Anthropic Messages,
models.retrieve, tokenize, rerank/score, audio, and the capability errors."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import aiohttp
import anthropic
import openai
import pytest

from engines.config.sections import RequestsSettings
from engines.core.procs import free_loopback_port
from engines.envs.manager import ROUTES_FILE, load_routes
from engines.errors import ControlAPIError
from engines.events import EngineState
from engines.gateway.security import hash_key
from tests.conftest import RunningDaemon, fast_settings
from tests.engines.gateway.test_daemon_gateway import sdk, start_fake

STORE = {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}


def model_dir(root: Path, name: str, arch: str, **config: object) -> str:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"architectures": [arch], **config}))
    return str(folder)


async def start_local(d: RunningDaemon, name: str, model: str, **fields: object) -> None:
    """A fake engine over a local model folder (the gateway reads its config.json)."""
    env = fields.pop("env", {})
    d.write_profile(name, model=model, served_name=name, device="cpu", env=env, **fields)
    await d.client.start(name)
    status = await d.client.wait_for_engine(name, (EngineState.READY, EngineState.FAILED), 20)
    assert status.state == EngineState.READY, status.detail


_OPEN: list[anthropic.AsyncAnthropic] = []


def anthropic_sdk(d: RunningDaemon, key: str = "unused") -> anthropic.AsyncAnthropic:
    client = anthropic.AsyncAnthropic(base_url=d.url, api_key=key, max_retries=0)
    _OPEN.append(client)
    return client


@pytest.fixture(autouse=True)
async def _close_anthropic_clients() -> AsyncIterator[None]:
    yield
    while _OPEN:
        await _OPEN.pop().close()


async def test_responses_create_stream_retrieve_and_cancel(daemon: RunningDaemon) -> None:
    d = daemon
    d.write_profile("fake", model="org/fake", served_name="fake", device="cpu", env=STORE)
    await d.client.start("fake")
    await d.client.wait_for_engine("fake", (EngineState.READY,), 20)
    client = sdk(d)
    made = await client.responses.create(model="fake", input="hi", max_output_tokens=3)
    assert made.id.startswith("resp_") and made.output_text == "w0 w1 w2"
    again = await client.responses.retrieve(made.id)
    assert again.id == made.id and again.output_text == "w0 w1 w2"
    events = [e async for e in await client.responses.create(model="fake", input="hi", stream=True)]
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    streamed_id = events[-1].response.id
    assert (await client.responses.retrieve(streamed_id)).id == streamed_id
    with pytest.raises(openai.BadRequestError, match="created with background=true"):
        await client.responses.cancel(made.id)  # kept by traylm, answered by traylm
    with pytest.raises(
        openai.NotFoundError, match="no response 'resp_nope' is known for this caller"
    ):
        await client.responses.retrieve("resp_nope")
    chained = await client.responses.create(
        model="fake", input="more", previous_response_id=made.id
    )
    assert chained.id != made.id
    assert d.daemon.ctx.responses.engine_for(chained.id, "this computer") == "fake"
    await client.close()


async def test_a_response_belongs_to_the_key_that_made_it(daemon_factory, fake_env) -> None:
    """Key B could retrieve and cancel what key A made. Now another key's
    response answers exactly as one never made: 404, never 403 (that would say it exists)."""
    keys = (hash_key("key-a"), hash_key("key-b"))
    d = await daemon_factory(fast_settings(free_loopback_port(), api_key_sha256=keys))
    await start_local(d, "fake", "org/fake", env=STORE)
    a = openai.AsyncOpenAI(base_url=d.url + "/v1", api_key="key-a", max_retries=0)
    b = openai.AsyncOpenAI(base_url=d.url + "/v1", api_key="key-b", max_retries=0)
    made = await a.responses.create(model="fake", input="hi", max_output_tokens=3)
    events = [e async for e in await a.responses.create(model="fake", input="hi", stream=True)]
    streamed_id = events[-1].response.id

    async def refused(call: Awaitable[object], response_id: str) -> str:
        with pytest.raises(openai.NotFoundError) as err:
            await call
        body = err.value.body
        assert isinstance(body, dict) and body["code"] == "response_not_found", body
        return str(body["message"]).replace(response_id, "ID")

    never = await refused(b.responses.retrieve("resp_never"), "resp_never")
    assert "no response 'ID' is known for this caller: traylm keeps" in never
    for rid in (made.id, streamed_id):
        assert await refused(b.responses.retrieve(rid), rid) == never
        assert await refused(b.responses.cancel(rid), rid) == never
        assert await refused(b.responses.delete(rid), rid) == never
        assert await refused(b.responses.input_items.list(rid), rid) == never
        chained = b.responses.create(model="fake", input="more", previous_response_id=rid)
        assert await refused(chained, rid) == never
    # A still has its responses: traylm answers retrieve, input_items, delete and cancel
    assert (await a.responses.retrieve(made.id)).output_text == "w0 w1 w2"
    assert (await a.responses.retrieve(streamed_id)).id == streamed_id
    with pytest.raises(openai.BadRequestError, match="created with background=true"):
        await a.responses.cancel(made.id)
    items = await a.responses.input_items.list(made.id)
    assert [item.model_dump()["content"][0]["text"] for item in items.data] == ["hi"]
    chained_a = await a.responses.create(model="fake", input="more", previous_response_id=made.id)
    assert (await a.responses.retrieve(chained_a.id)).id == chained_a.id
    await a.responses.delete(made.id)
    assert await refused(a.responses.retrieve(made.id), made.id) == never
    await a.close()
    await b.close()


async def test_unknown_previous_response_id_when_nobody_keeps_responses(
    daemon_factory, fake_env
) -> None:
    """With traylm keeping none (requests.responses_keep = 0): the engine's 404, with both ways to
    keep responses."""
    settings = fast_settings(free_loopback_port())
    d = await daemon_factory(
        dataclasses.replace(settings, requests=RequestsSettings(responses_keep=0))
    )
    await start_fake(d)  # this engine does not keep responses
    client = sdk(d)
    with pytest.raises(openai.NotFoundError) as err:
        await client.responses.create(model="fake", input="hi", previous_response_id="resp_x")
    message = str(err.value)
    assert "Response with id 'resp_x' not found." in message
    assert "VLLM_ENABLE_RESPONSES_API_STORE" in message and "profile 'fake'" in message
    assert "requests.responses_keep" in message
    await client.close()


async def test_anthropic_messages_stream_and_count_tokens(daemon: RunningDaemon) -> None:
    await start_fake(daemon)
    client = anthropic_sdk(daemon)
    msg = await client.messages.create(
        model="fake", max_tokens=3, messages=[{"role": "user", "content": "hi"}]
    )
    assert msg.content[0].text == "w0 w1 w2" and msg.usage.output_tokens == 3
    async with client.messages.stream(
        model="fake", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        text = "".join([t async for t in stream.text_stream])
    assert text.split() == ["w0", "w1", "w2", "w3"]
    counted = await client.messages.count_tokens(
        model="fake", messages=[{"role": "user", "content": "hi"}]
    )
    assert counted.input_tokens == 3
    await client.close()


async def test_anthropic_errors_are_anthropic_shaped(daemon: RunningDaemon) -> None:
    await start_fake(daemon)
    client = anthropic_sdk(daemon)
    hi = [{"role": "user", "content": "hi"}]
    with pytest.raises(anthropic.BadRequestError) as err:  # an OpenAI-only field
        await client.messages.create(model="fake", max_tokens=3, messages=hi, extra_body={"n": 2})
    assert err.value.body == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": err.value.body["error"]["message"],  # type: ignore[index]
        },
    }
    assert "'n' is an OpenAI API field" in str(err.value)
    with pytest.raises(anthropic.NotFoundError) as missing:
        await client.messages.create(model="nope", max_tokens=3, messages=hi)
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    assert "served models: fake" in str(missing.value)
    async with aiohttp.ClientSession() as http:
        async with http.post(daemon.url + "/v1/messages/batches", json={}) as r:
            body = await r.json()
            assert r.status == 404 and body["type"] == "error", body
        async with http.post(
            daemon.url + "/v1/messages", json={"model": "fake", "messages": hi}
        ) as r:
            body = await r.json()
            assert r.status == 400 and "'max_tokens' is required" in body["error"]["message"]
    await client.close()


async def test_api_keys_work_as_bearer_and_as_x_api_key(daemon_factory, fake_env) -> None:
    d = await daemon_factory(
        fast_settings(free_loopback_port(), api_key_sha256=(hash_key("sekret"),))
    )
    await start_fake(d)
    hi = [{"role": "user", "content": "hi"}]
    good = anthropic_sdk(d, key="sekret")
    assert (await good.messages.create(model="fake", max_tokens=1, messages=hi)).content
    bad = anthropic_sdk(d, key="wrong")
    with pytest.raises(anthropic.AuthenticationError) as err:
        await bad.messages.create(model="fake", max_tokens=1, messages=hi)
    assert err.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    assert "x-api-key" in str(err.value)
    async with aiohttp.ClientSession() as http:
        headers = {"x-api-key": "sekret", "anthropic-version": "2023-06-01"}
        async with http.get(d.url + "/v1/models", headers=headers) as r:
            assert r.status == 200
        async with http.get(d.url + "/v1/models", headers={"x-api-key": "wrong"}) as r:
            assert r.status == 401 and "error" in await r.json()  # OpenAI shape off /v1/messages
    async with sdk(d) as no_key:
        with pytest.raises(openai.AuthenticationError):
            await no_key.models.list()
    await good.close()
    await bad.close()


async def test_keys_for_lan_only_and_traylms_own_chat_credential(daemon_factory, fake_env) -> None:
    """With keys for LAN clients only (gateway.keys_for = "lan"), apps on this computer need no
    key; with keys for all, they do, except traylm's own chat window, which sends the daemon's
    control token (X-Traylm-Token) and keeps working whatever the keys."""
    d = await daemon_factory(
        fast_settings(free_loopback_port(), api_key_sha256=(hash_key("sekret"),), keys_for="lan")
    )
    await start_fake(d)
    token = d.client.info.token
    hi = {"model": "fake", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as http:
        async with http.post(d.url + "/v1/chat/completions", json=hi) as r:
            assert r.status == 200  # from this computer, no key needed
        await d.client.update_settings({"gateway.keys_for": "all"})
        async with http.get(d.url + "/v1/models") as r:
            assert r.status == 401
        async with http.get(d.url + "/v1/models", headers={"X-Traylm-Token": token}) as r:
            assert r.status == 200
        async with http.post(
            d.url + "/v1/chat/completions", json=hi, headers={"X-Traylm-Token": token}
        ) as r:
            assert r.status == 200
        async with http.get(d.url + "/v1/models", headers={"X-Traylm-Token": "guess"}) as r:
            assert r.status == 401
        async with http.get(d.url + "/v1/models", headers={"Authorization": "Bearer sekret"}) as r:
            assert r.status == 200
    with pytest.raises(ControlAPIError, match="keys_for"):
        await d.client.update_settings({"gateway.keys_for": "nobody"})


async def test_models_retrieve_tokenize_rerank_score_and_audio(daemon: RunningDaemon) -> None:
    await start_fake(daemon)  # no config.json: the fake mounts every task's routes
    client = sdk(daemon)
    model = await client.models.retrieve("fake")
    assert model.id == "fake" and model.owned_by == "traylm"
    with pytest.raises(openai.NotFoundError, match="served models: fake"):
        await client.models.retrieve("nope")
    transcript = await client.audio.transcriptions.create(
        model="fake", file=("a.wav", b"RIFF" + bytes(100), "audio/wav")
    )
    assert transcript.text == "w0 w1 (104 bytes)"
    async with aiohttp.ClientSession() as http:
        body = {"model": "fake", "prompt": "hello big world"}
        async with http.post(daemon.url + "/tokenize", json=body) as r:
            tokens = (await r.json())["tokens"]
            assert len(tokens) == 3
        body = {"model": "fake", "tokens": tokens[1:]}
        async with http.post(daemon.url + "/detokenize", json=body) as r:
            assert (await r.json())["prompt"] == "big world"
        body = {"model": "fake", "query": "q", "documents": ["a", "b"]}
        async with http.post(daemon.url + "/v1/rerank", json=body) as r:
            assert [x["index"] for x in (await r.json())["results"]] == [0, 1]
        body = {"model": "fake", "queries": "q", "documents": ["a", "b", "c"]}
        async with http.post(daemon.url + "/v1/score", json=body) as r:
            assert len((await r.json())["data"]) == 3
        async with http.post(daemon.url + "/tokenize", json={"prompt": "ab"}) as r:
            assert r.status == 400 and "'model' is required" in await r.text()
    await client.close()


async def test_admin_and_unlisted_engine_routes_stay_unreachable(daemon: RunningDaemon) -> None:
    await start_fake(daemon)
    admin = (
        "/pause",
        "/collective_rpc",
        "/sleep",
        "/wake_up",
        "/is_sleeping",
        "/reset_prefix_cache",
        "/start_profile",
        "/scale_elastic_ep",
        "/inference/v1/generate",
        "/v1/chat/completions/render",
        "/v1/responses/render",
        "/invocations",
    )
    async with aiohttp.ClientSession() as http:
        for path in admin:
            async with http.post(daemon.url + path, json={"model": "fake"}) as r:
                text = await r.text()
                # /v1/responses/render meets GET /v1/responses/{response_id}: 405, not relayed
                assert r.status in (404, 405) and path in text, path
                assert "admin" not in text


async def test_capabilities_from_the_model_config(daemon: RunningDaemon, tmp_path: Path) -> None:
    d = daemon
    await start_local(d, "gen", model_dir(tmp_path, "gen", "LlamaForCausalLM"))
    await start_local(
        d, "emb", model_dir(tmp_path, "emb", "BertModel"), runner="pooling", aliases=["bge"]
    )
    client = sdk(d)
    with pytest.raises(openai.BadRequestError) as err:
        await client.embeddings.create(model="gen", input="x")
    text = str(err.value)
    assert "'gen' is a text-generation model (LlamaForCausalLM)" in text
    assert 'runner = "pooling"' in text and "/v1/embeddings" in text
    with pytest.raises(openai.BadRequestError, match="speech-to-text model"):
        await client.audio.transcriptions.create(model="gen", file=("a.wav", b"RIFF", "audio/wav"))
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(
            model="bge", messages=[{"role": "user", "content": "x"}]
        )
    assert "'bge' is an embedding model (BertModel)" in str(err.value)
    assert "cannot serve /v1/chat/completions" in str(err.value)
    assert len((await client.embeddings.create(model="emb", input=["a", "b"])).data) == 2
    assert (await client.chat.completions.create(model="gen", messages=[], max_tokens=2)).choices
    with pytest.raises(anthropic.BadRequestError, match="embedding model"):
        await anthropic_sdk(d).messages.create(
            model="emb", max_tokens=1, messages=[{"role": "user", "content": "x"}]
        )
    await client.close()


async def test_the_engines_bare_404_is_explained(daemon: RunningDaemon) -> None:
    """No config.json to read: the gateway forwards, and explains FastAPI's bare 404."""
    await start_fake(daemon, runner="generate")
    client = sdk(daemon)
    with pytest.raises(openai.NotFoundError) as err:
        await client.embeddings.create(model="fake", input="x")
    assert "vllm 0.32.0 (engine 'fake') does not serve POST /v1/embeddings" in str(err.value)
    assert err.value.body["code"] == "route_not_served"  # type: ignore[index]
    await client.close()


async def test_a_route_the_version_lacks_is_a_404_naming_it(
    daemon: RunningDaemon, fake_env: Path
) -> None:
    """An env's own probed list wins over the shipped one: here, a version without Messages."""
    shipped = load_routes("vllm", "0.32.0")
    assert shipped is not None and shipped.serves("POST", "/v1/messages", ["generate"])
    older = {t: sorted(r for r in rs if "/v1/messages" not in r) for t, rs in shipped.tasks.items()}
    data = {"engine": "vllm", "version": "0.32.0", "tasks": older}
    (fake_env / ROUTES_FILE).write_text(json.dumps(data))
    await start_fake(daemon)
    with pytest.raises(anthropic.NotFoundError) as err:
        await anthropic_sdk(daemon).messages.create(
            model="fake", max_tokens=1, messages=[{"role": "user", "content": "x"}]
        )
    assert "vllm 0.32.0 (engine 'fake', serving 'fake') does not serve POST /v1/messages" in str(
        err.value
    )
    assert err.value.body["type"] == "error"  # type: ignore[index]


async def test_tools_need_a_tool_parser(daemon: RunningDaemon, tmp_path: Path) -> None:
    d = daemon
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    hi = [{"role": "user", "content": "x"}]
    await start_local(d, "llama-3-plain", model_dir(tmp_path, "Llama-3-8B", "LlamaForCausalLM"))
    client = sdk(d)
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(model="llama-3-plain", messages=hi, tools=tools)
    text = str(err.value)
    assert "Set tool_parser = \"llama3_json\" in profile 'llama-3-plain'" in text
    assert "Tool calling format" in text
    none = await client.chat.completions.create(
        model="llama-3-plain", messages=hi, tools=tools, tool_choice="none", max_tokens=1
    )
    assert none.choices
    await start_local(
        d, "tooled", model_dir(tmp_path, "tooled", "LlamaForCausalLM"), tool_parser="llama3_json"
    )
    ok = await client.chat.completions.create(
        model="tooled", messages=hi, tools=tools, max_tokens=1
    )
    assert ok.choices
    with pytest.raises(anthropic.BadRequestError, match="tool_parser"):
        await anthropic_sdk(d).messages.create(
            model="llama-3-plain",
            max_tokens=1,
            messages=hi,
            tools=[{"name": "f", "input_schema": {"type": "object"}}],
        )
    await client.close()


async def test_an_engine_dying_mid_messages_stream_ends_it_with_an_anthropic_error(
    daemon: RunningDaemon,
) -> None:
    """The anthropic SDK ignores events it does not know: an OpenAI-shaped error event would
    leave it with a silently cut reply. It gets Anthropic's ``error`` event and raises."""
    await start_fake(daemon, args="--crash-after-tokens 3 --token-delay 0.05")
    received: list[str] = []
    with pytest.raises(anthropic.APIError, match="stopped in the middle of the reply"):
        async with anthropic_sdk(daemon).messages.stream(
            model="fake", max_tokens=50, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            async for text in stream.text_stream:
                received.append(text)
    assert received == ["w0 ", "w1 ", "w2 "]  # what came before the crash did arrive
