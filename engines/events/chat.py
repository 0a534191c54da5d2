"""Stored conversations of the chat window (engines/chats/)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar

from engines.events.codec import Event

CHAT_ROLES = ("system", "user", "assistant")


@dataclasses.dataclass(frozen=True)
class ChatSummary:
    """One stored conversation of the chat window, without its messages."""

    chat_id: int
    title: str
    model: str
    system_prompt: str
    params: Mapping[str, float]  # temperature, top_p, max_tokens
    created_s: float
    updated_s: float
    message_count: int


@dataclasses.dataclass(frozen=True)
class ChatToolRun:
    """A tool call a reply made (the chat's MCP tools): what the model asked, what the user
    answered (``outcome``: allowed, denied or failed) and what came back."""

    name: str
    server: str
    arguments: str  # JSON text, as the model wrote it
    outcome: str
    result: str


@dataclasses.dataclass(frozen=True)
class ChatMessage:
    """One message of a conversation. ``stats`` holds per-reply figures (ttft_s, tokens_per_s,
    completion_tokens); ``finish_reason`` is stop, length, stopped (by the user), error, or
    interrupted (still streaming, or cut off: the app or the daemon was killed mid-reply)."""

    message_id: int
    chat_id: int
    position: int
    role: str
    content: str
    model: str
    stats: Mapping[str, float]
    finish_reason: str
    created_s: float
    images: tuple[str, ...] = ()
    """Images the message carries (a user's, for a vision model), each a ``data:`` URL."""
    tools: tuple[ChatToolRun, ...] = ()
    """The tool calls a reply made before its text, in order (none for older messages)."""


@dataclasses.dataclass(frozen=True)
class ChatTranscript:
    chat: ChatSummary
    messages: tuple[ChatMessage, ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChatChanged(Event):
    """A conversation was created, renamed, given messages, or deleted (any client did it)."""

    kind: ClassVar[str] = "chat.changed"
    chat_id: int
    change: str  # created | updated | messages | deleted
