"""The daemon's lock (one daemon per user) and how to find the daemon that holds it when
daemon.json is gone: the holder's pid comes from the kernel's lock table (/proc/locks), its port
from the note the daemon keeps in the lock file. The control token is only in daemon.json
(0600); the lock file never holds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO

PROC_LOCKS = Path("/proc/locks")


@dataclass(frozen=True)
class LockHolder:
    """The running daemon as its lock tells it."""

    pid: int
    port: int | None

    @property
    def where(self) -> str:
        port = f", http://127.0.0.1:{self.port}" if self.port else ""
        return f"pid {self.pid}{port}"


def take(path: Path) -> IO[str] | None:
    """Hold the lock (the open file keeps it), or None when another daemon holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fh = path.open("a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        return None
    note(fh, port=None)
    return fh


def note(fh: IO[str], *, port: int | None) -> None:
    """Write this daemon's pid and port into the lock file it holds."""
    fh.seek(0)
    fh.truncate()
    fh.write(json.dumps({"pid": os.getpid(), "port": port}))
    fh.flush()


def holder(path: Path) -> LockHolder | None:
    """The daemon holding the lock at ``path``, or None when no process holds it."""
    try:
        st = path.stat()
        text = path.read_text()
    except OSError:
        return None
    pid = _flock_holder(st.st_dev, st.st_ino)
    if pid is None:
        return None
    port = None
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        data = json.loads(text)
        port = int(data["port"]) if data.get("port") and data.get("pid") == pid else None
    return LockHolder(pid, port)


def _flock_holder(dev: int, inode: int) -> int | None:
    """The pid holding a flock on the file (dev, inode), from /proc/locks (Linux)."""
    try:
        lines = PROC_LOCKS.read_text().splitlines()
    except OSError:
        return None
    wanted = f"{os.major(dev):02x}:{os.minor(dev):02x}:{inode}"
    for line in lines:
        fields = line.split()
        if "->" in fields or len(fields) < 6 or fields[1] != "FLOCK":
            continue  # a process waiting for a lock, or a POSIX lock
        if fields[5] == wanted:
            return int(fields[4])
    return None
