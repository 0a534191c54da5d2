"""Conversations of the chat window, stored in the daemon's SQLite file (tables ``chats`` and
``messages`` of the store's first migration).

Every method blocks (SQLite): the daemon calls them through ``asyncio.to_thread``. Each change
is one transaction, so a conversation is never left half-written, also not by ``kill -9``.
Bad input raises ``ConfigError`` naming the field; an unknown id raises ``ChatNotFound``.
"""

from __future__ import annotations

import binascii
import dataclasses
import json
import math
import re
import sqlite3
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engines.core.store import Store, dumps
from engines.errors import ChatNotFound, ConfigError
from engines.events.chat import CHAT_ROLES, ChatMessage, ChatSummary, ChatToolRun, ChatTranscript

TITLE_MAX_CHARS = 200
CONTENT_MAX_CHARS = 1_000_000
PARAM_BOUNDS: Mapping[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "max_tokens": (1.0, 1_048_576.0),
    # when the conversation outgrows the model's context: 0 stop and say so, 1 leave the
    # oldest turns out, 2 keep the first turn and the latest ones (the chat window does it)
    "context_policy": (0.0, 2.0),
}
STAT_NAMES = frozenset(
    {"ttft_s", "tokens_per_s", "completion_tokens", "prompt_tokens", "duration_s", "load_s"}
)
INTERRUPTED = "interrupted"
"""A reply that did not complete: still streaming, or cut off (app or daemon killed, engine
died). The chat window offers Retry for it."""
# "context": cut because the model's context was full (before max_tokens)
# "tool_calls": the reply asked for tools and stopped there
FINISH_REASONS = frozenset(
    {"", "stop", "length", "context", "stopped", "error", "tool_calls", INTERRUPTED}
)
UPDATABLE = ("title", "model", "system_prompt", "params")
IMAGES_MAX = 4
IMAGE_MAX_CHARS = 8_000_000  # one image's data URL (about 6 MB of picture)
TOOLS_MAX = 64  # tool calls kept with one reply
TOOL_FIELDS = ("name", "server", "arguments", "outcome", "result")
TOOL_OUTCOMES = frozenset({"allowed", "denied", "failed"})
IMAGE_URL = re.compile(r"data:image/(png|jpeg|webp|gif);base64,([A-Za-z0-9+/=]+)")

_SUMMARY_SQL = (
    "SELECT c.*, (SELECT COUNT(*) FROM messages m WHERE m.chat_id = c.id) AS message_count "
    "FROM chats c"
)


@dataclass(frozen=True)
class NewMessage:
    """A message to append, as validated from the control API."""

    role: str
    content: str
    model: str = ""
    stats: Mapping[str, float] = field(default_factory=dict)
    finish_reason: str = ""
    images: tuple[str, ...] = ()
    tools: tuple[ChatToolRun, ...] = ()

    @classmethod
    def parse(cls, data: object, where: str) -> NewMessage:
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where} must be an object with role and content")
        role, content = data.get("role"), data.get("content")
        if role not in CHAT_ROLES:
            raise ConfigError(f"{where}.role must be one of {', '.join(CHAT_ROLES)}, not {role!r}")
        if not isinstance(content, str) or len(content) > CONTENT_MAX_CHARS:
            raise ConfigError(f"{where}.content must be text of at most {CONTENT_MAX_CHARS} chars")
        model = data.get("model", "")
        if not isinstance(model, str):
            raise ConfigError(f"{where}.model must be a string")
        finish = data.get("finish_reason", "")
        if finish not in FINISH_REASONS:
            raise ConfigError(
                f"{where}.finish_reason must be one of {', '.join(sorted(FINISH_REASONS))}"
            )
        stats = _parse_stats(data.get("stats", {}), where)
        images = _parse_images(data.get("images", []), where)
        tools = _parse_tools(data.get("tools", []), where)
        return cls(role, content, model, stats, finish, images, tools)


def _parse_tools(raw: object, where: str) -> tuple[ChatToolRun, ...]:
    """A reply's tool calls: objects of text fields (name, server, arguments, outcome, result)."""
    if not isinstance(raw, list) or len(raw) > TOOLS_MAX:
        raise ConfigError(f"{where}.tools must be a list of at most {TOOLS_MAX} tool calls")
    runs = []
    for i, item in enumerate(raw):
        at = f"{where}.tools[{i}]"
        if not isinstance(item, Mapping) or not all(
            isinstance(item.get(k, ""), str) for k in TOOL_FIELDS
        ):
            raise ConfigError(f"{at} must be an object of text: {', '.join(TOOL_FIELDS)}")
        if item.get("outcome") not in TOOL_OUTCOMES:
            raise ConfigError(f"{at}.outcome must be one of {', '.join(sorted(TOOL_OUTCOMES))}")
        fields = {k: str(item.get(k, ""))[:CONTENT_MAX_CHARS] for k in TOOL_FIELDS}
        runs.append(ChatToolRun(**fields))
    return tuple(runs)


def _parse_images(raw: object, where: str) -> tuple[str, ...]:
    """A message's images: PNG, JPEG, WebP or GIF ``data:`` URLs (base64), a few, each bounded:
    they are kept in the chats table with the message."""
    if not isinstance(raw, list) or len(raw) > IMAGES_MAX:
        raise ConfigError(f"{where}.images must be a list of at most {IMAGES_MAX} images")
    for i, url in enumerate(raw):
        match = IMAGE_URL.fullmatch(url) if isinstance(url, str) else None
        if match is None or len(url) > IMAGE_MAX_CHARS:
            raise ConfigError(
                f"{where}.images[{i}] must be a data:image/png, jpeg, webp or gif;base64 URL of "
                f"at most {IMAGE_MAX_CHARS:,} characters (scale the picture down)"
            )
        try:
            binascii.a2b_base64(match.group(2), strict_mode=True)
        except binascii.Error as exc:
            raise ConfigError(f"{where}.images[{i}] is not valid base64 ({exc})") from None
    return tuple(raw)


def _parse_stats(raw: object, where: str) -> dict[str, float]:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}.stats must be an object of numbers")
    stats: dict[str, float] = {}
    for key, value in raw.items():
        if key not in STAT_NAMES:
            raise ConfigError(f"{where}.stats.{key} is unknown; known: {', '.join(STAT_NAMES)}")
        if not _finite_number(value):
            raise ConfigError(f"{where}.stats.{key} must be a finite number")
        stats[str(key)] = float(value)
    return stats


def parse_params(raw: object) -> dict[str, float]:
    """Sampling parameters of a conversation: temperature, top_p, max_tokens (bounded)."""
    if not isinstance(raw, Mapping):
        raise ConfigError('params must be an object like {"temperature": 0.7}')
    params: dict[str, float] = {}
    for key, value in raw.items():
        if key not in PARAM_BOUNDS:
            raise ConfigError(f"params.{key} is unknown; known: {', '.join(PARAM_BOUNDS)}")
        lo, hi = PARAM_BOUNDS[key]
        if not _finite_number(value) or not lo <= float(value) <= hi:
            raise ConfigError(f"params.{key} must be a number from {lo:g} to {hi:g}")
        params[str(key)] = float(value)
    return params


def _finite_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_text(name: str, value: object, limit: int) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise ConfigError(f"{name} must be text of at most {limit} characters")
    return value


class ChatStore:
    """Conversations and their messages. Blocking: call from a thread."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def summaries(self, limit: int = 500) -> list[ChatSummary]:
        rows = self._store.query(f"{_SUMMARY_SQL} ORDER BY c.updated_s DESC LIMIT ?", (limit,))
        return [_summary(r) for r in rows]

    def get(self, chat_id: int) -> ChatTranscript:
        rows = self._store.query(f"{_SUMMARY_SQL} WHERE c.id = ?", (chat_id,))
        if not rows:
            raise ChatNotFound(f"no conversation {chat_id}; it may have been deleted")
        messages = self._store.query(
            "SELECT * FROM messages WHERE chat_id = ? ORDER BY position", (chat_id,)
        )
        return ChatTranscript(_summary(rows[0]), tuple(_message(m) for m in messages))

    def create(
        self,
        *,
        title: str = "",
        model: str = "",
        system_prompt: str = "",
        params: Mapping[str, float] | None = None,
    ) -> ChatSummary:
        values = _checked_fields(
            {
                "title": title,
                "model": model,
                "system_prompt": system_prompt,
                "params": params or {},
            }
        )
        now = time.time()
        with self._store.transaction() as db:
            cur = db.execute(
                "INSERT INTO chats (title, model, system_prompt, params_json, created_s, updated_s)"
                " VALUES (?,?,?,?,?,?)",
                (
                    values["title"],
                    values["model"],
                    values["system_prompt"],
                    values["params_json"],
                    now,
                    now,
                ),
            )
            chat_id = int(cur.lastrowid or 0)
        return self.get(chat_id).chat

    def update(self, chat_id: int, changes: Mapping[str, Any]) -> ChatSummary:
        unknown = set(changes) - set(UPDATABLE)
        if unknown:
            raise ConfigError(
                f"cannot change {', '.join(sorted(unknown))}; changeable: {', '.join(UPDATABLE)}"
            )
        values = _checked_fields(changes)
        if values:
            columns = ", ".join(f"{k} = ?" for k in values)
            with self._store.transaction() as db:
                cur = db.execute(
                    f"UPDATE chats SET {columns}, updated_s = ? WHERE id = ?",  # noqa: S608 - names are fixed
                    (*values.values(), time.time(), chat_id),
                )
                if cur.rowcount == 0:
                    raise ChatNotFound(f"no conversation {chat_id}; it may have been deleted")
        return self.get(chat_id).chat

    def delete(self, chat_id: int) -> None:
        with self._store.transaction() as db:
            db.execute("DELETE FROM messages WHERE chat_id = ?", (chat_id,))
            cur = db.execute("DELETE FROM chats WHERE id = ?", (chat_id,))
            if cur.rowcount == 0:
                raise ChatNotFound(f"no conversation {chat_id}; it may have been deleted")

    def add_messages(
        self, chat_id: int, messages: Sequence[NewMessage], *, truncate_from: int | None = None
    ) -> ChatTranscript:
        """Append ``messages``; with ``truncate_from`` first drop the messages at that position
        and after (regenerate a reply, edit a message and resend). All of it, or none."""
        if truncate_from is not None and truncate_from < 0:
            raise ConfigError("truncate_from must be a position (0 or more)")
        now = time.time()
        with self._store.transaction() as db:
            chat = db.execute("SELECT title FROM chats WHERE id = ?", (chat_id,)).fetchone()
            if chat is None:
                raise ChatNotFound(f"no conversation {chat_id}; it may have been deleted")
            title = str(chat["title"])
            if truncate_from is not None:
                title = _title_after_edit(db, chat_id, truncate_from, title)
                db.execute(
                    "DELETE FROM messages WHERE chat_id = ? AND position >= ?",
                    (chat_id, truncate_from),
                )
            row = db.execute(
                "SELECT COALESCE(MAX(position), -1) FROM messages WHERE chat_id = ?", (chat_id,)
            ).fetchone()
            position = int(row[0]) + 1
            for msg in messages:
                stats = {
                    **msg.stats,
                    **({"finish": msg.finish_reason} if msg.finish_reason else {}),
                }
                db.execute(
                    "INSERT INTO messages (chat_id, position, role, content, model, stats_json,"
                    " created_s, images_json, tools_json) VALUES (?,?,?,?,?,?,?,?,?)",
                    (
                        chat_id,
                        position,
                        msg.role,
                        msg.content,
                        msg.model,
                        dumps(stats),
                        now,
                        dumps(list(msg.images)),
                        dumps([dataclasses.asdict(t) for t in msg.tools]),
                    ),
                )
                position += 1
            title = title or _title_from(messages)
            db.execute(
                "UPDATE chats SET updated_s = ?, title = ? WHERE id = ?", (now, title, chat_id)
            )
        return self.get(chat_id)

    def begin_reply(self, chat_id: int, position: int, model: str) -> int:
        """A reply starts streaming at ``position``: the messages from there on are replaced by
        an empty assistant message marked interrupted until the reply completes. Returns its
        message id (for ``save_reply``)."""
        transcript = self.add_messages(
            chat_id,
            [NewMessage("assistant", "", model[:TITLE_MAX_CHARS], finish_reason=INTERRUPTED)],
            truncate_from=position,
        )
        return transcript.messages[-1].message_id

    def save_reply(
        self, message_id: int, content: str, *, finish_reason: str = INTERRUPTED
    ) -> bool:
        """Write a reply in progress (or its end). Only while it is still marked interrupted:
        once the chat window stored the reply itself (with its own figures), that one stays.
        Returns whether it was written."""
        finish = {"finish": finish_reason} if finish_reason else {}
        with self._store.transaction() as db:
            cur = db.execute(
                "UPDATE messages SET content = ?, stats_json = ? WHERE id = ? "
                "AND json_extract(stats_json, '$.finish') = ?",
                (content[:CONTENT_MAX_CHARS], dumps(finish), message_id, INTERRUPTED),
            )
            return cur.rowcount > 0


def _checked_fields(changes: Mapping[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    if "title" in changes:
        values["title"] = _check_text("title", changes["title"], TITLE_MAX_CHARS)
    if "model" in changes:
        values["model"] = _check_text("model", changes["model"], TITLE_MAX_CHARS)
    if "system_prompt" in changes:
        values["system_prompt"] = _check_text(
            "system_prompt", changes["system_prompt"], CONTENT_MAX_CHARS
        )
    if "params" in changes:
        values["params_json"] = dumps(parse_params(changes["params"]))
    return values


def _title_after_edit(db: sqlite3.Connection, chat_id: int, position: int, title: str) -> str:
    """The title once the messages from ``position`` on are replaced: a title taken from the
    first question follows that question when it is edited ("" to take it anew); a title the
    user gave stays."""
    first = db.execute(
        "SELECT position, content FROM messages WHERE chat_id = ? AND role = 'user'"
        " ORDER BY position LIMIT 1",
        (chat_id,),
    ).fetchone()
    if first is None or int(first[0]) < position:
        return title
    derived = _title_from([NewMessage("user", str(first[1]))])
    return "" if title == derived else title


def _title_from(messages: Sequence[NewMessage]) -> str:
    for msg in messages:
        if msg.role == "user" and msg.content.strip():
            first = " ".join(msg.content.split())
            return first if len(first) <= 60 else first[:59].rstrip() + "…"
    return ""


def _summary(row: Mapping[str, Any]) -> ChatSummary:
    return ChatSummary(
        chat_id=int(row["id"]),
        title=str(row["title"]),
        model=str(row["model"]),
        system_prompt=str(row["system_prompt"]),
        params={str(k): float(v) for k, v in json.loads(row["params_json"]).items()},
        created_s=float(row["created_s"]),
        updated_s=float(row["updated_s"]),
        message_count=int(row["message_count"]),
    )


def _message(row: Mapping[str, Any]) -> ChatMessage:
    raw = json.loads(row["stats_json"])
    finish = str(raw.pop("finish", ""))
    return ChatMessage(
        message_id=int(row["id"]),
        chat_id=int(row["chat_id"]),
        position=int(row["position"]),
        role=str(row["role"]),
        content=str(row["content"]),
        model=str(row["model"]),
        stats={str(k): float(v) for k, v in raw.items()},
        finish_reason=finish,
        created_s=float(row["created_s"]),
        images=tuple(str(url) for url in json.loads(row["images_json"])),
        tools=tuple(ChatToolRun(**t) for t in json.loads(row["tools_json"])),
    )
