"""Uploaded files (OpenAI's Files API, ``purpose=batch``): the bytes in a private folder under
the data folder, one file per id, the metadata in the daemon's SQLite file (table ``files``).

An upload is streamed to a temporary file next to its final place and renamed into it once it
is whole and within ``gateway.max_file_bytes``; a refused upload leaves nothing behind. A file
belongs to the caller that uploaded it (``Guard.caller``): to anyone else it does not exist.
Every method blocks (disk, SQLite): the routes call them through ``asyncio.to_thread``.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engines.core.store import Store

PURPOSES = ("batch",)


@dataclass(frozen=True)
class StoredFile:
    id: str
    owner: str
    filename: str
    purpose: str
    bytes: int
    created_s: float

    def wire(self) -> dict[str, Any]:
        """OpenAI's FileObject."""
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": int(self.created_s),
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
        }


class FileStore:
    """The files: ``folder`` holds the bytes (mode 0700), ``store`` the metadata."""

    def __init__(self, store: Store, folder: Path) -> None:
        """No I/O."""
        self.store = store
        self.folder = folder

    def new_upload(self) -> tuple[str, Path]:
        """A fresh id and the temporary path to stream its bytes to."""
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        file_id = "file-" + secrets.token_hex(12)
        return file_id, self.folder / f".{file_id}.part"

    def keep(
        self, file_id: str, part: Path, *, owner: str, filename: str, purpose: str
    ) -> StoredFile:
        """Move a whole upload into place and record it."""
        stored = StoredFile(
            file_id, owner, filename[:255], purpose, part.stat().st_size, time.time()
        )
        part.replace(self.path(file_id))
        with self.store.transaction() as db:
            db.execute(
                "INSERT INTO files (id, owner, filename, purpose, bytes, created_s) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (file_id, owner, stored.filename, purpose, stored.bytes, stored.created_s),
            )
        return stored

    def path(self, file_id: str) -> Path:
        return self.folder / file_id

    def get(self, file_id: str, owner: str) -> StoredFile | None:
        rows = self.store.query("SELECT * FROM files WHERE id = ? AND owner = ?", (file_id, owner))
        return StoredFile(**rows[0]) if rows else None

    def list(self, owner: str, purpose: str | None = None) -> list[StoredFile]:
        sql, params = "SELECT * FROM files WHERE owner = ?", [owner]
        if purpose:
            sql, params = sql + " AND purpose = ?", [owner, purpose]
        return [
            StoredFile(**row) for row in self.store.query(sql + " ORDER BY created_s DESC", params)
        ]

    def delete(self, file_id: str, owner: str) -> bool:
        with self.store.transaction() as db:
            gone = db.execute(
                "DELETE FROM files WHERE id = ? AND owner = ?", (file_id, owner)
            ).rowcount
        if gone:
            self.path(file_id).unlink(missing_ok=True)
        return bool(gone)
