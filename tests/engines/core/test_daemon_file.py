"""daemon.json deleted while the daemon runs: the daemon writes it again, clients wait for it,
the lock names the running daemon, and a command that could not do what it was asked exits
non-zero (real `traylm` processes, the FAKE vLLM env)."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from engines.config.sections import Paths
from engines.core.procs import free_loopback_port
from tests.engines.cli.test_cli import traylm


@pytest.mark.slow
def test_deleted_daemon_json_is_written_again_and_clients_find_the_daemon(
    env: dict[str, str], served: tuple[subprocess.Popen[str], int]
) -> None:
    proc, port = served
    paths = Paths.from_env(env)
    before = json.loads(paths.daemon_json.read_text())
    paths.daemon_json.unlink()
    out = traylm(env, "status")
    assert out.returncode == 0, out.stderr
    assert f"daemon pid {proc.pid}: http://127.0.0.1:{port}/v1" in out.stdout
    assert json.loads(paths.daemon_json.read_text()) == before
    second = traylm(env, "serve", "--port", str(free_loopback_port()))
    assert second.returncode == 1
    assert f"already running (pid {proc.pid}, http://127.0.0.1:{port})" in second.stderr


@pytest.mark.slow
def test_a_daemon_that_cannot_be_reached_is_still_found_and_stopped(
    env: dict[str, str], served: tuple[subprocess.Popen[str], int]
) -> None:
    """Stopped (SIGSTOP) with its daemon.json deleted, the daemon can neither answer nor write
    the file again: a setting saved then is reported as not applied (exit 1), and `shutdown`
    finds the daemon through its lock and stops it by signal."""
    proc, port = served
    paths = Paths.from_env(env)
    os.kill(proc.pid, signal.SIGSTOP)
    paths.daemon_json.unlink()
    out = traylm(env, "config", "set", "gateway.max_queue", "5")
    assert out.returncode == 1, out.stdout
    assert "saved to" in out.stderr and "not applied to the running daemon" in out.stderr
    assert f"pid {proc.pid}, http://127.0.0.1:{port}" in out.stderr
    out = traylm(env, "shutdown")
    assert out.returncode == 0, out.stderr
    assert "daemon stopped" in out.stdout and f"pid {proc.pid}" in out.stderr
    assert proc.wait(30) == 0  # a clean stop (SIGTERM), not a kill


def test_shutdown_without_a_daemon_says_so(env: dict[str, str]) -> None:
    out = traylm(env, "shutdown")
    assert out.returncode == 0 and "not running" in out.stdout
