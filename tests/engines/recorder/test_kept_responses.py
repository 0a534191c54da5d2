"""Responses kept by traylm, through the real daemon and gateway with the
openai SDK and the FAKE vLLM engine, which keeps no responses itself (no
VLLM_ENABLE_RESPONSES_API_STORE): retrieve equals create, previous_response_id sends the engine
the earlier turns, each response is its key's, the bound drops the oldest, a restart keeps
them, store=false is not kept, an unknown id is a clear 404, capture off keeps them still."""

from __future__ import annotations

import dataclasses
from typing import Any

import aiohttp
import openai
import pytest
from openai.types.responses import Response, ResponseCompletedEvent

from engines.config.sections import RequestsSettings, Settings
from engines.core.procs import free_loopback_port
from engines.gateway.security import hash_key
from tests.conftest import DaemonFactory, RunningDaemon, fast_settings
from tests.engines.gateway.test_daemon_gateway import start_fake

OPEN: list[openai.AsyncOpenAI] = []


def settings_with(**requests: Any) -> Settings:
    settings = fast_settings(free_loopback_port())
    return dataclasses.replace(settings, requests=RequestsSettings(**requests))


def client_of(d: RunningDaemon, key: str = "unused") -> openai.AsyncOpenAI:
    client = openai.AsyncOpenAI(base_url=d.url + "/v1", api_key=key, max_retries=0)
    OPEN.append(client)
    return client


@pytest.fixture(autouse=True)
async def _close_clients() -> Any:
    yield
    while OPEN:
        await OPEN.pop().close()


async def engine_input(d: RunningDaemon) -> Any:
    """The ``input`` of the last Responses request the FAKE engine received."""
    engine = d.daemon.supervisor.engines["fake"]
    async with aiohttp.ClientSession() as http, http.get(f"{engine.base_url}/fake/stats") as r:
        return (await r.json())["last_input"]


async def not_found(call: Any) -> dict[str, Any]:
    """The OpenAI-shaped error body of a 404."""
    with pytest.raises(openai.NotFoundError) as err:
        await call
    body = err.value.body
    assert isinstance(body, dict), body
    return body


def same(a: Response, b: Response) -> bool:
    """Equal but for ``store`` (the engine says false: it keeps nothing; traylm keeps it)."""
    return a.model_dump(exclude={"store"}) == b.model_dump(exclude={"store"})


async def test_retrieve_equals_create_streamed_or_not(daemon: RunningDaemon) -> None:
    await start_fake(daemon)
    client = client_of(daemon)
    made = await client.responses.create(model="fake", input="hi", max_output_tokens=3)
    again = await client.responses.retrieve(made.id)
    assert same(again, made) and again.output_text == "w0 w1 w2" and again.model_dump()["store"]
    events = [e async for e in await client.responses.create(model="fake", input="hi", stream=True)]
    assert isinstance(events[-1], ResponseCompletedEvent)
    streamed = events[-1].response
    assert same(await client.responses.retrieve(streamed.id), streamed)


async def test_previous_response_id_sends_the_engine_the_earlier_turns(
    daemon: RunningDaemon,
) -> None:
    d = daemon
    await start_fake(d)
    client = client_of(d)
    first = await client.responses.create(model="fake", input="first", max_output_tokens=2)
    stream = await client.responses.create(
        model="fake",
        input=[{"role": "user", "content": "second"}],
        previous_response_id=first.id,
        max_output_tokens=3,
        stream=True,
    )
    last = [e async for e in stream][-1]
    assert isinstance(last, ResponseCompletedEvent)
    second = last.response
    # sent the moment the stream ended: the gateway kept it before the client had its end
    third = await client.responses.create(
        model="fake", input="third", previous_response_id=second.id, max_output_tokens=1
    )
    seen = await engine_input(d)
    texts = [
        item["content"] if isinstance(item["content"], str) else item["content"][0]["text"]
        for item in seen
    ]
    assert texts == ["first", "w0 w1", "second", "w0 w1 w2", "third"]
    assert [item["role"] for item in seen] == ["user", "assistant"] * 2 + ["user"]
    kept = await client.responses.retrieve(third.id)
    assert kept.previous_response_id == second.id and kept.output_text == "w0"
    items = await client.responses.input_items.list(third.id)
    assert [i.model_dump()["content"][0]["text"] for i in items.data] == ["third"]


async def test_a_response_is_the_keys_that_made_it(
    daemon_factory: DaemonFactory, fake_env: Any
) -> None:
    keys = (hash_key("key-a"), hash_key("key-b"))
    d = await daemon_factory(fast_settings(free_loopback_port(), api_key_sha256=keys))
    await start_fake(d)
    a, b = client_of(d, "key-a"), client_of(d, "key-b")
    made = await a.responses.create(model="fake", input="hi", max_output_tokens=2)
    for call in (
        b.responses.retrieve(made.id),
        b.responses.input_items.list(made.id),
        b.responses.delete(made.id),
        b.responses.create(model="fake", input="more", previous_response_id=made.id),
    ):
        assert (await not_found(call))["code"] == "response_not_found"
    assert (await a.responses.retrieve(made.id)).id == made.id  # B's delete did nothing


async def test_the_bound_drops_the_oldest(daemon_factory: DaemonFactory, fake_env: Any) -> None:
    d = await daemon_factory(settings_with(responses_keep=2))
    await start_fake(d)
    client = client_of(d)
    made = [
        await client.responses.create(model="fake", input=f"n{i}", max_output_tokens=1)
        for i in range(3)
    ]
    await not_found(client.responses.retrieve(made[0].id))
    for kept in made[1:]:
        assert (await client.responses.retrieve(kept.id)).id == kept.id


async def test_a_restart_keeps_them(daemon_factory: DaemonFactory, fake_env: Any) -> None:
    settings = fast_settings(free_loopback_port())
    d = await daemon_factory(settings)
    await start_fake(d)
    client = client_of(d)
    made = await client.responses.create(model="fake", input="before", max_output_tokens=2)
    d.daemon.request_stop("restart")
    assert d.task is not None
    await d.task
    d = await daemon_factory(settings)
    client = client_of(d)
    again = await client.responses.retrieve(made.id)  # no engine running: traylm answers
    assert same(again, made)
    await start_fake(d)
    await client.responses.create(model="fake", input="after", previous_response_id=made.id)
    assert [item["content"] for item in await engine_input(d)][::2] == ["before", "after"]


async def test_store_false_is_not_kept(daemon: RunningDaemon) -> None:
    await start_fake(daemon)
    client = client_of(daemon)
    made = await client.responses.create(model="fake", input="hi", store=False)
    body = await not_found(client.responses.retrieve(made.id))
    assert "none made with store: false" in body["message"]
    await not_found(
        client.responses.create(model="fake", input="more", previous_response_id=made.id)
    )


async def test_an_unknown_id_is_a_clear_404(daemon: RunningDaemon) -> None:
    await start_fake(daemon)
    client = client_of(daemon)
    body = await not_found(client.responses.retrieve("resp_unknown"))
    assert body["code"] == "response_not_found" and body["param"] == "response_id"
    assert body["type"] and body["message"].startswith("no response 'resp_unknown' is known")
    assert "requests.responses_keep" in body["message"]
    chained = client.responses.create(model="fake", input="x", previous_response_id="resp_unknown")
    assert (await not_found(chained))["param"] == "previous_response_id"


async def test_kept_with_capture_off(daemon_factory: DaemonFactory, fake_env: Any) -> None:
    """The request log off still keeps responses (the client asked: store defaults to true)."""
    d = await daemon_factory(settings_with(capture="off"))
    await start_fake(d)
    client = client_of(d)
    made = await client.responses.create(model="fake", input="hi", max_output_tokens=2)
    assert same(await client.responses.retrieve(made.id), made)
    await d.daemon.requests.flush()
    assert await d.client.requests_list() == []


async def test_none_kept_when_set_to_zero(daemon_factory: DaemonFactory, fake_env: Any) -> None:
    d = await daemon_factory(settings_with(responses_keep=0))
    await start_fake(d)
    client = client_of(d)
    made = await client.responses.create(model="fake", input="hi", max_output_tokens=2)
    body = await not_found(client.responses.retrieve(made.id))  # the engine keeps none either
    assert "`traylm config set requests.responses_keep 10000`" in body["message"], body
    assert "in profile 'fake'" in body["message"], body


async def test_cancel_of_a_kept_response_is_answered_in_openais_words(
    daemon: RunningDaemon,
) -> None:
    """A kept response has ended and was not made in the background: OpenAI's 400, from
    traylm (the engine, which keeps none, answered 404 with advice for a missing store)."""
    await start_fake(daemon)
    client = client_of(daemon)
    made = await client.responses.create(model="fake", input="hi", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError) as err:
        await client.responses.cancel(made.id)
    message = str(err.value.message)
    assert "Responses can only be cancelled if they were created with background=true" in message
    assert "'completed'" in message and "traylm" not in message
    assert err.value.body["param"] == "response_id"  # type: ignore[index]
    assert (await client.responses.retrieve(made.id)).status == "completed"  # unchanged


async def test_a_reply_carries_its_previous_response_id(daemon: RunningDaemon) -> None:
    """The engine got a self-contained request (no previous_response_id) and says null; the
    client gets back the id it chained to, streamed or not, and so does a retrieve."""
    await start_fake(daemon)
    client = client_of(daemon)
    first = await client.responses.create(model="fake", input="first", max_output_tokens=1)
    assert first.previous_response_id is None
    second = await client.responses.create(
        model="fake", input="second", previous_response_id=first.id, max_output_tokens=1
    )
    assert second.previous_response_id == first.id
    stream = await client.responses.create(
        model="fake", input="third", previous_response_id=second.id, stream=True
    )
    events = [e async for e in stream]
    assert events[0].type == "response.created"
    assert events[0].response.previous_response_id == second.id  # type: ignore[union-attr]
    third = events[-1].response  # type: ignore[union-attr]
    assert third.previous_response_id == second.id
    assert (await client.responses.retrieve(third.id)).previous_response_id == second.id


async def test_kept_responses_have_traylms_own_ids(daemon: RunningDaemon) -> None:
    """An engine's ids repeat (the FAKE counts from 1 again once restarted): a kept response
    has an id of traylm's, so one conversation never overwrites another."""
    await start_fake(daemon)
    client = client_of(daemon)
    before = await client.responses.create(model="fake", input="one", max_output_tokens=1)
    await daemon.client.stop("fake")
    await start_fake(daemon)  # a new engine process: its count starts over
    after = await client.responses.create(model="fake", input="two", max_output_tokens=2)
    assert before.id != after.id and not before.id.startswith("resp_fake")
    assert (await client.responses.retrieve(before.id)).output_text == "w0"
    assert (await client.responses.retrieve(after.id)).output_text == "w0 w1"
    events = [e async for e in await client.responses.create(model="fake", input="x", stream=True)]
    ids = {e.response.id for e in events if hasattr(e, "response")}  # created, completed
    assert len(ids) == 1 and not ids.pop().startswith("resp_fake")


async def test_retrieve_with_stream_replays_the_kept_responses_events(
    daemon: RunningDaemon,
) -> None:
    """The openai SDK's ``responses.retrieve(id, stream=True)`` yields the events of the kept
    response (it got JSON and yielded none), resumable with ``starting_after``."""
    await start_fake(daemon)
    client = client_of(daemon)
    made = await client.responses.create(model="fake", input="hi", max_output_tokens=3)
    events = [e async for e in await client.responses.retrieve(made.id, stream=True)]
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == made.output_text == "w0 w1 w2"
    assert same(events[-1].response, made)  # type: ignore[union-attr]
    later = await client.responses.retrieve(made.id, stream=True, starting_after=2)
    assert [e.sequence_number async for e in later] == list(range(3, len(events)))


async def test_a_response_made_with_store_false_is_a_404_in_traylms_words(
    daemon: RunningDaemon,
) -> None:
    """traylm keeps responses, but not one made with store: false: its 404 says so (and never
    that traylm keeps none)."""
    await start_fake(daemon)
    client = client_of(daemon)
    made = await client.responses.create(model="fake", input="hi", store=False)
    body = await not_found(client.responses.retrieve(made.id))
    assert "none made with store: false" in body["message"], body
    assert "nor does traylm" not in body["message"]
