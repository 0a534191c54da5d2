"""``ChatsFeature``: the chat window's conversations, kept in SQLite (engines/chats/store.py).

Every change publishes ``ChatChanged`` so other windows (or a second client) can refresh. The
routes are engines/chats/routes.py. No background work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from engines.chats.replies import ReplyTap
from engines.chats.store import ChatStore, NewMessage
from engines.events.chat import ChatChanged, ChatSummary, ChatTranscript
from engines.events.codec import Event


class ChatsFeature:
    name = "chats"

    def __init__(self, chats: ChatStore, publish: Callable[[Event], None]) -> None:
        self._chats = chats
        self._publish = publish

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def _changed(self, chat_id: int, change: str) -> None:
        self._publish(ChatChanged(chat_id=chat_id, change=change))

    async def summaries(self) -> list[ChatSummary]:
        return await asyncio.to_thread(self._chats.summaries)

    async def get(self, chat_id: int) -> ChatTranscript:
        return await asyncio.to_thread(self._chats.get, chat_id)

    async def create(
        self, *, title: str, model: str, system_prompt: str, params: Mapping[str, Any]
    ) -> ChatSummary:
        summary = await asyncio.to_thread(
            lambda: self._chats.create(
                title=title, model=model, system_prompt=system_prompt, params=params
            )
        )
        self._changed(summary.chat_id, "created")
        return summary

    async def update(self, chat_id: int, changes: Mapping[str, Any]) -> ChatSummary:
        summary = await asyncio.to_thread(self._chats.update, chat_id, changes)
        self._changed(chat_id, "updated")
        return summary

    async def delete(self, chat_id: int) -> None:
        await asyncio.to_thread(self._chats.delete, chat_id)
        self._changed(chat_id, "deleted")

    async def tap_reply(self, chat_id: int, position: int, model: str) -> ReplyTap:
        """Keep the reply the gateway is about to stream for the conversation, from its first
        token (engines/chats/replies.py). Raises ChatNotFound or ConfigError."""
        message_id = await asyncio.to_thread(self._chats.begin_reply, chat_id, position, model)
        self._changed(chat_id, "messages")
        return ReplyTap(self._chats, message_id, lambda: self._changed(chat_id, "messages"))

    async def add_messages(
        self, chat_id: int, messages: list[NewMessage], *, truncate_from: int | None
    ) -> ChatTranscript:
        transcript = await asyncio.to_thread(
            lambda: self._chats.add_messages(chat_id, messages, truncate_from=truncate_from)
        )
        self._changed(chat_id, "messages")
        return transcript
