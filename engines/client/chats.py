"""The chat window's conversations (engines/chats/routes.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from engines.client.base import JSON, ClientBase, api_path
from engines.events.chat import ChatSummary, ChatTranscript
from engines.events.codec import from_plain

if TYPE_CHECKING:
    pass


class ChatCalls(ClientBase):
    async def chats(self) -> list[ChatSummary]:
        """Stored conversations of the chat window, newest first."""
        return [from_plain(ChatSummary, c) for c in await self._call("GET", "/api/chats")]

    async def chat(self, chat_id: int) -> ChatTranscript:
        return from_plain(
            ChatTranscript, await self._call("GET", api_path("/api/chats/{}", chat_id))
        )

    async def create_chat(
        self,
        *,
        title: str = "",
        model: str = "",
        system_prompt: str = "",
        params: dict[str, float] | None = None,
    ) -> ChatSummary:
        body = {"title": title, "model": model, "system_prompt": system_prompt}
        data = await self._call("POST", "/api/chats", json_body={**body, "params": params or {}})
        return from_plain(ChatSummary, data)

    async def update_chat(self, chat_id: int, **changes: Any) -> ChatSummary:
        """Change title, model, system_prompt or params of a conversation."""
        data = await self._call("PATCH", api_path("/api/chats/{}", chat_id), json_body=changes)
        return from_plain(ChatSummary, data)

    async def delete_chat(self, chat_id: int) -> None:
        await self._call("DELETE", api_path("/api/chats/{}", chat_id))

    async def add_chat_messages(
        self, chat_id: int, messages: Iterable[JSON], *, truncate_from: int | None = None
    ) -> ChatTranscript:
        """Append messages ({role, content, model?, stats?, finish_reason?}); with
        ``truncate_from`` the messages from that position on are replaced (regenerate, edit)."""
        body = {"messages": list(messages), "truncate_from": truncate_from}
        data = await self._call("POST", api_path("/api/chats/{}/messages", chat_id), json_body=body)
        return from_plain(ChatTranscript, data)
