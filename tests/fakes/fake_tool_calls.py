"""The FAKE engine's tool calls (``--tool-call NAME:JSON``, repeatable): to a request that offers
tools, the first reply of a conversation is a streamed call of each NAME with JSON arguments
(split over two chunks, as vLLM's tool parsers stream them), finish_reason "tool_calls"; once
the conversation holds a ``tool`` message, the reply is plain text that starts by saying what
the tools answered ("tool said: 42 | the user denied it "), so a test sees what reached the model.
"""

from __future__ import annotations

import json
from typing import Any


def calls_asked(body: dict[str, Any], specs: list[str] | None) -> list[tuple[str, str]]:
    """(name, arguments JSON) to call now: tools offered, and no tool answered yet."""
    messages = body.get("messages")
    if not specs or not body.get("tools") or not isinstance(messages, list):
        return []
    if any(isinstance(m, dict) and m.get("role") == "tool" for m in messages):
        return []
    out = []
    for spec in specs:
        name, _, arguments = spec.partition(":")
        out.append((name, arguments or "{}"))
    return out


def tool_answers(body: dict[str, Any]) -> str:
    """What the tool messages after the last assistant turn said, for the reply's first token."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return ""
    said = [
        str(m.get("content", ""))
        for m in messages
        if isinstance(m, dict) and m.get("role") == "tool"
    ]
    return f"tool said: {' | '.join(said)} " if said else ""


def call_chunks(model: str, calls: list[tuple[str, str]]) -> list[bytes]:
    """The SSE events of a streamed tool call reply (before usage and [DONE])."""

    def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
        chunk = {
            "id": "fake-1",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"

    if not calls:
        return []
    out = [event({"role": "assistant", "content": None})]
    for index, (name, arguments) in enumerate(calls):
        half = len(arguments) // 2
        head = {"index": index, "id": f"call_{index}", "type": "function"}
        out.append(
            event(
                {
                    "tool_calls": [
                        {**head, "function": {"name": name, "arguments": arguments[:half]}}
                    ]
                }
            )
        )
        out.append(
            event({"tool_calls": [{"index": index, "function": {"arguments": arguments[half:]}}]})
        )
    out.append(event({}, "tool_calls"))
    return out
