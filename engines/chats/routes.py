"""The chats routes (all under the control token):

GET    /api/chats                      conversations, newest first
POST   /api/chats                      {title?, model?, system_prompt?, params?} → summary
GET    /api/chats/{id}                 {chat, messages}
PATCH  /api/chats/{id}                 {title?, model?, system_prompt?, params?} → summary
DELETE /api/chats/{id}
POST   /api/chats/{id}/messages        {messages: [...], truncate_from?: N} → transcript
"""

from __future__ import annotations

from aiohttp import web

from engines.chats.service import ChatsFeature
from engines.chats.store import NewMessage
from engines.core.http import MAX_ID, json_body, ok, traylm_errors, whole_number
from engines.errors import ConfigError

CHATS: web.AppKey[ChatsFeature] = web.AppKey("chats", ChatsFeature)
"""``request.app[CHATS]``: the chats feature these routes act on (mounted by the daemon)."""
MAX_MESSAGES_PER_CALL = 1000


def chats_routes() -> list[web.RouteDef]:
    return [
        web.get("/api/chats", traylm_errors(list_chats)),
        web.post("/api/chats", traylm_errors(create_chat)),
        web.get("/api/chats/{chat_id}", traylm_errors(get_chat)),
        web.patch("/api/chats/{chat_id}", traylm_errors(update_chat)),
        web.delete("/api/chats/{chat_id}", traylm_errors(delete_chat)),
        web.post("/api/chats/{chat_id}/messages", traylm_errors(add_messages)),
    ]


def _chat_id(request: web.Request) -> int:
    return whole_number(request.match_info["chat_id"], "conversation id", lo=0, hi=MAX_ID)


async def list_chats(request: web.Request) -> web.Response:
    return ok(await request.app[CHATS].summaries())


async def create_chat(request: web.Request) -> web.Response:
    body = await json_body(request)
    unknown = set(body) - {"title", "model", "system_prompt", "params"}
    if unknown:
        raise ConfigError(f"unknown conversation fields: {', '.join(sorted(unknown))}")
    summary = await request.app[CHATS].create(
        title=body.get("title", ""),
        model=body.get("model", ""),
        system_prompt=body.get("system_prompt", ""),
        params=body.get("params") or {},
    )
    return ok(summary, status=201)


async def get_chat(request: web.Request) -> web.Response:
    return ok(await request.app[CHATS].get(_chat_id(request)))


async def update_chat(request: web.Request) -> web.Response:
    chat_id = _chat_id(request)
    body = await json_body(request)
    return ok(await request.app[CHATS].update(chat_id, body))


async def delete_chat(request: web.Request) -> web.Response:
    chat_id = _chat_id(request)
    await request.app[CHATS].delete(chat_id)
    return ok({"deleted": chat_id})


async def add_messages(request: web.Request) -> web.Response:
    chat_id = _chat_id(request)
    body = await json_body(request)
    raw = body.get("messages")
    if not isinstance(raw, list) or not 0 < len(raw) <= MAX_MESSAGES_PER_CALL:
        raise ConfigError(f"messages must be a list of 1 to {MAX_MESSAGES_PER_CALL} messages")
    messages = [NewMessage.parse(m, f"messages[{i}]") for i, m in enumerate(raw)]
    truncate = body.get("truncate_from")
    if truncate is not None and (isinstance(truncate, bool) or not isinstance(truncate, int)):
        raise ConfigError("truncate_from must be a message position (a whole number)")
    return ok(await request.app[CHATS].add_messages(chat_id, messages, truncate_from=truncate))
