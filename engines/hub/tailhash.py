"""Hash a file WHILE huggingface_hub downloads it, so verification costs almost nothing after.

huggingface_hub writes each download to ``blobs/<etag>.<random>.incomplete`` by appending, then
renames it to ``blobs/<etag>``. A ``TailHasher`` thread opens that temporary file and feeds
sha256 with the bytes as they land (from the page cache). Its digest is only used to CONFIRM a
match, and only when it read exactly the final blob (same inode, full size, never truncated
under it); any doubt (a second temporary file, a truncation after an ignored Range request, a
file that was already cached, a rewind reported through the progress bar) leaves ``digest``
None and the file is hashed again in full.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

CHUNK_BYTES = 8 << 20
POLL_S = 0.02


class TailHasher(threading.Thread):
    def __init__(self, blobs_dir: Path, etag: str, size_bytes: int) -> None:
        super().__init__(name=f"tailhash-{etag[:8]}", daemon=True)
        self._blobs = blobs_dir
        self._etag = etag
        self._size = size_bytes
        self._before = self._temp_files()
        self._complete = threading.Event()
        self._stop_now = threading.Event()
        self._invalid = False
        self._digest: str | None = None
        self.inode: int | None = None

    @property
    def digest(self) -> str | None:
        return None if self._invalid else self._digest

    def _temp_files(self) -> set[Path]:
        return (
            set(self._blobs.glob(f"{self._etag}.*.incomplete")) if self._blobs.is_dir() else set()
        )

    def finish(self) -> None:
        """The download returned: read what is left, then stop."""
        self._complete.set()
        self.join(timeout=600)

    def abort(self) -> None:
        self._stop_now.set()
        self._complete.set()

    def invalidate(self) -> None:
        """huggingface_hub rewound the file (a server ignored a Range request and the file was
        truncated and written again): bytes already hashed may no longer be the file's."""
        self._invalid = True
        self.abort()

    def run(self) -> None:
        path = self._find()
        if path is None:
            return
        try:
            with path.open("rb", buffering=0) as fh:
                self._hash(fh)
        except OSError:
            self._digest = None

    def _find(self) -> Path | None:
        while not self._stop_now.is_set():
            new = self._temp_files() - self._before
            if len(new) == 1:
                return new.pop()
            if len(new) > 1 or self._complete.is_set():
                return None  # ambiguous, or nothing was downloaded (already cached)
            time.sleep(POLL_S)
        return None

    def _hash(self, fh: object) -> None:
        import io

        assert isinstance(fh, io.FileIO)
        digest = hashlib.sha256()
        buf = bytearray(CHUNK_BYTES)
        view = memoryview(buf)
        pos = 0
        while pos < self._size and not self._stop_now.is_set():
            n = fh.readinto(view[: min(CHUNK_BYTES, self._size - pos)])
            if n:
                digest.update(view[:n])
                pos += n
                continue
            if os.fstat(fh.fileno()).st_size < pos:
                return  # truncated under us (a restart from byte 0): not trustworthy
            if self._complete.is_set():
                break
            time.sleep(POLL_S)
        st = os.fstat(fh.fileno())
        if pos == self._size and st.st_size == self._size:
            self._digest = digest.hexdigest()
            self.inode = st.st_ino
