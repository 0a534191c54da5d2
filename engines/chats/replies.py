"""Chat replies kept as they stream, so that a reply in progress survives ``kill -9`` of the
tray app (fully: the daemon saw every event the engine sent) and of the daemon (up to its last
save, at most ``SAVE_EVERY_S`` old).

The chat window names the conversation and position in a header of its streamed request; the
gateway then hands every event it relays to a ``ReplyTap``. The tap keeps the text in the
database as an assistant message marked interrupted, rewritten at most every ``SAVE_EVERY_S``
(one write in flight at a time), and marks it with the engine's finish reason once the stream
ends with ``[DONE]``. A reply that ends any other way (the client went away, the engine died, an
error event) stays interrupted, and the chat window offers Retry for it.

A full disk (``DiskFull``): saves in progress are skipped (the store logs it once), and the
reply as it ended is handed to ``kept_back`` (the chats feature writes it once there is room),
so a reply the client got whole is marked complete, not interrupted, as soon as it can be.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from engines.chats.store import INTERRUPTED, ChatStore
from engines.errors import DiskFull

log = logging.getLogger(__name__)

SAVE_EVERY_S = 0.5
KeptBack = Callable[[int, str, str], None]
"""(message id, text, finish reason): a reply's end that a full disk refused, to write later."""


class ReplyTap:
    """One reply as it streams (see the module docstring). ``feed`` runs on the relay's path:
    it parses the events it is given and starts a save when one is due, never waits for it."""

    def __init__(
        self,
        chats: ChatStore,
        message_id: int,
        ended: Callable[[], None],
        kept_back: KeptBack,
    ) -> None:
        self._chats = chats
        self._message_id = message_id
        self._ended = ended
        self._kept_back = kept_back
        self._parts: list[str] = []
        self._finish = ""
        self._done = False
        self._failed = False
        self._dirty = False
        self._saved_at = time.monotonic()
        self._saving: asyncio.Task[bool] | None = None

    @property
    def text(self) -> str:
        return "".join(self._parts)

    def feed(self, events: bytes) -> None:
        """Whole server-sent events, as relayed to the client."""
        for line in events.split(b"\n"):
            if line.startswith(b"data: {"):
                self._event(line[6:])
            elif line.startswith(b"data: [DONE]"):
                self._done = True
        if self._dirty and self._saving is None:
            now = time.monotonic()
            if now - self._saved_at >= SAVE_EVERY_S:
                self._saved_at = now
                self._saving = asyncio.create_task(self._save(INTERRUPTED))

    def _event(self, raw: bytes) -> None:
        try:
            event: Any = json.loads(raw)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        if "error" in event:
            self._failed = True
            return
        for choice in event.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            content = delta.get("content") if isinstance(delta, dict) else None
            if isinstance(content, str) and content:
                self._parts.append(content)
                self._dirty = True
            if isinstance(choice.get("finish_reason"), str):
                self._finish = choice["finish_reason"]

    async def finish(self) -> None:
        """The stream is over: write the reply as it ended (later, when the disk is full)."""
        if self._saving is not None:
            await self._saving
        complete = self._done and not self._failed
        finish = (self._finish or "stop") if complete else INTERRUPTED
        self._dirty = True
        if await self._save(finish):
            self._ended()
        else:
            self._kept_back(self._message_id, self.text, finish)

    async def _save(self, finish: str) -> bool:
        """Write the reply so far; False when a full disk refused it."""
        text, self._dirty = self.text, False
        try:
            await asyncio.to_thread(
                self._chats.save_reply, self._message_id, text, finish_reason=finish
            )
        except DiskFull:
            self._dirty = True
            return False
        except Exception:  # boundary: keeping the reply must never break the reply itself
            log.exception("could not keep the chat reply %d", self._message_id)
        finally:
            self._saving = None
        return True
