"""The download worker: a child process that fetches one model revision with huggingface_hub.

Run as ``python -m engines.hub.worker``; the job (JSON, token included, so it never shows in
``ps``) arrives on stdin, and one JSON object per line goes to stdout:

    {"type": "file_start", "path", "size_bytes"}
    {"type": "progress", "done_bytes", "current_file"}
    {"type": "file_done", "path", "done_bytes"}
    {"type": "verify", "path", "size_bytes", "hashed_while_downloading"}
    {"type": "verify_progress", "path", "hashed_bytes"}
    {"type": "error", "code", "retryable", "message", "files"}
    {"type": "done", "snapshot_path", "maxrss_kib"}

Cancel is a kill of this process (there is no cancel API in huggingface_hub). The worker exits
by itself when its parent goes away (stdin closes). It never marks anything ready: the daemon
does, after the ``done`` line, which comes only once every file's hash matched.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from engines.hub.names import cache_folder_name, validate_commit, validate_revision
from engines.hub.tailhash import TailHasher
from engines.hub.verify import ExpectedFile, check_file, drop_file

PROGRESS_INTERVAL_S = 0.25
TAIL_HASH_MIN_BYTES = 16 << 20  # smaller files are hashed after, in milliseconds
_out_lock = threading.Lock()


def emit(kind: str, **data: Any) -> None:
    line = json.dumps({"type": kind, **data}, separators=(",", ":"))
    with _out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class Progress:
    """Bytes of finished files plus bytes of files in flight, reported at most every
    PROGRESS_INTERVAL_S (and once when a file finishes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._finished = 0
        self._in_flight: dict[str, int] = {}
        self._last_s = 0.0
        self.on_rewind: Callable[[str], None] | None = None

    def add(self, path: str, n: int) -> None:
        if n < 0 and self.on_rewind is not None:
            self.on_rewind(path)  # huggingface_hub truncated the file to start it again
        with self._lock:
            self._in_flight[path] = self._in_flight.get(path, 0) + n
            now = time.monotonic()
            if now - self._last_s < PROGRESS_INTERVAL_S:
                return
            self._last_s = now
            done = self._finished + sum(self._in_flight.values())
        emit("progress", done_bytes=done, current_file=path)

    def finish(self, path: str, size_bytes: int) -> None:
        with self._lock:
            self._in_flight.pop(path, None)
            self._finished += size_bytes
            done = self._finished + sum(self._in_flight.values())
        emit("file_done", path=path, done_bytes=done)

    def bar_class(self, path: str) -> type:
        """A tqdm look-alike bound to one file (huggingface_hub instantiates it per download)."""
        progress = self

        class Bar:
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                if kwargs.get("initial"):
                    progress.add(path, int(kwargs["initial"]))

            def __enter__(self) -> Bar:
                return self

            def __exit__(self, *exc: object) -> None:
                pass

            def update(self, n: float | None = 1) -> None:
                progress.add(path, int(n or 0))

            def update_transfer(self, n: float | None = 1) -> None:
                """Network bytes (Xet downloads): ignored, ``update`` counts bytes on disk.
                Having this method makes huggingface_hub feed one bar, not two."""

            def set_transfer_postfix_str(self, *args: Any, **kwargs: Any) -> None:
                pass

            def close(self) -> None:
                pass

            def set_postfix_str(self, *args: Any, **kwargs: Any) -> None:
                pass

        return Bar


def _watch_parent() -> None:
    """stdin closes when the daemon dies: stop at once rather than download for nobody."""
    try:
        while sys.stdin.buffer.read(65536):
            pass
    finally:
        os._exit(3)


def classify(exc: BaseException) -> tuple[str, bool]:
    """(error code, retryable) for an exception raised by huggingface_hub or the OS."""
    import httpx2
    from huggingface_hub import errors as hf

    if isinstance(exc, hf.GatedRepoError):
        return "gated", False
    if isinstance(exc, hf.RevisionNotFoundError):
        return "revision_not_found", False
    if isinstance(exc, hf.RepositoryNotFoundError | hf.RemoteEntryNotFoundError):
        return "not_found", False
    if isinstance(exc, hf.HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else 0
        if status in (401, 403):
            return "forbidden", False
        return ("server", True) if status >= 500 or status in (408, 429) else ("http", False)
    if isinstance(exc, hf.LocalEntryNotFoundError | httpx2.TransportError | TimeoutError):
        return "network", True
    if isinstance(exc, OSError):
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return "disk_full", False
        if "Consistency check failed" in str(exc):
            return "network", True  # a truncated body: the size did not match
        return "io", False
    return "internal", False


def run(job: dict[str, Any]) -> int:
    from huggingface_hub import hf_hub_download

    repo_id = job["repo_id"]
    commit = validate_commit(job["commit_sha"])
    cache_dir = Path(job["cache_dir"])
    storage = cache_dir / cache_folder_name(repo_id)
    snapshot = storage / "snapshots" / commit
    files = [ExpectedFile(**f) for f in job["files"]]
    progress = Progress()

    hashers: dict[str, TailHasher] = {}
    tail_hash = bool(job.get("hash_while_downloading", False))
    progress.on_rewind = lambda path: hashers[path].invalidate() if path in hashers else None

    def fetch(f: ExpectedFile) -> None:
        emit("file_start", path=f.path, size_bytes=f.size_bytes)
        hasher = None
        if tail_hash and f.sha256 and f.size_bytes >= TAIL_HASH_MIN_BYTES:
            hasher = hashers[f.path] = TailHasher(storage / "blobs", f.etag, f.size_bytes)
            hasher.start()
        try:
            hf_hub_download(
                repo_id,
                f.path,
                revision=commit,
                cache_dir=cache_dir,
                endpoint=job["endpoint"],
                token=job.get("token") or False,
                tqdm_class=progress.bar_class(f.path),
            )
        except BaseException:
            if hasher is not None:
                hasher.abort()
            raise
        if hasher is not None:
            hasher.finish()
        progress.finish(f.path, f.size_bytes)

    try:
        with ThreadPoolExecutor(max_workers=int(job.get("parallel_files", 4))) as pool:
            for future in [pool.submit(fetch, f) for f in files]:
                future.result()
        bad = []
        for f in files:
            confirmed = _confirmed_while_downloading(snapshot, f, hashers.get(f.path))
            emit("verify", path=f.path, size_bytes=f.size_bytes, hashed_while_downloading=confirmed)
            if confirmed:
                continue
            check = check_file(snapshot, f, _verify_ticker(f.path))
            if not check.ok:
                bad.append(f"{f.path} ({check.problem})")
                drop_file(snapshot, f)
        if bad:
            emit(
                "error",
                code="integrity",
                retryable=True,
                files=bad,
                message=f"{len(bad)} file(s) did not match the Hub's hash: {', '.join(bad[:3])}",
            )
            return 2
        _write_ref(storage, job.get("revision"), commit)
    except BaseException as exc:
        code, retryable = classify(exc)
        emit("error", code=code, retryable=retryable, message=_one_line(exc), files=[])
        return 1
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    emit("done", snapshot_path=str(snapshot), maxrss_kib=maxrss)
    return 0


def _confirmed_while_downloading(
    snapshot: Path, f: ExpectedFile, hasher: TailHasher | None
) -> bool:
    """True when the hash taken during the download matches the Hub's and it was taken over
    the very blob the snapshot points to; anything else is hashed again in full."""
    if hasher is None or hasher.digest is None or hasher.digest != f.sha256:
        return False
    try:
        st = (snapshot / f.path).stat()
    except OSError:
        return False
    return st.st_ino == hasher.inode and st.st_size == f.size_bytes


def _verify_ticker(path: str) -> Any:
    """Progress while hashing a big file, so the daemon's stall watchdog sees we are alive."""
    state = {"bytes": 0, "last_s": time.monotonic()}

    def tick(n: int) -> None:
        state["bytes"] += n
        now = time.monotonic()
        if now - state["last_s"] >= 1.0:
            state["last_s"] = now
            emit("verify_progress", path=path, hashed_bytes=state["bytes"])

    return tick


def _write_ref(storage: Path, revision: str | None, commit: str) -> None:
    """Record branch → commit like huggingface_hub does, so other tools find the snapshot."""
    revision = validate_revision(revision)
    if not revision or revision == commit:
        return
    ref = storage / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    tmp = ref.with_name(f".{ref.name}.{os.getpid()}.tmp")
    tmp.write_text(commit)
    tmp.replace(ref)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:600]


def main() -> None:
    job = json.loads(sys.stdin.readline())
    threading.Thread(target=_watch_parent, daemon=True).start()
    code = run(job)
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
