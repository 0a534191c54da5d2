"""Finding the running daemon: its daemon.json (pid, URL, control token), and whether that pid
still runs. Blocking and light (no event loop, no psutil): every client starts here, a one-shot
command as much as the desktop app."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from engines.config.paths import Paths
from engines.core import daemon_lock
from engines.errors import DaemonUnavailable

DAEMON_JSON_WAIT_S = 6.0
"""How long a client waits for a running daemon to write its deleted daemon.json again."""


@dataclass(frozen=True)
class DaemonInfo:
    """The contents of daemon.json."""

    pid: int
    url: str
    port: int
    token: str
    version: str
    started_at_s: float
    serve_args: tuple[str, ...] = ()
    """The flags `traylm serve` was given (``--simulate-gpus 2``): a restart gives them again."""

    @classmethod
    def read(cls, paths: Paths) -> DaemonInfo:
        try:
            data = json.loads(paths.daemon_json.read_text())
            info = cls(
                int(data["pid"]),
                str(data["url"]),
                int(data["port"]),
                str(data["token"]),
                str(data["version"]),
                float(data["started_at_s"]),
                tuple(str(a) for a in data.get("serve_args", ())),
            )
        except FileNotFoundError:
            running = daemon_lock.holder(paths.daemon_lock)
            if running is not None:
                raise DaemonUnavailable(
                    f"a traylm daemon is running ({running.where}) but {paths.daemon_json} is "
                    "missing; it writes the file again within seconds: retry, or stop it with "
                    f"`kill {running.pid}`"
                ) from None
            raise DaemonUnavailable(
                "the traylm daemon is not running; start it with `traylm serve` "
                "(or open the tray app with `traylm`)"
            ) from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DaemonUnavailable(
                f"{paths.daemon_json} is unreadable ({exc}); restart the daemon with `traylm serve`"
            ) from None
        if not pid_alive(info.pid):
            raise DaemonUnavailable(
                f"the traylm daemon (pid {info.pid}) is no longer running; start it with "
                "`traylm serve`"
            )
        return info


def wait_for_daemon(paths: Paths, *, wait_s: float = DAEMON_JSON_WAIT_S) -> DaemonInfo:
    """The running daemon's daemon.json. While a daemon holds the lock but its daemon.json is
    missing (deleted by hand), wait up to ``wait_s`` for the daemon to write it again."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return DaemonInfo.read(paths)
        except DaemonUnavailable:
            if daemon_lock.holder(paths.daemon_lock) is None or time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def pid_alive(pid: int) -> bool:
    """True while the process runs (a zombie, exited but not yet reaped, is not running).
    Asked of the kernel (kill with signal 0, then the state in /proc where there is one), not
    psutil, whose import would be a tenth of a one-shot command's start."""
    if pid <= 0:  # 0 and negatives name process groups, never one daemon
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it runs, as another user
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:  # no /proc here: kill's answer stands
        return True
    state = stat.rpartition(b")")[2].split()[:1]  # after "pid (name)": the state letter
    return state != [b"Z"]
