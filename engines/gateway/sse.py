"""Server-sent events as the relay handles them: where whole events end, the error event that
ends a broken stream (in the client's API shape), the message of an error body, and the token
counts of a reply."""

from __future__ import annotations

import json
import re
import time
import uuid

from engines.gateway.metrics import GatewayMetrics
from engines.gateway.shapes import ANTHROPIC_TYPE_NAMES, is_anthropic

RESPONSES_PATH = "/v1/responses"

EVENT_ENDS = (b"\n\n", b"\r\n\r\n")
# OpenAI's chat/completions usage, and the Responses and Anthropic Messages APIs' names
_PROMPT_RE = re.compile(rb'"(?:prompt|input)_tokens"\s*:\s*(\d+)')
_COMPLETION_RE = re.compile(rb'"(?:completion|output)_tokens"\s*:\s*(\d+)')
LAST_EVENTS = (
    b"data: [DONE]",  # OpenAI's chat and completions
    b"event: message_stop",  # Anthropic's Messages
    b"event: response.completed",  # the Responses API's three ends
    b"event: response.incomplete",
    b"event: response.failed",
)


def whole_events(data: bytes) -> int:
    """The length of the part of ``data`` made of whole server-sent events (each ends with a
    blank line). Only whole events are relayed, so an engine that dies mid-write never leaves
    the client half an event glued to the error event that follows."""
    ends = [i + len(sep) for sep in EVENT_ENDS if (i := data.rfind(sep)) >= 0]
    return max(ends, default=0)


def ends_reply(events: bytes) -> bool:
    """Whether the last of these whole events is one that ends a reply (LAST_EVENTS): a
    client may close as it reads it, having got the whole reply."""
    n = len(events)
    starts = [k + len(sep) for sep in EVENT_ENDS if (k := events.rfind(sep, 0, n - len(sep))) >= 0]
    return events.startswith(LAST_EVENTS, max(starts, default=0))


def sse_error(
    message: str, *, type_: str = "engine_error", code: int = 502, path: str = ""
) -> bytes:
    """The event that ends a broken stream to ``path``, as the client's SDK reads it, with the
    status ``code`` the same refusal has unstreamed:

    - Anthropic's ``error`` event (its SDK ignores events it does not know), typed ``type_``
      when that is one of Anthropic's types (a failed load's, already shaped), else
      ``api_error``;
    - the Responses API's ``response.failed``, whose ``response.error`` Codex shows (it said
      only "stream closed before response.completed" of the chat shape);
    - elsewhere OpenAI's error data, then [DONE].
    """
    if is_anthropic(path):
        kind = type_ if type_ in ANTHROPIC_TYPE_NAMES else "api_error"
        data = {"type": "error", "error": {"type": kind, "message": message}}
        return b"event: error\ndata: " + json.dumps(data).encode() + b"\n\n"
    if path == RESPONSES_PATH:
        return _response_failed(message, type_, code)
    payload = {"error": {"message": message, "type": type_, "param": None, "code": code}}
    return b"data: " + json.dumps(payload).encode() + b"\n\ndata: [DONE]\n\n"


def _response_failed(message: str, type_: str, status: int) -> bytes:
    """``response.failed`` (openai's ResponseFailedEvent): a response whose status is failed
    and whose ``error`` (ResponseError) says why; ``code`` is one of OpenAI's codes, the
    original type and status ride along."""
    code = "rate_limit_exceeded" if status == 429 else "server_error"
    error = {"code": code, "message": message, "type": type_, "param": None, "status": status}
    response = {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": int(time.time()),
        "model": "",
        "status": "failed",
        "error": error,
        "output": [],
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
        "incomplete_details": None,
    }
    data = {"type": "response.failed", "sequence_number": 0, "response": response}
    return b"event: response.failed\ndata: " + json.dumps(data).encode() + b"\n\n"


def error_text(data: bytes, status: int) -> str:
    """The message of an error body (OpenAI's or Anthropic's shape), or the body itself."""
    try:
        error = json.loads(data).get("error")
    except (ValueError, AttributeError):
        error = None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    return f"HTTP {status}: {data[:300].decode(errors='replace')}"


def count_usage(
    data: bytes, model: str, metrics: GatewayMetrics, *, chunks: int
) -> tuple[int | None, int | None]:
    """The prompt and completion tokens of a reply (its last usage, else the streamed chunks
    less the role's), added to the gateway's token counters."""
    prompt = _PROMPT_RE.findall(data)
    completion = _COMPLETION_RE.findall(data)
    prompt_tokens = int(prompt[-1]) if prompt else None
    completion_tokens = int(completion[-1]) if completion else None
    if prompt_tokens is not None:
        metrics.tokens_in.inc(float(prompt_tokens), model=model)
    if completion_tokens is not None:
        metrics.tokens_out.inc(float(completion_tokens), model=model)
    elif chunks > 1:
        completion_tokens = chunks - 1  # first chunk carries the role
        metrics.tokens_out.inc(float(completion_tokens), model=model)
    return prompt_tokens, completion_tokens
