"""The flight recorder's own SQLite file (``requests.db`` in the data dir, mode 0600, WAL).

Its own file, not traylm.db: recorded bodies are large and pruned often, and a recorder file
that goes bad is set aside (renamed ``requests.db.corrupt-<time>``) and a new one started,
with a warning, without touching chats or benchmarks. Every method blocks: the recorder calls
them from a thread.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
    id INTEGER PRIMARY KEY,
    rid TEXT NOT NULL UNIQUE,
    arrived_s REAL NOT NULL,
    client TEXT NOT NULL,
    peer TEXT NOT NULL DEFAULT '',
    key TEXT NOT NULL DEFAULT '',
    method TEXT NOT NULL,
    path TEXT NOT NULL,
    model TEXT NOT NULL DEFAULT '',
    engine_id TEXT NOT NULL DEFAULT '',
    gpus TEXT NOT NULL DEFAULT '',
    remote INTEGER NOT NULL DEFAULT 0,
    stream INTEGER NOT NULL DEFAULT 0,
    status INTEGER NOT NULL,
    error TEXT NOT NULL DEFAULT '',
    ttft_s REAL,
    duration_s REAL NOT NULL,
    prompt_tokens INTEGER,
    completion_tokens INTEGER,
    cached_tokens INTEGER,
    conversation TEXT NOT NULL DEFAULT '',
    finish_reason TEXT NOT NULL DEFAULT '',
    cut_by TEXT NOT NULL DEFAULT '',
    capture TEXT NOT NULL,
    content_type TEXT NOT NULL DEFAULT '',
    request_body BLOB NOT NULL DEFAULT x'',
    request_size INTEGER NOT NULL DEFAULT 0,
    request_cut INTEGER NOT NULL DEFAULT 0,
    reply_json TEXT NOT NULL DEFAULT '',
    reply_body BLOB NOT NULL DEFAULT x'',
    reply_size INTEGER NOT NULL DEFAULT 0,
    reply_cut INTEGER NOT NULL DEFAULT 0,
    size_bytes INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS requests_arrived ON requests(arrived_s);
CREATE TABLE IF NOT EXISTS responses (
    id INTEGER PRIMARY KEY,
    response_id TEXT NOT NULL UNIQUE,
    caller TEXT NOT NULL,
    engine_id TEXT NOT NULL DEFAULT '',
    created_s REAL NOT NULL,
    previous_id TEXT NOT NULL DEFAULT '',
    input_json TEXT NOT NULL,
    response_json TEXT NOT NULL,
    size_bytes INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_created ON responses(created_s);
"""
COLUMNS = (
    "rid",
    "arrived_s",
    "client",
    "peer",
    "key",
    "method",
    "path",
    "model",
    "engine_id",
    "gpus",
    "remote",
    "stream",
    "status",
    "error",
    "ttft_s",
    "duration_s",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "conversation",
    "finish_reason",
    "cut_by",
    "capture",
    "content_type",
    "request_body",
    "request_size",
    "request_cut",
    "reply_json",
    "reply_body",
    "reply_size",
    "reply_cut",
)
SUMMARY_COLUMNS = tuple(c for c in COLUMNS if c not in ("request_body", "reply_json", "reply_body"))
ADDED_COLUMNS = {
    "cached_tokens": "INTEGER",
    "conversation": "TEXT NOT NULL DEFAULT ''",
}
"""Columns newer than the first requests.db: added to one made before them."""
ROW_ERRORS = (sqlite3.InterfaceError, sqlite3.IntegrityError, OverflowError, ValueError)
"""What one row's values can fail a batch with (a full disk is an OperationalError: not one
row's fault, so the batch waits for room instead)."""
WAL_LIMIT_BYTES = 16 * 1024 * 1024
"""The write-ahead log is cut back to this at each checkpoint (SQLite leaves it as large as
its largest transaction made it otherwise)."""
ROW_OVERHEAD_BYTES = 400
"""What a row takes besides its bodies (its metadata and index entries), for the size cap."""


class RecorderStore:
    """``requests.db``. ``open`` sets a corrupt file aside; ``warning`` then says so."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.warning = ""
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._connect()
        except sqlite3.DatabaseError as exc:
            self.close()
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            for suffix in ("", "-wal", "-shm"):
                src = Path(str(self.path) + suffix)
                if src.exists():
                    src.rename(Path(str(aside) + suffix))
            self.warning = (
                f"the request recorder's database was unreadable ({exc}); it was set aside as "
                f"{aside} and a new one started"
            )
            log.warning("%s", self.warning)
            self._connect()

    def _connect(self) -> None:
        if not self.path.exists():
            fd = os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600)
            os.close(fd)
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._conn = conn
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
        check = conn.execute("PRAGMA quick_check").fetchone()
        if check is None or check[0] != "ok":
            raise sqlite3.DatabaseError(f"quick_check: {check[0] if check else 'no answer'}")
        conn.executescript(SCHEMA)
        have = {row[1] for row in conn.execute("PRAGMA table_info(requests)")}
        for name, kind in ADDED_COLUMNS.items():
            if name not in have:
                conn.execute(f"ALTER TABLE requests ADD COLUMN {name} {kind}")
        conn.execute(
            "CREATE INDEX IF NOT EXISTS requests_conversation ON requests(conversation) "
            "WHERE conversation != ''"
        )
        for suffix in ("", "-wal", "-shm"):
            f = Path(str(self.path) + suffix)
            if f.exists():
                f.chmod(0o600)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    @contextmanager
    def connection(self) -> Iterator[sqlite3.Connection]:
        """The open connection, one user at a time (kept responses share it: responses.py)."""
        with self._lock:
            if self._conn is None:
                raise sqlite3.OperationalError("the recorder's database is closed")
            yield self._conn

    def write(self, rows: Sequence[dict[str, Any]]) -> int:
        """One transaction for a batch; returns the bytes written (bodies and overhead). Text
        that is not valid Unicode (a lone surrogate a client sent) is stored escaped; a row
        SQLite still refuses is left out alone, never with the rest of its batch."""
        sized = []
        for row in rows:
            size = (
                len(row["request_body"])
                + len(row["reply_json"])
                + len(row["reply_body"])
                + ROW_OVERHEAD_BYTES
            )
            sized.append(((*(_storable(row[c]) for c in COLUMNS), size), size))
        try:
            self._insert([values for values, _ in sized])
            return sum(size for _, size in sized)
        except ROW_ERRORS:
            pass  # one row is at fault: each one alone
        total = 0
        for values, size in sized:
            try:
                self._insert([values])
                total += size
            except ROW_ERRORS as exc:
                log.warning("request %s not recorded: %s", values[0], exc)
        return total

    def _insert(self, values: Sequence[tuple[Any, ...]]) -> None:
        marks = ",".join("?" * (len(COLUMNS) + 1))
        sql = f"INSERT OR REPLACE INTO requests ({','.join(COLUMNS)}, size_bytes) VALUES ({marks})"  # noqa: S608 - fixed column names
        with self.connection() as db:
            db.execute("BEGIN")
            try:
                db.executemany(sql, values)
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:  # SQLite has rolled back itself on a full disk
                    db.execute("ROLLBACK")
                raise

    def prune(self, *, older_than_s: float, max_bytes: int) -> int:
        """Delete rows older than ``older_than_s`` (a time.time()), then the oldest past
        ``max_bytes`` in all. Returns the rows deleted."""
        with self.connection() as db:
            old = db.execute("DELETE FROM requests WHERE arrived_s < ?", (older_than_s,))
            edge = db.execute(
                "SELECT id FROM (SELECT id, SUM(size_bytes) OVER (ORDER BY id DESC) AS kept "
                "FROM requests) WHERE kept > ? ORDER BY id DESC LIMIT 1",
                (max_bytes,),
            ).fetchone()
            extra = 0
            if edge is not None:
                extra = db.execute("DELETE FROM requests WHERE id <= ?", (edge[0],)).rowcount
            return int(old.rowcount) + int(extra)

    def note_errors(self, reasons: Mapping[str, str]) -> int:
        """Give rows the gateway saw no error on (a 200 without text, a client that hung
        up) the reason a client found: request id → reason. Returns the rows changed."""
        with self.connection() as db:
            changed = db.executemany(
                "UPDATE requests SET error = ? WHERE rid = ? AND error = ''",
                [(reason[:4096], rid) for rid, reason in reasons.items()],
            )
            return int(changed.rowcount)

    def total_bytes(self) -> int:
        with self.connection() as db:
            row = db.execute("SELECT COALESCE(SUM(size_bytes), 0) FROM requests").fetchone()
            return int(row[0])

    def rows(
        self,
        *,
        limit: int = 100,
        before_id: int | None = None,
        after_id: int | None = None,
        model: str = "",
        status: str = "",
        client: str = "",
        text: str = "",
    ) -> list[dict[str, Any]]:
        """Newest first (oldest first with ``after_id``: what came since); each row with its
        ``id`` (the order) and the summary columns."""
        where, params = _filters(model=model, status=status, client=client, text=text)
        if before_id is not None:
            where.append("id < ?")
            params.append(before_id)
        if after_id is not None:
            where.append("id > ?")
            params.append(after_id)
        order = "ASC" if after_id is not None else "DESC"
        sql = (
            f"SELECT id, {','.join(SUMMARY_COLUMNS)} FROM requests"  # noqa: S608 - fixed columns
            + (" WHERE " + " AND ".join(where) if where else "")
            + f" ORDER BY id {order} LIMIT ?"
        )
        with self.connection() as db:
            cur = db.execute(sql, (*params, limit))
            names = [d[0] for d in cur.description]
            rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
            _with_cache_rates(db, rows)
            return rows

    def get(self, rid: str) -> dict[str, Any] | None:
        with self.connection() as db:
            cur = db.execute(
                f"SELECT id, {','.join(COLUMNS)} FROM requests WHERE rid = ?",  # noqa: S608
                (rid,),
            )
            row = cur.fetchone()
            if row is None:
                return None
            return dict(zip([d[0] for d in cur.description], row, strict=True))

    def page_for_export(self, after_id: int, limit: int) -> list[dict[str, Any]]:
        """Rows oldest first from ``after_id`` on, with the request body."""
        with self.connection() as db:
            cur = db.execute(
                "SELECT id, rid, arrived_s, method, path, model, status, capture, content_type,"
                " request_body, request_cut, stream FROM requests WHERE id > ? ORDER BY id"
                " LIMIT ?",
                (after_id, limit),
            )
            names = [d[0] for d in cur.description]
            return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def _filters(*, model: str, status: str, client: str, text: str) -> tuple[list[str], list[Any]]:
    where: list[str] = []
    params: list[Any] = []
    if model:
        where.append("model = ?")
        params.append(model)
    if status == "error":
        where.append("status >= 400")
    elif status == "ok":
        where.append("status < 400")
    elif status:
        where.append("status = ?")
        params.append(int(status))
    if client:
        where.append("client = ?")
        params.append(client)
    if text:
        where.append("(instr(CAST(request_body AS TEXT), ?) > 0 OR instr(reply_json, ?) > 0)")
        params.extend((text, text))
    return where, params


def _storable(value: Any) -> Any:
    """``value`` as SQLite can store it: text with lone surrogates escaped (``\\ud800``)."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode()
    return value


def _with_cache_rates(db: sqlite3.Connection, rows: list[dict[str, Any]]) -> None:
    """Each row's conversation's prefix-cache hit rate: ``cache_hit_rate``, the share of its
    requests' prompt tokens the engine's cache served (None where the engine said nothing),
    and ``conversation_requests``, how many requests it holds."""
    convs = sorted({r["conversation"] for r in rows if r.get("conversation")})
    rates: dict[str, tuple[float | None, int]] = {}
    for start in range(0, len(convs), 500):
        part = convs[start : start + 500]
        marks = ",".join("?" * len(part))
        where = f"WHERE conversation IN ({marks}) GROUP BY conversation"  # placeholders only
        sql = (
            "SELECT conversation, SUM(cached_tokens), SUM(CASE WHEN cached_tokens IS NOT NULL "  # noqa: S608
            "THEN prompt_tokens END), COUNT(*) FROM requests " + where
        )
        for conv, cached, prompt, count in db.execute(sql, part):
            rate = cached / prompt if cached is not None and prompt else None
            rates[conv] = (rate, int(count))
    for r in rows:
        rate, count = rates.get(r.get("conversation") or "", (None, 1))
        if not r.get("conversation") and r.get("cached_tokens") is not None:
            rate = r["cached_tokens"] / r["prompt_tokens"] if r.get("prompt_tokens") else None
        r["cache_hit_rate"] = rate
        r["conversation_requests"] = count
