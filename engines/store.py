"""The daemon's one SQLite file (WAL): chats, usage log, telemetry history, downloads, benchmarks.

Schema changes are numbered migrations applied in order inside a transaction; the applied number
is ``PRAGMA user_version``. A migration is never edited once it has landed: add a new one.
Every call is blocking: the daemon calls the store through ``asyncio.to_thread``.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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
)


class Store:
    """Thread-safe access to traylm.db: one connection, serialised by a lock."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None

    def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=10)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
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
    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError("Store.open() was not called")
        return self._conn

    def _migrate(self) -> None:
        with self._lock:
            current = int(self._db.execute("PRAGMA user_version").fetchone()[0])
            for number, sql in enumerate(MIGRATIONS[current:], start=current + 1):
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    for statement in _split_sql(sql):
                        self._db.execute(statement)
                    self._db.execute(f"PRAGMA user_version = {number}")
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction: all of it lands, or none of it (also on kill -9)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(r) for r in self._db.execute(sql, params).fetchall()]


def _split_sql(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


def dumps(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), sort_keys=True)
