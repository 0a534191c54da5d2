"""An engine's processes (engines.core.procs.descendants), as the supervisor records them for the
reaper: a real tree of processes, one started from a thread that is not the main one (as an
engine's worker pools do). While an engine serves the tree is looked at every few seconds, so
the look must not read every process on the machine."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest

from engines.core.procs import descendants

TREE = """
import subprocess, sys, threading
def grandchild():
    # a process that starts one more below it
    subprocess.Popen([sys.executable, "-c",
        "import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
        "'import sys; sys.stdin.read()']); sys.stdin.read()"])
threading.Thread(target=grandchild).start()
subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"])
sys.stdin.read()
"""


@pytest.fixture
def tree() -> Iterator[psutil.Process]:
    """A leader with two children (one started from a thread) and a grandchild; each exits
    once the leader's stdin closes (they share it)."""
    leader = subprocess.Popen([sys.executable, "-c", TREE], stdin=subprocess.PIPE)
    ps = psutil.Process(leader.pid)
    deadline = time.monotonic() + 60
    while len(ps.children(recursive=True)) < 3:
        assert time.monotonic() < deadline, "the process tree did not start"
        time.sleep(0.05)
    yield ps
    family = ps.children(recursive=True)
    assert leader.stdin is not None
    leader.stdin.close()
    leader.wait(30)
    psutil.wait_procs(family, timeout=30)


def test_every_process_below_the_leader_is_found(tree: psutil.Process) -> None:
    expected = {(p.pid, p.create_time()) for p in tree.children(recursive=True)}
    found = {(p.pid, p.create_time) for p in descendants(tree.pid)}
    assert found == expected and len(found) == 3


def test_the_tree_is_read_without_scanning_every_process(tree: psutil.Process) -> None:
    expected = {p.pid for p in tree.children(recursive=True)}

    def scan_of_every_process() -> dict[int, int]:
        raise AssertionError("descendants() read the parent of every process on the machine")

    with pytest.MonkeyPatch.context() as patch:  # psutil's own scan, refused while it looks
        patch.setattr(psutil, "_ppid_map", scan_of_every_process)
        found = {p.pid for p in descendants(tree.pid)}
    assert found == expected


def test_a_process_that_is_gone_has_none() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert descendants(proc.pid) == []
