"""A recorded exchange made into its row: the reply assembled from a stream's events (text,
reasoning, tool calls) or read from a whole reply, the finish reason, whether the reply was cut
by ``max_tokens`` or by the context, the error text. Pure functions, run in the recorder's
writer thread (never on the event loop).

Streams of every API the gateway serves are read: OpenAI chat and completions
(``choices[].delta`` / ``choices[].text``), Responses (``response.*.delta`` events and the
final ``response``), Anthropic Messages (``content_block_delta``, ``message_delta``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from engines.gateway.balance import affinity_key
from engines.gateway.exchange import CAPTURE_FULL, Exchange

CUT_MARKER = "…[cut by traylm: {size} bytes in all, {kept} kept]"
"""Appended to a body or reply the recorder cut (``requests.body_max_bytes``)."""


@dataclass
class Reply:
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str = ""
    error: str = ""
    usage: dict[str, Any] = field(default_factory=dict)

    def plain(self, limit: int) -> dict[str, Any]:
        text, cut = _bounded("".join(self.text), limit)
        reasoning, cut_r = _bounded("".join(self.reasoning), limit)
        calls = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        out: dict[str, Any] = {"text": text}
        if reasoning:
            out["reasoning"] = reasoning
        if calls:
            out["tool_calls"] = calls
        if cut or cut_r:
            out["cut"] = True
        return out


def _bounded(text: str, limit: int) -> tuple[str, bool]:
    raw = text.encode()
    if len(raw) <= limit:
        return text, False
    kept = raw[:limit].decode("utf-8", "ignore")
    return kept + CUT_MARKER.format(size=len(raw), kept=limit), True


def row_of(ex: Exchange) -> dict[str, Any]:
    """The exchange as the store's row (see store.COLUMNS)."""
    payload = _json(ex.request_body) if ex.content_type.startswith("application/json") else None
    reply = Reply()
    if ex.streamed:
        for event in _stream_events(ex.reply + ex.reply_tail):
            _event(reply, event)
    else:
        _whole(reply, _json(ex.reply), ex.reply)
    limit = ex.body_limit
    full = ex.capture == CAPTURE_FULL
    request_body = ex.request_body
    request_cut = ex.request_size > len(request_body) and full
    prompt, completion = ex.prompt_tokens, ex.completion_tokens
    prompt = prompt if prompt is not None else _int(reply.usage, "prompt_tokens", "input_tokens")
    if completion is None:
        completion = _int(reply.usage, "completion_tokens", "output_tokens")
    assembled = reply.plain(limit) if full and (ex.streamed or ex.status < 400) else {}
    if full and ex.reply_cut:
        assembled["cut"] = True
    return {
        "rid": ex.id,
        "arrived_s": ex.arrived_s,
        "client": ex.client,
        "peer": ex.peer,
        "key": ex.key,
        "method": ex.method,
        "path": ex.path,
        "model": ex.model,
        "engine_id": ex.engine_id,
        "gpus": ex.gpus,
        "remote": int(ex.remote),
        "stream": int(ex.stream),
        "status": ex.status,
        "error": reply.error[:4096],
        "ttft_s": ex.ttft_s,
        "duration_s": ex.duration_s,
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "cached_tokens": _cached(reply.usage),
        "conversation": (affinity_key(payload) or "") if isinstance(payload, dict) else "",
        "finish_reason": reply.finish_reason,
        "cut_by": _cut_by(reply.finish_reason, payload, completion),
        "capture": ex.capture,
        "content_type": ex.content_type[:200],
        "request_body": request_body if full else b"",
        "request_size": ex.request_size,
        "request_cut": int(request_cut),
        "reply_json": json.dumps(assembled) if assembled else "",
        "reply_body": ex.reply if full and not ex.streamed else b"",
        "reply_size": ex.reply_size,
        "reply_cut": int(ex.reply_cut and full),
    }


def _stream_events(raw: bytes) -> list[Any]:
    """The JSON data of a stream's events, parsed as one array (one parser call for the whole
    stream, not one per token: the writer thread holds the GIL the gateway's loop needs);
    each on its own when one does not parse (a cut stream's first and last)."""
    datas = [line[5:] for line in raw.split(b"\n") if line.startswith((b"data: {", b"data:{"))]
    if not datas:
        return []
    whole = _json(b"[" + b",".join(datas) + b"]")
    if isinstance(whole, list):
        return whole
    return [_json(data.strip()) for data in datas]


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


def _int(data: dict[str, Any], *names: str) -> int | None:
    for name in names:
        if isinstance(data.get(name), int):
            return int(data[name])
    return None


def _cached(usage: dict[str, Any]) -> int | None:
    """The prompt tokens the engine's prefix cache served: OpenAI's
    ``prompt_tokens_details.cached_tokens`` (vLLM's with --enable-prompt-tokens-details), the
    Responses API's ``input_tokens_details``, Anthropic's ``cache_read_input_tokens``."""
    for key in ("prompt_tokens_details", "input_tokens_details"):
        details = usage.get(key)
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            return int(details["cached_tokens"])
    return _int(usage, "cache_read_input_tokens")


def _cut_by(finish: str, payload: Any, completion: int | None) -> str:
    """ "max_tokens" when the reply stopped at the request's own limit, "context" when it
    stopped for length short of it (the model's context was full), else ""."""
    if finish not in ("length", "max_tokens", "max_output_tokens"):
        return ""
    asked = None
    if isinstance(payload, dict):
        for name in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
            if isinstance(payload.get(name), int):
                asked = payload[name]
                break
    if asked is None or completion is None or completion >= asked:
        return "max_tokens"
    return "context"


def _error_text(data: Any) -> str:
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict):
        return str(err.get("message", ""))
    if isinstance(err, str):
        return err
    if isinstance(data, dict) and isinstance(data.get("detail"), str):
        return str(data["detail"])
    return ""


def _whole(reply: Reply, data: Any, raw: bytes) -> None:
    """A whole reply (or error) body."""
    if not isinstance(data, dict):
        if raw and not raw.lstrip().startswith(b"{"):
            reply.error = raw[:4096].decode("utf-8", "replace")
        return
    reply.error = _error_text(data)
    if isinstance(data.get("usage"), dict):
        reply.usage = data["usage"]
    for choice in data.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        message = choice.get("message")
        if isinstance(message, dict):
            _message_parts(reply, message)
        elif isinstance(choice.get("text"), str):
            reply.text.append(choice["text"])
        if isinstance(choice.get("finish_reason"), str):
            reply.finish_reason = choice["finish_reason"]
        break  # the first choice
    if data.get("object") == "response" or data.get("type") == "message":
        _response_or_message(reply, data)


def _message_parts(reply: Reply, message: dict[str, Any]) -> None:
    if isinstance(message.get("content"), str):
        reply.text.append(message["content"])
    for name in ("reasoning_content", "reasoning"):
        if isinstance(message.get(name), str):
            reply.reasoning.append(message[name])
            break
    for i, call in enumerate(message.get("tool_calls") or ()):
        if isinstance(call, dict):
            reply.tool_calls[i] = call


def _response_or_message(reply: Reply, data: dict[str, Any]) -> None:
    """A Responses API ``response`` or an Anthropic ``message``."""
    if data.get("type") == "message":  # Anthropic
        for block in data.get("content") or ():
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text":
                reply.text.append(str(block.get("text", "")))
            elif block.get("type") == "thinking":
                reply.reasoning.append(str(block.get("thinking", "")))
            elif block.get("type") == "tool_use":
                reply.tool_calls[len(reply.tool_calls)] = block
        reply.finish_reason = str(data.get("stop_reason") or "")
        return
    for item in data.get("output") or ():
        if not isinstance(item, dict):
            continue
        if item.get("type") == "message":
            for part in item.get("content") or ():
                if isinstance(part, dict) and part.get("type") == "output_text":
                    reply.text.append(str(part.get("text", "")))
        elif item.get("type") == "reasoning":
            for part in item.get("content") or item.get("summary") or ():
                if isinstance(part, dict):
                    reply.reasoning.append(str(part.get("text", "")))
        elif item.get("type") == "function_call":
            reply.tool_calls[len(reply.tool_calls)] = item
    details = data.get("incomplete_details")
    if isinstance(details, dict) and details.get("reason"):
        reply.finish_reason = str(details["reason"])
    elif data.get("status"):
        reply.finish_reason = str(data["status"])


def _event(reply: Reply, event: Any) -> None:
    """One server-sent event of any API's stream."""
    if not isinstance(event, dict):
        return
    if "error" in event and event.get("type") in (None, "error"):
        reply.error = _error_text(event)
        return
    if isinstance(event.get("usage"), dict):
        reply.usage = event["usage"]
    kind = event.get("type")
    if isinstance(kind, str):
        _typed_event(reply, kind, event)
        return
    for choice in event.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict):
            content = delta.get("content")
            if isinstance(content, str):
                reply.text.append(content)
            if len(delta) > ("content" in delta) + ("role" in delta):  # reasoning, tool calls
                _delta_extras(reply, delta)
        elif isinstance(choice.get("text"), str):
            reply.text.append(choice["text"])
        if isinstance(choice.get("finish_reason"), str):
            reply.finish_reason = choice["finish_reason"]


def _delta_extras(reply: Reply, delta: dict[str, Any]) -> None:
    """What a chat delta carries besides its text (most carry only the text)."""
    for name in ("reasoning_content", "reasoning"):
        if isinstance(delta.get(name), str):
            reply.reasoning.append(delta[name])
            break
    for call in delta.get("tool_calls") or ():
        if not isinstance(call, dict):
            continue
        index = call.get("index", 0) if isinstance(call.get("index"), int) else 0
        kept = reply.tool_calls.setdefault(
            index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
        )
        if call.get("id"):
            kept["id"] = call["id"]
        fn = call.get("function")
        if isinstance(fn, dict):
            if fn.get("name"):
                kept["function"]["name"] += str(fn["name"])
            if fn.get("arguments"):
                kept["function"]["arguments"] += str(fn["arguments"])


def _typed_event(reply: Reply, kind: str, event: dict[str, Any]) -> None:
    """Responses API and Anthropic Messages events."""
    if kind == "response.output_text.delta":
        reply.text.append(str(event.get("delta", "")))
    elif kind in ("response.reasoning_text.delta", "response.reasoning_summary_text.delta"):
        reply.reasoning.append(str(event.get("delta", "")))
    elif kind in ("response.completed", "response.incomplete", "response.failed"):
        response = event.get("response")
        if isinstance(response, dict):
            if isinstance(response.get("usage"), dict):
                reply.usage = response["usage"]
            texts, reply.text = reply.text, []
            _response_or_message(reply, response)
            if not reply.text:
                reply.text = texts
    elif kind == "content_block_start":
        block = event.get("content_block")
        if isinstance(block, dict) and block.get("type") == "tool_use":
            reply.tool_calls[int(event.get("index", 0))] = {**block, "input_json": ""}
    elif kind == "content_block_delta":
        delta = event.get("delta")
        if not isinstance(delta, dict):
            return
        if delta.get("type") == "text_delta":
            reply.text.append(str(delta.get("text", "")))
        elif delta.get("type") == "thinking_delta":
            reply.reasoning.append(str(delta.get("thinking", "")))
        elif delta.get("type") == "input_json_delta":
            call = reply.tool_calls.get(int(event.get("index", 0)))
            if call is not None:
                call["input_json"] += str(delta.get("partial_json", ""))
    elif kind == "message_delta":
        delta = event.get("delta")
        if isinstance(delta, dict) and delta.get("stop_reason"):
            reply.finish_reason = str(delta["stop_reason"])
    elif kind == "message_start":
        message = event.get("message")
        if isinstance(message, dict) and isinstance(message.get("usage"), dict):
            reply.usage = dict(message["usage"])
    elif kind == "error":
        reply.error = _error_text(event)
