"""Hashing and the check that makes a model "ready": every file present, every hash the Hub's.

LFS files (the weights) are checked by sha256, which the Hub lists for them; small git files
(config, tokenizer) by their git blob sha1, the only hash the Hub lists for those. Files are read
in fixed 8 MiB chunks into one buffer, so memory stays flat whatever the file size.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from engines.hub.names import validate_filename

CHUNK_BYTES = 8 << 20


@dataclass(frozen=True)
class ExpectedFile:
    path: str
    size_bytes: int
    sha256: str | None
    git_sha1: str

    @property
    def etag(self) -> str:
        """The blob name in the HF cache (sha256 for LFS files, git sha1 otherwise)."""
        return self.sha256 or self.git_sha1


@dataclass(frozen=True)
class FileCheck:
    path: str
    ok: bool
    problem: str  # "" | missing | size | hash


def hash_file(
    path: Path, *, git_blob: bool = False, progress: Callable[[int], None] | None = None
) -> str:
    """sha256 of the file, or its git blob sha1 when ``git_blob``."""
    size = path.stat().st_size
    digest = hashlib.sha1(b"blob %d\0" % size) if git_blob else hashlib.sha256()  # noqa: S324
    buf = bytearray(CHUNK_BYTES)
    view = memoryview(buf)
    with path.open("rb", buffering=0) as fh:
        while True:
            n = fh.readinto(buf)
            if not n:
                break
            digest.update(view[:n])
            if progress is not None:
                progress(n)
    return digest.hexdigest()


def check_file(
    snapshot: Path, expected: ExpectedFile, progress: Callable[[int], None] | None = None
) -> FileCheck:
    local = snapshot / validate_filename(expected.path)
    try:
        size = local.stat().st_size
    except OSError:
        return FileCheck(expected.path, False, "missing")
    if size != expected.size_bytes:
        return FileCheck(expected.path, False, f"size {size} != {expected.size_bytes}")
    if expected.sha256:
        ok = hash_file(local, progress=progress) == expected.sha256
    else:
        ok = hash_file(local, git_blob=True, progress=progress) == expected.git_sha1
    return FileCheck(expected.path, ok, "" if ok else "hash differs from the Hub's")


def check_snapshot(
    snapshot: Path, files: Iterable[ExpectedFile], progress: Callable[[int], None] | None = None
) -> list[FileCheck]:
    return [check_file(snapshot, f, progress) for f in files]


def drop_file(snapshot: Path, expected: ExpectedFile) -> None:
    """Remove a bad file (its snapshot link and its blob) so a retry fetches it again."""
    link = snapshot / validate_filename(expected.path)
    blob = Path(os.path.realpath(link)) if link.is_symlink() else None
    link.unlink(missing_ok=True)
    if blob is not None and blob.name == expected.etag:
        blob.unlink(missing_ok=True)
