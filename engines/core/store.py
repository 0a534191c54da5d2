"""The daemon's one SQLite file (WAL): chats, usage log, telemetry history, downloads, benchmarks.

Schema changes are numbered migrations applied in order inside a transaction; the applied number
is ``PRAGMA user_version``. A migration is never edited once it has landed: add a new one.
Every call is blocking: the daemon calls the store through ``asyncio.to_thread``.

A full disk: a write that SQLite refuses with SQLITE_FULL raises ``DiskFull`` (naming the data
folder and what to free), after the transaction is rolled back (or found already rolled back by
SQLite). The store remembers it (``full``) until a write lands again, logs one line each way and
tells ``on_disk_full``; ``check_space`` is how a caller with nothing to write finds out that
space came back.
"""

from __future__ import annotations

import json
import logging
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from engines.errors import DiskFull

log = logging.getLogger(__name__)

MIGRATIONS: tuple[str, ...] = (
    # 1: chats (desktop chat window), usage log (gateway), telemetry history (gpu sampler),
    #    downloads (hub), benchmark runs (bench)
    """
    CREATE TABLE chats (
        id INTEGER PRIMARY KEY,
        title TEXT NOT NULL DEFAULT '',
        model TEXT NOT NULL DEFAULT '',
        system_prompt TEXT NOT NULL DEFAULT '',
        params_json TEXT NOT NULL DEFAULT '{}',
        created_s REAL NOT NULL,
        updated_s REAL NOT NULL
    );
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
        position INTEGER NOT NULL,
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        model TEXT NOT NULL DEFAULT '',
        stats_json TEXT NOT NULL DEFAULT '{}',
        created_s REAL NOT NULL
    );
    CREATE INDEX messages_chat ON messages(chat_id, position);
    CREATE TABLE usage (
        id INTEGER PRIMARY KEY,
        ts_s REAL NOT NULL,
        model TEXT NOT NULL,
        engine_id TEXT NOT NULL,
        route TEXT NOT NULL,
        remote INTEGER NOT NULL DEFAULT 0,
        status INTEGER NOT NULL,
        prompt_tokens INTEGER,
        completion_tokens INTEGER,
        duration_s REAL
    );
    CREATE INDEX usage_ts ON usage(ts_s);
    CREATE TABLE telemetry (
        ts_s REAL NOT NULL,
        gpu_uuid TEXT NOT NULL,
        data_json TEXT NOT NULL,
        PRIMARY KEY (gpu_uuid, ts_s)
    ) WITHOUT ROWID;
    CREATE TABLE downloads (
        id TEXT PRIMARY KEY,
        repo_id TEXT NOT NULL,
        revision TEXT,
        state TEXT NOT NULL,
        data_json TEXT NOT NULL DEFAULT '{}',
        created_s REAL NOT NULL,
        updated_s REAL NOT NULL
    );
    CREATE TABLE bench_runs (
        id INTEGER PRIMARY KEY,
        created_s REAL NOT NULL,
        name TEXT NOT NULL DEFAULT '',
        config_json TEXT NOT NULL,
        result_json TEXT NOT NULL
    );
    """,
    # 2 (hub): models verified against the Hub's hashes, and per-model consent to run
    #    a repo's own code (trust_remote_code)
    """
    CREATE TABLE hub_models (
        repo_id TEXT NOT NULL,
        commit_sha TEXT NOT NULL,
        state TEXT NOT NULL,
        checked_s REAL NOT NULL,
        files_json TEXT NOT NULL DEFAULT '[]',
        PRIMARY KEY (repo_id, commit_sha)
    );
    CREATE TABLE hub_trust (
        repo_id TEXT PRIMARY KEY,
        granted_s REAL NOT NULL
    );
    """,
    # 3 (chats): the images a message carries (data URLs), stored with it
    """
    ALTER TABLE messages ADD COLUMN images_json TEXT NOT NULL DEFAULT '[]';
    """,
    # 4 (chats): the tool calls a reply made (the chat's MCP tools) and their results
    """
    ALTER TABLE messages ADD COLUMN tools_json TEXT NOT NULL DEFAULT '[]';
    """,
    # 5 (batch): uploaded files (OpenAI's Files API); the bytes are in the data folder
    """
    CREATE TABLE files (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        filename TEXT NOT NULL,
        purpose TEXT NOT NULL,
        bytes INTEGER NOT NULL,
        created_s REAL NOT NULL
    );
    """,
    # 6 (batch): batches (OpenAI's Batch API) and each finished line's answer, kept as it ends
    """
    CREATE TABLE batches (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        record_json TEXT NOT NULL,
        created_s REAL NOT NULL
    );
    CREATE TABLE batch_lines (
        batch_id TEXT NOT NULL REFERENCES batches(id) ON DELETE CASCADE,
        line INTEGER NOT NULL,
        ok INTEGER NOT NULL,
        result_json TEXT NOT NULL,
        PRIMARY KEY (batch_id, line)
    );
    """,
)


class Store:
    """Thread-safe access to traylm.db: one connection, serialised by a lock."""

    def __init__(
        self, path: Path, *, on_disk_full: Callable[[DiskFull | None], None] | None = None
    ) -> None:
        """``on_disk_full``: called (from the writing thread) with the error when writes start
        failing for a full disk, and with None when one lands again."""
        self.path = path
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._on_disk_full = on_disk_full
        self._full: DiskFull | None = None
        self.full_since_s: float | None = None

    def open(self) -> None:
        """Open (and migrate) traylm.db. Raises DiskFull when its disk has no room."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=10)
        try:
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
        except sqlite3.Error as exc:
            conn.close()
            if _disk_full(exc):
                raise DiskFull(self._full_message()) from exc
            raise
        self._conn = conn
        self._migrate()

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    @property
    def schema_version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    @property
    def full(self) -> DiskFull | None:
        """The error writes get while the disk is full; None once a write lands again."""
        return self._full

    @property
    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError("Store.open() was not called")
        return self._conn

    def _migrate(self) -> None:
        current = self.schema_version
        for number, sql in enumerate(MIGRATIONS[current:], start=current + 1):
            with self.transaction() as db:
                for statement in _split_sql(sql):
                    db.execute(statement)
                db.execute(f"PRAGMA user_version = {number}")

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction: all of it lands, or none of it (also on kill -9). Raises
        DiskFull when the disk has no room for it."""
        with self._lock:
            db = self._db
            try:
                db.execute("BEGIN IMMEDIATE")
                yield db
                db.execute("COMMIT")
            except BaseException as exc:
                if db.in_transaction:  # SQLite already rolled back after some errors (SQLITE_FULL)
                    db.execute("ROLLBACK")
                if _disk_full(exc):
                    raise self._refused() from exc
                raise
            if self._full is not None:
                self._landed()

    def check_space(self) -> bool:
        """Whether traylm.db can be written (always, unless a write found the disk full; then
        a write of one page, the schema version as it is, tells)."""
        if self._full is None:
            return True
        try:
            with self.transaction() as db:
                version = int(db.execute("PRAGMA user_version").fetchone()[0])
                db.execute(f"PRAGMA user_version = {version}")
        except DiskFull:
            return False
        return True

    def _refused(self) -> DiskFull:
        """The error for a write refused for a full disk (under the lock); the first of a run
        is logged and told."""
        if self._full is not None:
            return DiskFull(self._full.message)
        self._full = DiskFull(self._full_message())
        self.full_since_s = time.time()
        log.error("%s", self._full.message)
        if self._on_disk_full is not None:
            self._on_disk_full(self._full)
        return DiskFull(self._full.message)

    def _landed(self) -> None:
        """A write landed after a full disk refused writes (under the lock)."""
        full_s = time.time() - (self.full_since_s or 0.0)
        self._full, self.full_since_s = None, None
        log.info("traylm.db is written again (its disk was full for %.0f s)", full_s)
        if self._on_disk_full is not None:
            self._on_disk_full(None)

    def _full_message(self) -> str:
        folder = self.path.parent
        try:
            free = f" ({shutil.disk_usage(folder).free // 1024} KiB free)"
        except OSError:
            free = ""
        return (
            f"the disk holding traylm's data folder {folder} is full{free}: traylm.db could not "
            "be written. Free space on that disk (models you no longer use: `traylm models rm "
            "MODEL`; engine environments: `traylm engines remove ENGINE`); traylm writes again "
            "as soon as there is room"
        )

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(r) for r in self._db.execute(sql, params).fetchall()]


def _disk_full(exc: BaseException) -> bool:
    """SQLite refused a write for want of space: SQLITE_FULL (extended codes included), or
    SQLITE_IOERR_SHMSIZE (the WAL index could not grow: what a full disk gives at open)."""
    raw = getattr(exc, "sqlite_errorcode", None) if isinstance(exc, sqlite3.Error) else None
    if not isinstance(raw, int):
        return False
    return raw & 0xFF == sqlite3.SQLITE_FULL or raw == sqlite3.SQLITE_IOERR_SHMSIZE


def _split_sql(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


def dumps(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), sort_keys=True)
