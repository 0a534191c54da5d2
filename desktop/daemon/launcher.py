"""Start the daemon detached (``traylm serve`` in its own session) and wait until it answers.

The daemon must outlive the tray app, so it runs in a new session with no terminal, its output
appended to ``logs/daemon-launch.log`` (the daemon keeps its real log in ``logs/daemon.log``).
A reaper thread collects its exit status whenever it ends, so it never lingers as a zombie.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from engines.client import DaemonClient
from engines.config.sections import Paths
from engines.errors import DaemonUnavailable

LAUNCH_LOG = "daemon-launch.log"


class SpawnFailed(DaemonUnavailable):
    """The daemon this app started exited or did not answer; the message has its output."""

    code = "daemon_spawn_failed"


def serve_argv(serve_args: Sequence[str] = ()) -> list[str]:
    """``traylm serve`` with this interpreter (the tray app and the daemon share one install),
    with the flags a restarted daemon was started with."""
    return [sys.executable, "-m", "engines", "serve", *serve_args]


class SpawnedDaemon:
    """A daemon process this app started. Owns no resources once it has exited."""

    def __init__(self, proc: subprocess.Popen[bytes], log_path: Path, offset: int) -> None:
        self._proc = proc
        self.pid = proc.pid
        self.log_path = log_path
        self._offset = offset
        threading.Thread(target=proc.wait, name=f"reap-daemon-{proc.pid}", daemon=True).start()

    def exit_code(self) -> int | None:
        return self._proc.poll()

    def terminate(self) -> None:
        """SIGTERM, which the daemon takes as a stop (its engines first), if it still runs."""
        if self._proc.poll() is None:
            self._proc.terminate()

    def output_tail(self, lines: int = 8) -> str:
        try:
            with self.log_path.open("rb") as fh:
                fh.seek(self._offset)
                text = fh.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])


def spawn_daemon(paths: Paths, serve_args: Sequence[str] = ()) -> SpawnedDaemon:
    """Start ``traylm serve [serve_args]`` detached. Blocking (fork/exec): call it from a
    thread."""
    paths.logs_dir.mkdir(parents=True, exist_ok=True)
    log_path = paths.logs_dir / LAUNCH_LOG
    with log_path.open("ab") as log:
        offset = log.tell()
        log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} started by the tray app\n".encode())
        log.flush()
        proc = subprocess.Popen(
            serve_argv(serve_args),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            env=dict(os.environ),
        )
    return SpawnedDaemon(proc, log_path, offset)


async def wait_until_serving(
    paths: Paths, spawned: SpawnedDaemon, timeout_s: float = 30.0
) -> DaemonClient:
    """Connect to the daemon just spawned; raises DaemonUnavailable with its output if it
    exits first or does not answer within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await DaemonClient.connect(paths, timeout_s=10)
        except DaemonUnavailable:
            code = spawned.exit_code()
            if code is not None:
                tail = spawned.output_tail()
                raise SpawnFailed(
                    f"`traylm serve` exited with code {code}"
                    + (f":\n{tail}" if tail else "")
                    + f"\n(full output: {spawned.log_path})"
                ) from None
            if time.monotonic() > deadline:
                raise SpawnFailed(
                    f"`traylm serve` (pid {spawned.pid}) did not answer within {timeout_s:.0f} s; "
                    f"see {paths.logs_dir / 'daemon.log'}"
                ) from None
            await asyncio.sleep(0.1)
