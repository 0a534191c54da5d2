"""The suite's guard against a test leaving a process running into the next tests
(tests/conftest.py): what a test started and did not end is found, killed and named."""

from __future__ import annotations

import subprocess
import sys

import psutil

from tests.conftest import kill_leftovers


def test_a_process_left_running_is_killed_and_named() -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    quick = subprocess.Popen([sys.executable, "-c", "pass"])
    leaked = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)  # leaked"])
    quick.wait()
    left = kill_leftovers(before, grace_s=0.5)
    assert len(left) == 1 and f"pid {leaked.pid}" in left[0] and "leaked" in left[0]
    assert leaked.wait(10) != 0  # it was killed
    assert kill_leftovers(before, grace_s=0.1) == []
