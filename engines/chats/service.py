"""``ChatsFeature``: the chat window's conversations, kept in SQLite (engines/chats/store.py).

Every change publishes ``ChatChanged`` so other windows (or a second client) can refresh. The
routes are engines/chats/routes.py. Background work only while the disk is full: the ends of
replies it refused (at most ``MAX_KEPT_REPLIES``) are written once there is room.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from engines.chats.replies import ReplyTap
from engines.chats.store import ChatStore, NewMessage
from engines.errors import DiskFull
from engines.events.chat import ChatChanged, ChatSummary, ChatTranscript
from engines.events.codec import Event

log = logging.getLogger(__name__)

MAX_KEPT_REPLIES = 64
"""Reply ends kept in memory while the disk is full (each at most CONTENT_MAX_CHARS)."""
RETRY_EVERY_S = 1.0


class ChatsFeature:
    name = "chats"

    def __init__(self, chats: ChatStore, publish: Callable[[Event], None]) -> None:
        self._chats = chats
        self._publish = publish
        self._kept: dict[int, tuple[int, str, str]] = {}
        """message id → (conversation id, text, finish reason) of replies a full disk refused"""
        self._retry: asyncio.Task[None] | None = None

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._retry
        await self._write_kept()
        if self._kept:
            log.warning("%d chat replies were not saved: the disk is full", len(self._kept))

    @property
    def replies_waiting(self) -> int:
        """Ends of replies refused by a full disk, waiting for room."""
        return len(self._kept)

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
        return ReplyTap(
            self._chats,
            message_id,
            lambda: self._changed(chat_id, "messages"),
            lambda mid, text, finish: self._keep(chat_id, mid, text, finish),
        )

    def _keep(self, chat_id: int, message_id: int, text: str, finish: str) -> None:
        """A reply's end the disk had no room for: written once there is (the oldest kept
        one goes past MAX_KEPT_REPLIES)."""
        if len(self._kept) >= MAX_KEPT_REPLIES:
            oldest = next(iter(self._kept))
            del self._kept[oldest]
            log.warning("chat reply %d was not saved: the disk stayed full", oldest)
        self._kept[message_id] = (chat_id, text, finish)
        if self._retry is None or self._retry.done():
            self._retry = asyncio.create_task(self._write_when_room(), name="chat replies kept")

    async def _write_when_room(self) -> None:
        while self._kept:
            await asyncio.sleep(RETRY_EVERY_S)
            await self._write_kept()

    async def _write_kept(self) -> None:
        for message_id, (chat_id, text, finish) in list(self._kept.items()):
            try:
                await asyncio.to_thread(
                    self._chats.save_reply, message_id, text, finish_reason=finish
                )
            except DiskFull:
                return
            self._kept.pop(message_id, None)
            self._changed(chat_id, "messages")

    async def add_messages(
        self, chat_id: int, messages: list[NewMessage], *, truncate_from: int | None
    ) -> ChatTranscript:
        transcript = await asyncio.to_thread(
            lambda: self._chats.add_messages(chat_id, messages, truncate_from=truncate_from)
        )
        self._changed(chat_id, "messages")
        return transcript
