"""daemon.json's pid is checked with the kernel, not psutil (engines/client/daemon_info.py): a
running process is alive, a zombie (exited, not yet reaped by its parent) and a reaped one are
not."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from engines.client.daemon_info import pid_alive


def wait_for_state(pid: int, state: bytes) -> None:
    """Until /proc says the process is in ``state`` (it has exited: Z), at most 10 s."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        if stat.rpartition(b")")[2].split()[0] == state:
            return
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} never reached state {state!r}")


def test_a_running_process_is_alive_and_a_zombie_or_a_reaped_one_is_not() -> None:
    assert pid_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        wait_for_state(child.pid, b"Z")  # exited; this test, its parent, has not reaped it
        assert not pid_alive(child.pid)
    finally:
        child.wait()
    assert not pid_alive(child.pid)


def test_no_pid_names_a_process_group() -> None:
    assert not pid_alive(0)
    assert not pid_alive(-os.getpgrp())
