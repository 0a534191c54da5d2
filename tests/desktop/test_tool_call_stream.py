"""The chat's streaming client gathers a reply's streamed tool calls (the FAKE engine's events,
as vLLM's tool parsers send them: the name first, the arguments in pieces) and sends tools and
tool rounds in OpenAI's shape."""

from __future__ import annotations

import json

from desktop.daemon.gateway import ChatRequest, ToolCall, _Collector
from tests.fakes.fake_tool_calls import call_chunks


def test_tool_call_deltas_are_gathered() -> None:
    request = ChatRequest(1, "fake", (("user", "add", ()),), 0.7, 1.0, 16)
    collector = _Collector(request, lambda _m: None)
    calls = [("add", '{"a": 2, "b": 40}'), ("slow", '{"seconds": 9}')]
    for event in call_chunks("fake", calls):
        for line in event.splitlines():
            collector.feed(line)
    collector.feed(b"data: [DONE]")
    ended = collector.ended("")
    assert ended.finish_reason == "tool_calls" and ended.content == ""
    assert ended.tool_calls == (
        ToolCall("call_0", "add", '{"a": 2, "b": 40}'),
        ToolCall("call_1", "slow", '{"seconds": 9}'),
    )


def test_tools_and_tool_rounds_are_sent() -> None:
    tools = json.dumps([{"type": "function", "function": {"name": "add", "parameters": {}}}])
    call = ToolCall("call_0", "add", "{}")
    turns = json.dumps(
        [
            {"role": "assistant", "content": None, "tool_calls": [call.openai()]},
            {"role": "tool", "tool_call_id": "call_0", "content": "42"},
        ]
    )
    request = ChatRequest(
        1, "fake", (("user", "add", ()),), 0.7, 1.0, 16, tools_json=tools, tool_turns_json=turns
    )
    payload = request.payload()
    assert payload["tools"] == json.loads(tools) and payload["tool_choice"] == "auto"
    messages = payload["messages"]
    assert isinstance(messages, list)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["tool_calls"][0]["function"] == {"name": "add", "arguments": "{}"}
    plain = ChatRequest(1, "fake", (("user", "hi", ()),), 0.7, 1.0, 16).payload()
    assert "tools" not in plain and "tool_choice" not in plain
