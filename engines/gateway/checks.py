"""Request bodies checked before anything reaches an engine: each problem as (field, message),
the message saying what to send instead.

OpenAI-style routes share the limits in gateway settings (messages, n, stream). Anthropic's
Messages API gets its own rules: ``max_tokens`` is required there, and fields that exist only in
OpenAI's API are refused by name (vLLM would silently ignore them, so a client that sends
``n: 3`` or ``response_format`` believes it got what it asked for).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engines.config.sections import GatewaySettings

Problem = tuple[str, str]
"""(the offending field, what is wrong and what to send instead)."""

# OpenAI-only request fields → what Anthropic's Messages API uses instead ("" = nothing).
OPENAI_ONLY_FIELDS: Mapping[str, str] = {
    "n": "",
    "response_format": "output_config.format",
    "max_completion_tokens": "max_tokens",
    "logprobs": "",
    "top_logprobs": "",
    "frequency_penalty": "",
    "presence_penalty": "",
    "logit_bias": "",
    "seed": "",
    "stop": "stop_sequences",
    "stream_options": "",
    "functions": "tools",
    "function_call": "tool_choice",
    "parallel_tool_calls": "tool_choice.disable_parallel_tool_use",
    "user": "metadata.user_id",
    "modalities": "",
    "reasoning_effort": "thinking",
    "prompt": "messages",
    "input": "messages",
    "instructions": "system",
    "previous_response_id": "",
}


def check_openai(payload: Mapping[str, Any], g: GatewaySettings) -> Problem | None:
    """OpenAI-style JSON routes (chat, completions, embeddings, responses, tokenize, ...)."""
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        return "model", "'model' is required: one of the names GET /v1/models lists"
    messages = payload.get("messages")
    if messages is not None and (not isinstance(messages, list) or len(messages) > g.max_messages):
        return "messages", f"'messages' must be a list of at most {g.max_messages} messages"
    n = payload.get("n")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= g.max_n):
        return "n", f"'n' must be a whole number from 1 to {g.max_n}"
    stream = payload.get("stream")
    if stream is not None and not isinstance(stream, bool):
        return "stream", "'stream' must be true or false"
    return None


def check_anthropic(
    payload: Mapping[str, Any], g: GatewaySettings, *, count_tokens: bool
) -> Problem | None:
    """/v1/messages and /v1/messages/count_tokens."""
    for name, instead in OPENAI_ONLY_FIELDS.items():
        if name in payload:
            use = f"use {instead} instead" if instead else "it has no equivalent there"
            return name, (
                f"'{name}' is an OpenAI API field, not part of Anthropic's Messages API ({use}); "
                "remove it, or send an OpenAI-style request to /v1/chat/completions"
            )
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        return "model", "'model' is required: one of the names GET /v1/models lists"
    messages = payload.get("messages")
    if not isinstance(messages, list) or not 0 < len(messages) <= g.max_messages:
        return "messages", f"'messages' must be a list of 1 to {g.max_messages} messages"
    if count_tokens:
        return None
    max_tokens = payload.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        return "max_tokens", "'max_tokens' is required: the most tokens to generate (1 or more)"
    stream = payload.get("stream")
    if stream is not None and not isinstance(stream, bool):
        return "stream", "'stream' must be true or false"
    return None
