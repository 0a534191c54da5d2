"""Every `traylm` command exits quietly on a closed stdout (`traylm status | head -1`): no
BrokenPipeError traceback, the shell's 141. The pipe's reader is gone before the command
writes, as `head` is once it has its line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize(
    ("args", "codes"),
    [
        (["config", "get", "gateway.port"], {141}),
        (["engines", "list"], {141}),
        (["--help"], {0, 141}),  # argparse drops a help it cannot write, and exits 0
    ],
)
def test_a_closed_pipe_ends_the_command_quietly(
    args: list[str], codes: set[int], tmp_path: Path
) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has gone
    env = {**os.environ, "TRAYLM_HOME": str(tmp_path / "home")}
    proc = subprocess.run(
        [sys.executable, "-m", "engines", *args],
        stdout=write_end,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
        timeout=60,
        check=False,
    )
    os.close(write_end)
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
    assert proc.returncode in codes, proc.stderr
