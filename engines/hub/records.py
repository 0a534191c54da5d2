"""The hub's rows in traylm.db: downloads (queue and history), verified models, trust consent.

A model is "verified" only through ``mark_checked(..., ok=True)``, which the daemon calls after
the worker hashed every file. Every method blocks: call it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any

from engines.core.store import Store, dumps
from engines.hub.verify import ExpectedFile

ACTIVE_STATES = ("queued", "downloading", "verifying", "retrying")


@dataclass(frozen=True)
class CheckRecord:
    repo_id: str
    commit_sha: str
    state: str  # verified | corrupt
    checked_s: float
    files: tuple[ExpectedFile, ...]


class HubRecords:
    def __init__(self, store: Store) -> None:
        self._store = store

    # ----------------------------------------------------------------- downloads

    def save_download(
        self, *, id: str, repo_id: str, revision: str, state: str, data: dict[str, Any]
    ) -> None:
        now = time.time()
        with self._store.transaction() as db:
            db.execute(
                "INSERT INTO downloads (id, repo_id, revision, state, data_json, created_s,"
                " updated_s) VALUES (?,?,?,?,?,?,?) ON CONFLICT(id) DO UPDATE SET"
                " state=excluded.state, data_json=excluded.data_json, updated_s=excluded.updated_s",
                (id, repo_id, revision, state, dumps(data), now, now),
            )

    def load_downloads(self, limit: int = 100) -> list[dict[str, Any]]:
        rows = self._store.query(
            "SELECT * FROM downloads ORDER BY created_s DESC LIMIT ?", (limit,)
        )
        for row in rows:
            row["data"] = json.loads(row.pop("data_json") or "{}")
        return rows

    def interrupt_active(self, message: str) -> int:
        """Downloads that were running when the daemon stopped become paused."""
        with self._store.transaction() as db:
            marks = ",".join("?" for _ in ACTIVE_STATES)
            rows = db.execute(
                f"SELECT id, data_json FROM downloads WHERE state IN ({marks})",  # noqa: S608
                ACTIVE_STATES,
            ).fetchall()
            for row in rows:
                data = json.loads(row["data_json"] or "{}")
                data["message"] = message
                db.execute(
                    "UPDATE downloads SET state='paused', data_json=?, updated_s=? WHERE id=?",
                    (dumps(data), time.time(), row["id"]),
                )
        return len(rows)

    # ----------------------------------------------------------------- verification

    def mark_checked(
        self, repo_id: str, commit_sha: str, files: tuple[ExpectedFile, ...], *, ok: bool
    ) -> None:
        with self._store.transaction() as db:
            db.execute(
                "INSERT INTO hub_models (repo_id, commit_sha, state, checked_s, files_json)"
                " VALUES (?,?,?,?,?) ON CONFLICT(repo_id, commit_sha) DO UPDATE SET"
                " state=excluded.state, checked_s=excluded.checked_s,"
                " files_json=excluded.files_json",
                (
                    repo_id,
                    commit_sha,
                    "verified" if ok else "corrupt",
                    time.time(),
                    dumps([asdict(f) for f in files]),
                ),
            )

    def checks(self) -> dict[tuple[str, str], CheckRecord]:
        out: dict[tuple[str, str], CheckRecord] = {}
        for row in self._store.query("SELECT * FROM hub_models"):
            files = tuple(ExpectedFile(**f) for f in json.loads(row["files_json"]))
            key = (row["repo_id"], row["commit_sha"])
            out[key] = CheckRecord(
                row["repo_id"], row["commit_sha"], row["state"], row["checked_s"], files
            )
        return out

    def forget(self, repo_id: str, commit_sha: str | None = None) -> None:
        with self._store.transaction() as db:
            if commit_sha:
                db.execute(
                    "DELETE FROM hub_models WHERE repo_id=? AND commit_sha=?",
                    (repo_id, commit_sha),
                )
            else:
                db.execute("DELETE FROM hub_models WHERE repo_id=?", (repo_id,))

    # ----------------------------------------------------------------- trust_remote_code

    def set_trust(self, repo_id: str, trusted: bool) -> None:
        with self._store.transaction() as db:
            if trusted:
                db.execute(
                    "INSERT OR REPLACE INTO hub_trust (repo_id, granted_s) VALUES (?,?)",
                    (repo_id, time.time()),
                )
            else:
                db.execute("DELETE FROM hub_trust WHERE repo_id=?", (repo_id,))

    def trusted(self) -> set[str]:
        return {r["repo_id"] for r in self._store.query("SELECT repo_id FROM hub_trust")}
