"""The suite's guard against a test leaving a process running into the next tests
(tests/conftest.py): what a test started and did not end is found, killed and named."""

from __future__ import annotations

import subprocess
import sys
import time

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


def test_a_grandchild_whose_parent_was_killed_is_still_found() -> None:
    """A daemon killed with SIGKILL leaves its engines to init: no child of the test any more,
    but seen under it while the test ran."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(60)  # orphan'], start_new_session=True); time.sleep(60)",
        ]
    )
    me = psutil.Process()
    while len([p for p in me.children(recursive=True) if p.pid not in before]) < 2:
        time.sleep(0.05)  # the grandchild is up
    seen = me.children(recursive=True)
    parent.kill()
    parent.wait()
    [orphan] = [p for p in seen if p.pid != parent.pid and p.pid not in before]
    assert orphan.pid not in {p.pid for p in me.children(recursive=True)}  # re-parented
    left = kill_leftovers(before, 0.5, seen)
    assert len(left) == 1 and f"pid {orphan.pid}" in left[0] and "orphan" in left[0]
    psutil.wait_procs([orphan], timeout=10)
    assert not orphan.is_running()
