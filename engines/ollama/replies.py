"""The engines' OpenAI replies as Ollama's: a whole reply as one JSON object, a stream of
server-sent events as newline-delimited JSON (``application/x-ndjson``), one line per token and a
last line with ``done: true``, ``done_reason`` and the counts (docs/api.md in ollama/ollama).

Ollama's durations are nanoseconds; traylm knows the whole request's and, from the first
token, the prompt's share.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

DONE_REASONS = {"stop": "stop", "length": "length", "tool_calls": "stop", "content_filter": "stop"}


def now_text() -> str:
    """A time as Ollama writes it (RFC 3339, UTC)."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def line(obj: Mapping[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def _arguments(text: object) -> object:
    """A tool call's arguments: OpenAI's JSON text as Ollama's object."""
    if not isinstance(text, str):
        return text if isinstance(text, dict) else {}
    try:
        value = json.loads(text) if text.strip() else {}
    except ValueError:
        return {"arguments": text}
    return value if isinstance(value, dict) else {"value": value}


def tool_calls(calls: object) -> list[dict[str, Any]]:
    out = []
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            out.append(
                {
                    "id": call.get("id", ""),
                    "function": {
                        "name": function.get("name", ""),
                        "arguments": _arguments(function.get("arguments")),
                    },
                }
            )
    return out


class Timing:
    """The nanosecond counts of one request's last line."""

    def __init__(self) -> None:
        self.started = time.perf_counter_ns()
        self.first_ns: int | None = None

    def token(self) -> None:
        if self.first_ns is None:
            self.first_ns = time.perf_counter_ns()

    def stats(self, usage: object) -> dict[str, Any]:
        end = time.perf_counter_ns()
        first = self.first_ns or end
        u = usage if isinstance(usage, dict) else {}
        return {
            "total_duration": end - self.started,
            "load_duration": 0,
            "prompt_eval_count": int(u.get("prompt_tokens") or 0),
            "prompt_eval_duration": first - self.started,
            "eval_count": int(u.get("completion_tokens") or 0),
            "eval_duration": end - first,
        }


def whole(kind: str, model: str, reply: Mapping[str, Any], timing: Timing) -> dict[str, Any]:
    """A whole OpenAI reply as Ollama's (``kind``: chat | generate | raw)."""
    choices = reply.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else {}
    finish = choice.get("finish_reason") if isinstance(choice, dict) else None
    out: dict[str, Any] = {"model": model, "created_at": now_text()}
    if kind == "raw":
        out["response"] = choice.get("text") or ""
    else:
        message = choice.get("message") if isinstance(choice, dict) else None
        message = message if isinstance(message, dict) else {}
        text = message.get("content") or ""
        thinking = message.get("reasoning_content") or message.get("reasoning")
        if kind == "chat":
            out["message"] = _message(text, thinking, tool_calls(message.get("tool_calls")))
        else:
            out["response"] = text
            if thinking:
                out["thinking"] = thinking
    timing.token()
    out.update(done=True, done_reason=DONE_REASONS.get(str(finish), "stop"))
    out.update(timing.stats(reply.get("usage")))
    return out


def _message(text: str, thinking: object, calls: list[dict[str, Any]]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if thinking:
        message["thinking"] = thinking
    if calls:
        message["tool_calls"] = calls
    return message


class StreamLines:
    """Server-sent events of an OpenAI stream in, Ollama's lines out: ``feed`` whole events,
    write what it returns; ``end`` gives the last line. Tool calls come in pieces (an id and
    name, then arguments in fragments): they are gathered and sent whole with the last line's
    predecessor, as Ollama sends them."""

    def __init__(self, kind: str, model: str) -> None:
        self.kind, self.model = kind, model
        self.timing = Timing()
        self.usage: object = None
        self.finish: str | None = None
        self.error: str | None = None
        self._calls: dict[int, dict[str, Any]] = {}
        self._created = now_text()
        head = {"model": model, "created_at": self._created}
        start = json.dumps(head, separators=(",", ":"))[:-1].encode()
        if kind == "chat":
            self._text_head = start + b',"message":{"role":"assistant","content":'
            self._text_tail = b'},"done":false}\n'
        else:
            self._text_head = start + b',"response":'
            self._text_tail = b',"done":false}\n'

    def feed(self, events: bytes) -> bytes:
        out = bytearray()
        for event in events.split(b"\n\n"):
            data = event.strip()
            if not data.startswith(b"data:"):
                continue  # a comment (": loading ...") or an empty tail
            data = data[5:].strip()
            if data == b"[DONE]":
                continue
            try:
                chunk = json.loads(data)
            except ValueError:
                continue
            if isinstance(chunk, dict):
                out += self._chunk(chunk)
        return bytes(out)

    def _chunk(self, chunk: dict[str, Any]) -> bytes:
        if isinstance(chunk.get("error"), dict):
            self.error = str(chunk["error"].get("message", "the engine failed"))
            return b""
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return b""
        choice = choices[0]
        if choice.get("finish_reason"):
            self.finish = str(choice["finish_reason"])
        if self.kind == "raw":
            text, thinking = choice.get("text") or "", None
        else:
            given = choice.get("delta")
            delta: dict[str, Any] = given if isinstance(given, dict) else {}
            text = delta.get("content") or ""
            thinking = delta.get("reasoning_content") or delta.get("reasoning")
            self._gather(delta.get("tool_calls"))
        if not text and not thinking:
            return b""
        self.timing.token()
        if not thinking:  # one token of text: the line around it is the same each time
            return self._text_head + json.dumps(text).encode() + self._text_tail
        return line(self._part(text, thinking, []))

    def _gather(self, pieces: object) -> None:
        for piece in pieces if isinstance(pieces, list) else []:
            if not isinstance(piece, dict):
                continue
            call = self._calls.setdefault(
                int(piece.get("index", len(self._calls))),
                {"id": "", "function": {"name": "", "arguments": ""}},
            )
            if piece.get("id"):
                call["id"] = piece["id"]
            given = piece.get("function")
            function: dict[str, Any] = given if isinstance(given, dict) else {}
            call["function"]["name"] += function.get("name") or ""
            call["function"]["arguments"] += function.get("arguments") or ""

    def _part(self, text: str, thinking: object, calls: list[dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model, "created_at": self._created}
        if self.kind == "chat":
            out["message"] = _message(text, thinking, calls)
        else:
            out["response"] = text
            if thinking:
                out["thinking"] = thinking
        out["done"] = False
        return out

    def end(self) -> bytes:
        """The last lines: gathered tool calls, then ``done`` (or the error line)."""
        if self.error is not None:
            return line({"error": self.error})
        out = b""
        if self._calls:
            calls = tool_calls([self._calls[k] for k in sorted(self._calls)])
            out = line(self._part("", None, calls))
        last = self._part("", None, [])
        last.update(done=True, done_reason=DONE_REASONS.get(str(self.finish), "stop"))
        last.update(self.timing.stats(self.usage))
        return out + line(last)
