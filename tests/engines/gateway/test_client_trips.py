"""What real clients trip on, through the real daemon and the real SDKs (FAKE vLLM engine):
a refused key or Host must stop a client at once (``x-should-retry: false``: Claude Code
otherwise retried a wrong key for minutes), and errors on Anthropic's routes carry Anthropic's
error types, also when the engine answered with vLLM's own ("BadRequestError")."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import aiohttp
import anthropic
import openai
import pytest

from engines.core.procs import free_loopback_port
from engines.gateway.security import hash_key
from tests.conftest import RunningDaemon, fast_settings
from tests.engines.gateway.test_daemon_gateway import sdk, start_fake
from tests.traylm_cli import traylm

HI = [{"role": "user", "content": "hi"}]
ANTHROPIC_TYPES = {
    "invalid_request_error",
    "authentication_error",
    "permission_error",
    "not_found_error",
    "request_too_large",
    "rate_limit_error",
    "api_error",
    "overloaded_error",
    "billing_error",
    "timeout_error",
}


@pytest.fixture
async def keyed(daemon_factory, fake_env) -> AsyncIterator[RunningDaemon]:  # type: ignore[no-untyped-def]
    d: RunningDaemon = await daemon_factory(
        fast_settings(free_loopback_port(), api_key_sha256=(hash_key("sekret"),))
    )
    await start_fake(d)
    yield d


def seen(d: RunningDaemon, route: str, status: str) -> float:
    """Requests the daemon's gateway answered on ``route`` with ``status``."""
    values = d.daemon.ctx.metrics.requests.values
    return sum(
        n for key, n in values.items() if ("route", route) in key and ("status", status) in key
    )


async def test_a_wrong_key_stops_the_anthropic_sdk_at_once(keyed: RunningDaemon) -> None:
    """The SDK with its default retries: one request, AuthenticationError, told not to retry."""
    client = anthropic.AsyncAnthropic(base_url=keyed.url, api_key="wrong")  # default retries
    try:
        with pytest.raises(anthropic.AuthenticationError) as err:
            await client.messages.create(model="fake", max_tokens=1, messages=HI)
    finally:
        await client.close()
    assert err.value.response.headers.get("x-should-retry") == "false"
    assert err.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    assert seen(keyed, "/v1/messages", "401") == 1


async def test_a_wrong_key_stops_the_openai_sdk_at_once(keyed: RunningDaemon) -> None:
    client = openai.AsyncOpenAI(base_url=keyed.url + "/v1", api_key="wrong")  # default retries
    try:
        with pytest.raises(openai.AuthenticationError) as err:
            await client.chat.completions.create(model="fake", messages=HI, max_tokens=1)
    finally:
        await client.close()
    assert err.value.response.headers.get("x-should-retry") == "false"
    assert seen(keyed, "/v1/chat/completions", "401") == 1


async def test_every_401_and_403_says_do_not_retry(keyed: RunningDaemon) -> None:
    url = keyed.url
    refusals = [
        ("/v1/models", {"Authorization": "Bearer wrong"}, 401),  # a wrong key
        ("/v1/models", {}, 401),  # no key
        ("/v1/messages", {"x-api-key": "wrong"}, 401),
        ("/api/status", {}, 401),  # the control API without its token
        ("/v1/models", {"Authorization": "Bearer sekret", "Host": "evil.example"}, 403),
        ("/v1/models", {"Authorization": "Bearer sekret", "Origin": "https://evil.example"}, 403),
    ]
    async with aiohttp.ClientSession() as http:
        for path, headers, status in refusals:
            async with http.get(url + path, headers=headers) as r:
                assert r.status == status, (path, headers)
                assert r.headers.get("x-should-retry") == "false", (path, headers)
        # what may pass later (a model that is loading) is not marked
        async with http.get(url + "/v1/models", headers={"Authorization": "Bearer sekret"}) as r:
            assert r.status == 200 and "x-should-retry" not in r.headers


async def test_the_engines_errors_on_messages_carry_anthropics_types(
    daemon: RunningDaemon,
) -> None:
    """vLLM answers /v1/messages errors either in OpenAI's shape (its request validation) or
    in Anthropic's shape with its own exception name as the type; the client gets Anthropic's."""
    await start_fake(daemon)
    client = anthropic.AsyncAnthropic(base_url=daemon.url, api_key="unused", max_retries=0)
    try:
        with pytest.raises(anthropic.BadRequestError) as openai_shaped:
            await client.messages.create(
                model="fake", max_tokens=1, messages=HI, extra_body={"temperature": 1.5}
            )
        with pytest.raises(anthropic.BadRequestError) as vllm_typed:
            await client.messages.create(model="fake", max_tokens=10_000, messages=HI)
        with pytest.raises(anthropic.NotFoundError) as unknown:
            await client.messages.create(model="nope", max_tokens=1, messages=HI)
    finally:
        await client.close()
    for err in (openai_shaped.value, vllm_typed.value):
        assert isinstance(err.body, dict) and err.body["type"] == "error", err.body
        assert err.body["error"]["type"] == "invalid_request_error", err.body
    assert "temperature" in str(openai_shaped.value)
    assert "max_tokens is more than" in str(vllm_typed.value)
    assert unknown.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]


async def test_messages_errors_are_anthropic_typed_for_every_status(
    daemon: RunningDaemon,
) -> None:
    """Direct checks: each error the gateway or the engine gives on /v1/messages has a type
    from Anthropic's list."""
    await start_fake(daemon)
    bodies = [
        {"model": "fake", "max_tokens": 1, "messages": HI, "temperature": 3},
        {"model": "fake", "max_tokens": 500_000, "messages": HI},
        {"model": "fake", "max_tokens": 1, "messages": HI, "n": 2},
        {"model": "nope", "max_tokens": 1, "messages": HI},
        {"model": "fake", "messages": HI},
    ]
    async with aiohttp.ClientSession() as http:
        for body in bodies:
            async with http.post(daemon.url + "/v1/messages", json=body) as r:
                got = await r.json()
                assert r.status >= 400 and got["type"] == "error", (body, got)
                assert got["error"]["type"] in ANTHROPIC_TYPES, (body, got)


async def test_a_failed_load_ends_a_messages_stream_with_the_same_type_as_unstreamed(
    daemon: RunningDaemon,
) -> None:
    """A stream that began while the model loaded (SSE comments) and whose load failed ends
    with Anthropic's error event typed as the same failure is when not streamed."""
    broken = "--print 'ValueError: No available memory for the cache blocks.' --exit-after-print 1"
    await start_fake(daemon, "broken", args=broken, wait=False)
    client = anthropic.AsyncAnthropic(base_url=daemon.url, api_key="unused", max_retries=0)
    try:
        with pytest.raises(anthropic.APIStatusError) as plain:
            await client.messages.create(model="broken", max_tokens=3, messages=HI)
        with pytest.raises(anthropic.APIStatusError) as streamed:
            async with client.messages.stream(model="broken", max_tokens=3, messages=HI) as stream:
                async for _ in stream.text_stream:
                    pass
    finally:
        await client.close()
    kind = plain.value.body["error"]["type"]  # type: ignore[index]
    assert plain.value.status_code == 503 and kind == "api_error"  # not retried as overload
    assert streamed.value.body["error"]["type"] == kind  # type: ignore[index]


NO_GPU = "needs an NVIDIA GPU (this computer has none)"


async def test_a_model_that_cannot_start_here_is_not_listed_and_refused_once(
    daemon: RunningDaemon,
) -> None:
    """On a computer without a GPU the GPU presets are not in /v1/models, and a request for
    one is a permanent refusal: Anthropic's invalid_request_error (Claude Code retried the
    503 overloaded_error ten times) and OpenAI's 400; each SDK, with its default retries,
    makes one request."""
    await start_fake(daemon)
    lister = sdk(daemon)
    listed = {m.id for m in (await lister.models.list()).data}
    await lister.close()
    assert "fake" in listed and "llama-3.1-8b" not in listed
    blocked = {m.name: m.blocked for m in await daemon.client.servable_models()}
    assert blocked["llama-3.1-8b"] == NO_GPU  # still known, with the reason (ps --all, the app)
    claude = anthropic.AsyncAnthropic(base_url=daemon.url, api_key="unused")  # default retries
    try:
        with pytest.raises(anthropic.BadRequestError) as refused:
            await claude.messages.create(model="llama-3.1-8b", max_tokens=1, messages=HI)
    finally:
        await claude.close()
    assert refused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert NO_GPU in str(refused.value)
    assert seen(daemon, "/v1/messages", "400") == 1
    client = openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key="unused")
    try:
        with pytest.raises(openai.BadRequestError) as plain:
            await client.chat.completions.create(model="llama-3.1-8b", messages=HI)
        with pytest.raises(openai.NotFoundError) as retrieved:
            await client.models.retrieve("llama-3.1-8b")
    finally:
        await client.close()
    assert plain.value.type == "invalid_request_error" and plain.value.code == "gpu_not_found"
    assert seen(daemon, "/v1/chat/completions", "400") == 1
    assert f"cannot start on this computer: {NO_GPU}" in str(retrieved.value)


async def test_a_failed_load_ends_a_responses_stream_with_response_failed(
    daemon: RunningDaemon,
) -> None:
    """Codex reads a Responses stream's end from ``response.failed``: the real openai SDK
    yields that event with ``response.error`` saying why (the chat shape's error data and
    [DONE] left Codex with "stream closed before response.completed"); the stream carries
    the status the same refusal has unstreamed."""
    broken = "--print 'ValueError: No available memory for the cache blocks.' --exit-after-print 1"
    await start_fake(daemon, "broken", args=broken, wait=False)
    client = sdk(daemon)
    try:
        with pytest.raises(openai.APIStatusError) as plain:
            await client.responses.create(model="broken", input="hi")
        stream = await client.responses.create(model="broken", input="hi", stream=True)
        events = [event async for event in stream]
    finally:
        await client.close()
    assert [e.type for e in events] == ["response.failed"]
    failed = events[0]
    assert isinstance(failed, openai.types.responses.ResponseFailedEvent)
    assert failed.response.status == "failed" and failed.response.error is not None
    assert failed.response.error.message == plain.value.body["message"]  # type: ignore[index]
    assert "No memory left for the KV cache" in failed.response.error.message
    assert failed.response.error.code == "server_error"
    assert failed.response.error.status == plain.value.status_code  # type: ignore[attr-defined]


async def test_refusals_on_get_and_head_are_logged_once_counted_and_recorded(
    keyed: RunningDaemon, caplog: pytest.LogCaptureFixture
) -> None:
    """Open WebUI with a wrong key shows an empty model list: the refusal is in the log (once
    per client and kind, not at every retry), in /metrics and in `traylm requests` beside the
    POST refusals."""
    d = keyed
    wrong = {"Authorization": "Bearer wrong", "User-Agent": "open-webui-ish"}
    rids = []
    caplog.set_level(logging.WARNING, logger="engines.gateway.refusals")
    async with aiohttp.ClientSession() as http:
        for _ in range(3):
            async with http.get(d.url + "/v1/models", headers=wrong) as r:
                assert r.status == 401
                rids.append(r.headers["x-request-id"])
        async with http.head(d.url + "/", headers={"User-Agent": "probe"}) as r:
            assert r.status == 401
            rids.append(r.headers["x-request-id"])
        ok = {"Authorization": "Bearer sekret"}
        async with http.put(d.url + "/v1/models", headers=ok) as r:
            assert r.status == 405
            rids.append(r.headers["x-request-id"])
        async with http.get(d.url + "/metrics", headers=ok) as r:
            metrics = await r.text()
    told = [rec.getMessage() for rec in caplog.records if "refused" in rec.getMessage()]
    assert len(told) == 3, told  # GET 401 once for the three, HEAD 401, PUT 405
    assert "refused GET /v1/models" in told[0] and "missing or wrong API key" in told[0]
    assert "open-webui-ish" in told[0] and "refused HEAD /" in told[1]
    assert 'route="/v1/models",status="401"} 3' in metrics
    await d.daemon.requests.flush()
    rows = {r["id"]: r for r in await d.client.requests_list(limit=20)}
    assert [rows[rid]["status"] for rid in rids] == [401, 401, 401, 401, 405]
    assert [rows[rid]["method"] for rid in rids] == ["GET"] * 3 + ["HEAD", "PUT"]
    code, out = await traylm("requests", "ls")
    assert code == 0 and f"{rids[0]}" in out and "GET /v1/models" in out, out


async def test_the_engines_errors_carry_openais_types(daemon: RunningDaemon) -> None:
    """vLLM types its errors with its exception names ("BadRequestError", "NotFoundError");
    OpenAI's clients get OpenAI's types on chat, completions and Responses."""
    await start_fake(daemon)
    client = sdk(daemon)
    try:
        with pytest.raises(openai.BadRequestError) as chat:
            await client.chat.completions.create(model="fake", messages=HI, max_tokens=2_000_000)
        with pytest.raises(openai.BadRequestError) as completion:
            await client.completions.create(model="fake", prompt="x", max_tokens=2_000_000)
    finally:
        await client.close()
    for err in (chat.value, completion.value):
        assert err.type == "invalid_request_error", err.body
        assert "max_tokens" in err.message


async def test_a_refusal_has_one_status_streamed_or_not(daemon: RunningDaemon) -> None:
    """A failed load is a 503 unstreamed; the stream that began while it loaded ends with an
    error event carrying 503 too (it said 502)."""
    broken = "--print 'ValueError: No available memory for the cache blocks.' --exit-after-print 1"
    await start_fake(daemon, "broken", args=broken, wait=False)
    client = sdk(daemon)
    try:
        with pytest.raises(openai.APIStatusError) as plain:
            await client.chat.completions.create(model="broken", messages=HI)
        with pytest.raises(openai.APIError) as streamed:
            stream = await client.chat.completions.create(model="broken", messages=HI, stream=True)
            async for _ in stream:
                pass
    finally:
        await client.close()
    assert plain.value.status_code == 503
    assert streamed.value.body["code"] == 503  # type: ignore[index]
    assert streamed.value.message == plain.value.body["message"]  # type: ignore[index]
