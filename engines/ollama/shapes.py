"""Ollama's request bodies (github ollama/ollama docs/api.md, api/types.go) as the OpenAI
requests traylm's engines serve.

- ``/api/chat`` → ``/v1/chat/completions``: messages (``images``: base64 → ``image_url`` data
  URIs; ``tool_calls`` arguments objects → JSON strings, ``tool`` replies tied to their call),
  ``tools`` as they are (Ollama's are OpenAI's), ``format`` → ``response_format``, ``options``
  → sampling fields, ``think`` → ``chat_template_kwargs.enable_thinking`` or
  ``reasoning_effort``.
- ``/api/generate`` → the same chat request with ``system``, ``prompt`` and ``images`` as
  messages (the model's chat template applies, as in Ollama), or ``/v1/completions`` with the
  prompt as it is when ``raw`` is set.
- ``/api/embed`` and ``/api/embeddings`` → ``/v1/embeddings``.

A body that is not what Ollama accepts raises ``BadRequest`` with the words to answer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

OPTIONS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "seed": "seed",
    "stop": "stop",
    "num_predict": "max_tokens",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "repeat_penalty": "repetition_penalty",
}
"""Ollama's ``options`` the engines apply per request, with their OpenAI (or vLLM) names.
The rest (num_ctx, num_gpu, num_thread, mirostat, ...) are fixed when traylm starts the engine
(its profile's max_model_len, GPUs): they are ignored here, as Ollama ignores unknown ones."""
EFFORTS = ("low", "medium", "high")
LATEST = ":latest"
IMAGE_KINDS = (
    ("iVBOR", "image/png"),
    ("/9j/", "image/jpeg"),
    ("R0lG", "image/gif"),
    ("UklG", "image/webp"),
)


class BadRequest(ValueError):
    """A body Ollama would refuse; the message is what the client is told."""


def model_of(body: Mapping[str, Any]) -> str:
    """The model a request names (``model``, or the older ``name``), as it names it."""
    model = body.get("model") or body.get("name")
    if not isinstance(model, str) or not model:
        raise BadRequest("model is required")
    return model


def served_of(body: Mapping[str, Any]) -> str:
    """The traylm model a request names: Ollama's ``NAME:latest`` (what its clients send, and
    what /api/tags lists for a name without a tag) is traylm's ``NAME``."""
    model = model_of(body)
    return model.removesuffix(LATEST) if model.endswith(LATEST) else model


def tagged(name: str) -> str:
    """A traylm model's name as Ollama lists it: with its tag, ``:latest`` when it has none
    (Open WebUI's eject looks up ``NAME:latest`` in /api/tags)."""
    return name if ":" in name else name + LATEST


def chat_request(body: Mapping[str, Any], model: str) -> dict[str, Any]:
    """/api/chat's body as /v1/chat/completions's."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise BadRequest("messages must be a list of {role, content} objects")
    out: dict[str, Any] = {"model": model, "messages": _messages(messages)}
    tools = body.get("tools")
    if tools:
        if not isinstance(tools, list):
            raise BadRequest("tools must be a list of function tools")
        out["tools"] = tools
    _common(body, out)
    _think(body.get("think"), out)
    return out


def generate_request(body: Mapping[str, Any], model: str) -> tuple[str, dict[str, Any]]:
    """/api/generate's body as the engine route and its body: chat completions, or completions
    for a ``raw`` prompt."""
    prompt = body.get("prompt") or ""
    if not isinstance(prompt, str):
        raise BadRequest("prompt must be a string")
    if body.get("raw") is True:
        out: dict[str, Any] = {"model": model, "prompt": prompt}
        if isinstance(body.get("suffix"), str) and body["suffix"]:
            out["suffix"] = body["suffix"]
        _common(body, out)
        return "/v1/completions", out
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if isinstance(system, str) and system:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": prompt, "images": body.get("images")})
    out = {"model": model, "messages": _messages(messages)}
    _common(body, out)
    _think(body.get("think"), out)
    return "/v1/chat/completions", out


def embed_request(body: Mapping[str, Any], model: str, *, legacy: bool) -> dict[str, Any]:
    """/api/embed's (``input``: a string or a list) or /api/embeddings's (``prompt``) body."""
    given = body.get("prompt") if legacy else body.get("input")
    if isinstance(given, str):
        inputs: list[str] = [given]
    elif not legacy and isinstance(given, list) and all(isinstance(x, str) for x in given):
        inputs = list(given)
    else:
        what = "prompt must be a string" if legacy else "input must be a string or strings"
        raise BadRequest(what)
    out: dict[str, Any] = {"model": model, "input": inputs}
    if isinstance(body.get("dimensions"), int):
        out["dimensions"] = body["dimensions"]
    if body.get("truncate") is not False:
        out["truncate_prompt_tokens"] = -1  # vLLM: cut to the model's context, as Ollama does
    return out


def _common(body: Mapping[str, Any], out: dict[str, Any]) -> None:
    """``stream`` (Ollama's default: true), ``format`` and ``options``."""
    stream = body.get("stream", True) is not False
    out["stream"] = stream
    if stream:
        out["stream_options"] = {"include_usage": True}  # the counts of the last line
    fmt = body.get("format")
    if fmt == "json":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        out["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "format", "schema": fmt},
        }
    elif fmt not in (None, ""):
        raise BadRequest('format must be "json" or a JSON schema object')
    options = body.get("options")
    if options is None:
        return
    if not isinstance(options, dict):
        raise BadRequest("options must be an object")
    for name, openai_name in OPTIONS.items():
        value = options.get(name)
        if value is None:
            continue
        if name == "num_predict" and isinstance(value, int) and value < 0:
            continue  # -1: until the model stops (the engine's default)
        out[openai_name] = [value] if name == "stop" and isinstance(value, str) else value


def _think(think: object, out: dict[str, Any]) -> None:
    """``think``: true/false turns a thinking model's reasoning on or off (Qwen3's and
    DeepSeek's chat templates read ``enable_thinking``); "low"/"medium"/"high" sets the effort
    (gpt-oss)."""
    if isinstance(think, bool):
        out["chat_template_kwargs"] = {"enable_thinking": think}
    elif isinstance(think, str) and think in EFFORTS:
        out["reasoning_effort"] = think
    elif think is not None:
        raise BadRequest('think must be true, false, "low", "medium" or "high"')


def _messages(messages: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    pending: list[str] = []  # ids of tool calls not answered yet, oldest first
    for n, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest(f"messages[{n}] must be an object with a role")
        one: dict[str, Any] = {"role": message["role"]}
        content = message.get("content") or ""
        if not isinstance(content, str):
            raise BadRequest(f"messages[{n}].content must be a string")
        images = message.get("images")
        one["content"] = _with_images(content, images, n) if images else content
        calls = message.get("tool_calls")
        if calls:
            one["tool_calls"] = _tool_calls(calls, n, len(out))
            pending += [c["id"] for c in one["tool_calls"]]
        if message["role"] == "tool":
            one["tool_call_id"] = pending.pop(0) if pending else f"call_{n}"
            if isinstance(message.get("tool_name"), str):
                one["name"] = message["tool_name"]
        out.append(one)
    return out


def _with_images(text: str, images: object, n: int) -> list[dict[str, Any]]:
    if not isinstance(images, list) or not all(isinstance(i, str) for i in images):
        raise BadRequest(f"messages[{n}].images must be a list of base64 strings")
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    for image in images:
        kind = next((k for start, k in IMAGE_KINDS if image.startswith(start)), "image/png")
        parts.append({"type": "image_url", "image_url": {"url": f"data:{kind};base64,{image}"}})
    return parts


def _tool_calls(calls: object, n: int, at: int) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise BadRequest(f"messages[{n}].tool_calls must be a list")
    out = []
    for k, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise BadRequest(f"messages[{n}].tool_calls[{k}] needs function.name")
        arguments = function.get("arguments", {})
        text = arguments if isinstance(arguments, str) else json.dumps(arguments)
        call_id = call.get("id") if isinstance(call.get("id"), str) else f"call_{at}_{k}"
        out.append(
            {
                "id": call_id,
                "type": "function",
                "function": {"name": function["name"], "arguments": text},
            }
        )
    return out
