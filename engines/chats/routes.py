"""The chats feature of the daemon: ``/api/chats`` (the chat window's conversations, kept in
SQLite through engines/chats/store.py) and ``/api/metrics`` (the gateway's Prometheus text
behind the control token, so the tray can read tokens/s also when API keys guard ``/metrics``).

Routes (all under the control token):

    GET    /api/chats                      conversations, newest first
    POST   /api/chats                      {title?, model?, system_prompt?, params?} → summary
    GET    /api/chats/{id}                 {chat, messages}
    PATCH  /api/chats/{id}                 {title?, model?, system_prompt?, params?} → summary
    DELETE /api/chats/{id}
    POST   /api/chats/{id}/messages        {messages: [...], truncate_from?: N} → transcript
    GET    /api/metrics                    {"text": Prometheus exposition}

Every change publishes ``ChatChanged`` so other windows (or a second client) can refresh.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web

from engines.bus import EventBus
from engines.chats.store import ChatStore, NewMessage
from engines.errors import ConfigError
from engines.events.chat import ChatChanged
from engines.gateway.metrics import MetricsRegistry
from engines.http import json_body, ok, traylm_errors

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MAX_MESSAGES_PER_CALL = 1000


def _chat_id(request: web.Request) -> int:
    raw = request.match_info["chat_id"]
    if not raw.isdigit():
        raise ConfigError(f"conversation id must be a number, not {raw!r}")
    return int(raw)


class DesktopFeature:
    """Routes the desktop app needs beyond the core control API. No background work."""

    name = "desktop"

    def __init__(self, chats: ChatStore, bus: EventBus, registry: MetricsRegistry) -> None:
        self._chats = chats
        self._bus = bus
        self._registry = registry

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/api/chats", traylm_errors(self.list_chats)),
            web.post("/api/chats", traylm_errors(self.create_chat)),
            web.get("/api/chats/{chat_id}", traylm_errors(self.get_chat)),
            web.patch("/api/chats/{chat_id}", traylm_errors(self.update_chat)),
            web.delete("/api/chats/{chat_id}", traylm_errors(self.delete_chat)),
            web.post("/api/chats/{chat_id}/messages", traylm_errors(self.add_messages)),
            web.get("/api/metrics", traylm_errors(self.metrics)),
        ]

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def _changed(self, chat_id: int, change: str) -> None:
        self._bus.publish(ChatChanged(chat_id=chat_id, change=change))

    async def list_chats(self, request: web.Request) -> web.Response:
        return ok(await asyncio.to_thread(self._chats.summaries))

    async def create_chat(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        unknown = set(body) - {"title", "model", "system_prompt", "params"}
        if unknown:
            raise ConfigError(f"unknown conversation fields: {', '.join(sorted(unknown))}")
        summary = await asyncio.to_thread(
            lambda: self._chats.create(
                title=body.get("title", ""),
                model=body.get("model", ""),
                system_prompt=body.get("system_prompt", ""),
                params=body.get("params") or {},
            )
        )
        self._changed(summary.chat_id, "created")
        return ok(summary, status=201)

    async def get_chat(self, request: web.Request) -> web.Response:
        return ok(await asyncio.to_thread(self._chats.get, _chat_id(request)))

    async def update_chat(self, request: web.Request) -> web.Response:
        chat_id = _chat_id(request)
        body = await json_body(request)
        summary = await asyncio.to_thread(self._chats.update, chat_id, body)
        self._changed(chat_id, "updated")
        return ok(summary)

    async def delete_chat(self, request: web.Request) -> web.Response:
        chat_id = _chat_id(request)
        await asyncio.to_thread(self._chats.delete, chat_id)
        self._changed(chat_id, "deleted")
        return ok({"deleted": chat_id})

    async def add_messages(self, request: web.Request) -> web.Response:
        chat_id = _chat_id(request)
        body = await json_body(request)
        raw = body.get("messages")
        if not isinstance(raw, list) or not 0 < len(raw) <= MAX_MESSAGES_PER_CALL:
            raise ConfigError(f"messages must be a list of 1 to {MAX_MESSAGES_PER_CALL} messages")
        messages = [NewMessage.parse(m, f"messages[{i}]") for i, m in enumerate(raw)]
        truncate = body.get("truncate_from")
        if truncate is not None and (isinstance(truncate, bool) or not isinstance(truncate, int)):
            raise ConfigError("truncate_from must be a message position (a whole number)")
        transcript = await asyncio.to_thread(
            lambda: self._chats.add_messages(chat_id, messages, truncate_from=truncate)
        )
        self._changed(chat_id, "messages")
        return ok(transcript)

    async def metrics(self, request: web.Request) -> web.Response:
        return ok({"text": self._registry.render()})
