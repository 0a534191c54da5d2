"""Batches in the daemon's SQLite file: each batch's OpenAI Batch object (``batches``) and each
finished line's answer (``batch_lines``), written as the line finishes, so that a restarted
daemon answers only the lines still open and never one twice. Every method blocks."""

from __future__ import annotations

import json
from typing import Any

from engines.core.store import Store, dumps

OPEN_STATES = ("validating", "in_progress", "finalizing", "cancelling")


class BatchStore:
    def __init__(self, store: Store) -> None:
        """No I/O."""
        self.store = store

    def save(self, record: dict[str, Any], owner: str) -> None:
        with self.store.transaction() as db:
            db.execute(
                "INSERT INTO batches (id, owner, record_json, created_s) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(id) DO UPDATE SET record_json = excluded.record_json",
                (record["id"], owner, dumps(record), record["created_at"]),
            )

    def get(self, batch_id: str, owner: str | None = None) -> dict[str, Any] | None:
        sql, params = "SELECT record_json FROM batches WHERE id = ?", [batch_id]
        if owner is not None:
            sql, params = sql + " AND owner = ?", [batch_id, owner]
        rows = self.store.query(sql, params)
        return json.loads(rows[0]["record_json"]) if rows else None

    def owner(self, batch_id: str) -> str:
        rows = self.store.query("SELECT owner FROM batches WHERE id = ?", (batch_id,))
        return str(rows[0]["owner"]) if rows else ""

    def listed(self, owner: str | None, limit: int) -> list[dict[str, Any]]:
        sql, params = "SELECT record_json FROM batches", []
        if owner is not None:
            sql, params = sql + " WHERE owner = ?", [owner]
        rows = self.store.query(sql + " ORDER BY created_s DESC LIMIT ?", [*params, limit])
        return [json.loads(r["record_json"]) for r in rows]

    def page(self, owner: str, after: str | None, limit: int) -> list[dict[str, Any]]:
        """The owner's batches, newest first, from the one after ``after`` (OpenAI's cursor:
        the last id of the previous page; an unknown one starts at the newest)."""
        sql = "SELECT record_json FROM batches WHERE owner = ?"
        params: list[object] = [owner]
        mark = self.store.query(
            "SELECT rowid, created_s FROM batches WHERE id = ? AND owner = ?", (after, owner)
        )
        if mark:
            sql += " AND (created_s < ? OR (created_s = ? AND rowid < ?))"
            params += [mark[0]["created_s"], mark[0]["created_s"], mark[0]["rowid"]]
        sql += " ORDER BY created_s DESC, rowid DESC LIMIT ?"
        rows = self.store.query(sql, [*params, limit])
        return [json.loads(r["record_json"]) for r in rows]

    def unfinished(self) -> list[dict[str, Any]]:
        """The batches a stopped daemon left open, oldest first (the order they resume in)."""
        rows = [r for r in self.listed(None, 1_000_000) if r["status"] in OPEN_STATES]
        return rows[::-1]

    def finish_line(self, batch_id: str, line: int, ok: bool, result: dict[str, Any]) -> bool:
        """Keep a line's answer; False when it was already kept (never answered twice)."""
        return self.finish_lines(batch_id, [(line, ok, result)]) == 1

    def finish_lines(self, batch_id: str, results: list[tuple[int, bool, dict[str, Any]]]) -> int:
        """Keep many lines' answers in one transaction (line, ok, result); how many were new
        (one already kept stays as it was)."""
        with self.store.transaction() as db:
            before = db.total_changes
            db.executemany(
                "INSERT OR IGNORE INTO batch_lines (batch_id, line, ok, result_json) "
                "VALUES (?, ?, ?, ?)",
                [(batch_id, line, int(ok), dumps(result)) for line, ok, result in results],
            )
            return int(db.total_changes - before)

    def finished_lines(self, batch_id: str) -> dict[int, tuple[bool, dict[str, Any]]]:
        rows = self.store.query(
            "SELECT line, ok, result_json FROM batch_lines WHERE batch_id = ? ORDER BY line",
            (batch_id,),
        )
        return {r["line"]: (bool(r["ok"]), json.loads(r["result_json"])) for r in rows}
