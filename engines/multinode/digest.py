"""The same model bytes on every box: one SHA-256 over a model folder's files (names, sizes
and contents), remembered per file state so that an unchanged folder is not read again."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

CHUNK_BYTES = 1 << 20
_lock = threading.Lock()
_known: dict[tuple[str, tuple[tuple[str, int, int], ...]], str] = {}


def _files(folder: Path) -> list[Path]:
    return sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )


def model_digest(folder: Path) -> str:
    """The folder's digest (blocking: run it in a thread). Hidden entries (.cache, .git) are
    left out: they differ between boxes without the model differing."""
    files = _files(folder)
    state = []
    for p in files:
        st = p.stat()  # a snapshot's files are links into the blob store: follow them
        state.append((str(p.relative_to(folder)), st.st_size, st.st_mtime_ns))
    key = (str(folder.resolve()), tuple(state))
    with _lock:
        if key in _known:
            return _known[key]
    h = hashlib.sha256()
    for p, (rel, size, _) in zip(files, state, strict=True):
        h.update(f"{rel}\0{size}\0".encode())
        with p.open("rb") as fh:
            while chunk := fh.read(CHUNK_BYTES):
                h.update(chunk)
    digest = h.hexdigest()
    with _lock:
        _known[key] = digest
    return digest
