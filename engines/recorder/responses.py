"""Responses API responses kept for ``previous_response_id``, retrieve, delete and input_items
(the gateway's ``ResponseStore``: engines/gateway/response_keep.py), in the recorder's
requests.db, table ``responses``.

Kept whatever ``requests.capture`` says: the client asked for it (``store`` defaults to true
in the Responses API) and the conversation's next turn needs it, so turning the request log
off must not break clients; each response is its caller's alone, deleted by DELETE, and
``requests.responses_keep = 0`` keeps none. Bounded by ``requests.responses_keep`` (count),
``requests.responses_max_mib`` and ``requests.responses_days``, the oldest dropped at each
write. A conversation whose earlier turns were dropped goes on from the oldest one kept.

``keep`` only queues; the recorder's writer parses and writes the queue with its batch, and a
read writes what is queued first, so a next turn sent the moment a reply ends finds it. A write
the disk refused (full) leaves its responses held in memory (``held``, bounded as the queue is):
retrieve and ``previous_response_id`` read them there, and the next write, once there is room,
writes them.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import sqlite3
import threading
import time
from typing import Any

from engines.config.live import SettingsView
from engines.gateway.response_keep import NewResponse
from engines.recorder.store import ROW_OVERHEAD_BYTES, RecorderStore

log = logging.getLogger(__name__)

MAX_QUEUED = 1000
MAX_QUEUED_BYTES = 64 * 1024 * 1024
"""Responses waiting to be written (a slow disk): past either bound a new one is dropped
(counted in ``traylm status``)."""
MAX_TURNS = 10_000
"""Most turns a conversation's history is walked back."""
_ENDS = ("response.completed", "response.incomplete")
_KEPT_STATUSES = ("completed", "incomplete")


class KeptResponses:
    """The kept responses (see the module docstring)."""

    def __init__(self, store: RecorderStore, settings: SettingsView) -> None:
        self._store = store
        self._settings = settings
        self._queued: list[NewResponse] = []
        self._queued_bytes = 0
        self._writing = asyncio.Lock()
        # rows a full disk refused, by (response_id, caller): read and written from threads
        self._held: collections.OrderedDict[tuple[str, str], tuple[Any, ...]] = (
            collections.OrderedDict()
        )
        self._held_bytes = 0
        self._held_lock = threading.Lock()
        self.dropped = 0

    @property
    def held(self) -> int:
        """Responses kept in memory until the disk has room."""
        return len(self._held)

    @property
    def enabled(self) -> bool:
        return self._settings.current.requests.responses_keep > 0

    def keep(self, new: NewResponse) -> None:
        size = len(new.reply)
        if len(self._queued) >= MAX_QUEUED or self._queued_bytes + size > MAX_QUEUED_BYTES:
            self.dropped += 1
            return
        self._queued.append(new)
        self._queued_bytes += size

    async def flush(self) -> None:
        """Write what is queued (the recorder's writer, and every read first)."""
        async with self._writing:
            if not self._queued and not self._held:
                return
            batch, self._queued, self._queued_bytes = self._queued, [], 0
            try:
                await asyncio.to_thread(self._write, batch, time.time())
            except sqlite3.Error:
                raise  # held in memory: written by the next flush
            except BaseException:
                self.dropped += len(batch)
                raise

    async def find(self, response_id: str, caller: str) -> dict[str, Any] | None:
        await self._flushed()
        row = await asyncio.to_thread(self._row, response_id, caller)
        if row is None:
            return None
        return {
            "response": json.loads(row[2]),
            "input_items": json.loads(row[1]),
            "previous_id": row[0],
        }

    async def history(self, response_id: str, caller: str) -> list[Any] | None:
        await self._flushed()
        return await asyncio.to_thread(self._history, response_id, caller)

    async def delete(self, response_id: str, caller: str) -> bool:
        await self._flushed()
        return await asyncio.to_thread(self._delete, response_id, caller)

    def prune(self, now_s: float) -> int:
        """Drop what is past the bounds (blocking: the recorder's prune thread)."""
        with self._store.connection() as db:
            return self._prune(db, now_s)

    # ----------------------------------------------------------------- in a thread

    async def _flushed(self) -> None:
        try:
            await self.flush()
        except sqlite3.Error as exc:  # a full disk: what is queued is lost, reads go on
            log.warning("keeping Responses API responses failed: %s", exc)

    def _write(self, batch: list[NewResponse], now_s: float) -> None:
        for new in batch:
            if (row := _row_of(new, now_s)) is not None:
                self._hold(row)
        with self._held_lock:
            rows = list(self._held.values())
        if not rows:
            return
        self._insert(rows, now_s)
        with self._held_lock:
            for row in rows:
                if self._held.pop((row[0], row[1]), None) is not None:
                    self._held_bytes -= row[-1]

    def _hold(self, row: tuple[Any, ...]) -> None:
        """``row`` in memory until it is written; past the queue's bounds the oldest held
        goes (counted)."""
        with self._held_lock:
            key = (row[0], row[1])
            if (old := self._held.pop(key, None)) is not None:
                self._held_bytes -= old[-1]
            self._held[key] = row
            self._held_bytes += row[-1]
            while len(self._held) > MAX_QUEUED or self._held_bytes > MAX_QUEUED_BYTES:
                _, gone = self._held.popitem(last=False)
                self._held_bytes -= gone[-1]
                self.dropped += 1

    def _insert(self, rows: list[tuple[Any, ...]], now_s: float) -> None:
        with self._store.connection() as db:
            db.execute("BEGIN")
            try:
                db.executemany(
                    "INSERT OR REPLACE INTO responses (response_id, caller, engine_id, "
                    "created_s, previous_id, input_json, response_json, size_bytes) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    rows,
                )
                self._prune(db, now_s)
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

    def _prune(self, db: sqlite3.Connection, now_s: float) -> int:
        r = self._settings.current.requests
        gone = db.execute(
            "DELETE FROM responses WHERE created_s < ?", (now_s - r.responses_days * 86400,)
        ).rowcount
        gone += db.execute(
            "DELETE FROM responses WHERE id <= (SELECT id FROM responses ORDER BY id DESC "
            "LIMIT 1 OFFSET ?)",
            (r.responses_keep,),
        ).rowcount
        edge = db.execute(
            "SELECT id FROM (SELECT id, SUM(size_bytes) OVER (ORDER BY id DESC) AS kept "
            "FROM responses) WHERE kept > ? ORDER BY id DESC LIMIT 1",
            (int(r.responses_max_mib * 1024 * 1024),),
        ).fetchone()
        if edge is not None:
            gone += db.execute("DELETE FROM responses WHERE id <= ?", (edge[0],)).rowcount
        return int(gone)

    def _row(self, response_id: str, caller: str) -> tuple[str, str, str] | None:
        with self._held_lock:
            held = self._held.get((response_id, caller))
        if held is not None:  # kept in memory while the disk is full
            return (str(held[4]), str(held[5]), str(held[6]))
        with self._store.connection() as db:
            row = db.execute(
                "SELECT previous_id, input_json, response_json FROM responses "
                "WHERE response_id = ? AND caller = ?",
                (response_id, caller),
            ).fetchone()
        return None if row is None else (str(row[0]), str(row[1]), str(row[2]))

    def _history(self, response_id: str, caller: str) -> list[Any] | None:
        turns: list[tuple[str, str, str]] = []
        current = response_id
        while current and len(turns) < MAX_TURNS:
            row = self._row(current, caller)
            if row is None:
                break
            turns.append(row)
            current = row[0]
        if not turns:
            return None
        items: list[Any] = []
        for _previous, input_json, response_json in reversed(turns):
            items += json.loads(input_json)
            items += json.loads(response_json).get("output") or []
        return items

    def _delete(self, response_id: str, caller: str) -> bool:
        with self._held_lock:
            held = self._held.pop((response_id, caller), None)
            if held is not None:
                self._held_bytes -= held[-1]
        with self._store.connection() as db:
            cur = db.execute(
                "DELETE FROM responses WHERE response_id = ? AND caller = ?",
                (response_id, caller),
            )
            return cur.rowcount > 0 or held is not None


def _row_of(new: NewResponse, now_s: float) -> tuple[Any, ...] | None:
    """The row of a response the engine finished (completed or incomplete), or None (a failed
    one, an error, a reply that is not a response)."""
    response = _final_event(new.reply) if new.streamed else _json(new.reply)
    if not isinstance(response, dict) or response.get("status") not in _KEPT_STATUSES:
        return None
    response_id = response.get("id")
    if not isinstance(response_id, str) or not response_id:
        return None
    response["previous_response_id"] = new.previous_id or None
    response["store"] = True
    input_json = json.dumps(new.input_items)
    response_json = json.dumps(response)
    size = len(input_json) + len(response_json) + ROW_OVERHEAD_BYTES
    return (
        response_id,
        new.caller,
        new.engine_id,
        now_s,
        new.previous_id,
        input_json,
        response_json,
        size,
    )


def _final_event(events: bytes) -> Any:
    """The ``response`` of the last ``response.completed`` / ``response.incomplete`` event."""
    found = None
    for event in events.replace(b"\r\n", b"\n").split(b"\n\n"):
        for line in event.split(b"\n"):
            if line.startswith(b"data:"):
                data = _json(line[5:].strip())
                if isinstance(data, dict) and data.get("type") in _ENDS:
                    found = data.get("response")
    return found


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None
