"""SIGHUP to a real `traylm serve` (its terminal or ssh session closed): the same clean stop as
SIGTERM, said in the log; under `nohup` the daemon goes on serving.

The daemon starts through a small exec wrapper that sets SIGHUP's disposition first, so the
test does not depend on how pytest itself was started (under nohup it would inherit SIG_IGN).
"""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time

import openai
import psutil
import pytest

from engines.config.sections import Paths
from engines.config.tomlfile import write_toml_atomic
from engines.core.procs import free_loopback_port
from tests.engines.cli.test_cli import serve_log, stop_daemon, traylm


def serve_with_hangup(env: dict[str, str], port: int, hangup: str) -> subprocess.Popen[str]:
    """`traylm serve --port PORT` with SIGHUP set to ``hangup`` ("SIG_DFL" as in a terminal,
    "SIG_IGN" as under nohup); returns once it wrote daemon.json."""
    start = (
        "import os, signal, sys; "
        f"signal.signal(signal.SIGHUP, signal.{hangup}); "
        "os.execv(sys.executable, "
        f"[sys.executable, '-m', 'engines', 'serve', '--port', '{port}'])"
    )
    with serve_log(env).open("w") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-c", start], env=env, text=True, stdout=fh, stderr=subprocess.STDOUT
        )
    daemon_json = Paths.from_env(env).daemon_json
    deadline = time.monotonic() + 30
    while not daemon_json.exists():
        assert proc.poll() is None, serve_log(env).read_text()
        assert time.monotonic() < deadline, "the daemon did not write daemon.json"
        time.sleep(0.05)
    return proc


def engine_family(env: dict[str, str]) -> list[int]:
    """The running engine's leader and every process it started."""
    engines = json.loads(traylm(env, "status", "--json").stdout)["engines"]
    leader = int(engines[0]["pid"])
    return [leader, *(c.pid for c in psutil.Process(leader).children(recursive=True))]


def gone(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.slow
def test_sighup_mid_stream_stops_cleanly_and_says_why(env: dict[str, str]) -> None:
    """The client streaming at that moment gets an error event that says traylm stopped (not a
    clean end: a cut reply is not a finished one, and the chat window keeps it as
    interrupted); the engine and its child are stopped; daemon.json is removed; exit 0."""
    port = free_loopback_port()
    proc = serve_with_hangup(env, port, "SIG_DFL")
    family: list[int] = []
    try:
        profile = {
            "model": "org/h",
            "served_name": "h",
            "device": "cpu",
            "env": {"FAKE_ENGINE_ARGS": "--spawn-child --token-delay 0.05"},
        }
        write_toml_atomic(Paths.from_env(env).profiles_dir / "h.toml", profile)
        started = traylm(env, "start", "h", "--wait", "--timeout", "60")
        assert started.returncode == 0, started.stderr
        family = engine_family(env)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        stream = client.chat.completions.create(
            model="h",
            messages=[{"role": "user", "content": "go on"}],
            max_tokens=100_000,
            stream=True,
        )
        received = 0
        with pytest.raises(openai.APIError) as ended:
            for _ in stream:
                received += 1
                if received == 3:
                    proc.send_signal(signal.SIGHUP)
        assert "traylm is stopping" in str(ended.value)
        assert ended.value.type == "traylm_stopping"
        assert proc.wait(30) == 0  # a clean stop, not death by the signal
    finally:
        stop_daemon(proc)
        left = [pid for pid in family if not gone(pid)]
        for pid in left:  # what a daemon killed by the signal leaves behind
            psutil.Process(pid).kill()
    assert not left, f"engine processes left running: {left}"
    log = serve_log(env).read_text()
    assert "stop requested: SIGHUP" in log, log
    assert "Traceback" not in log, log
    paths = Paths.from_env(env)
    assert not paths.daemon_json.exists()
    assert json.loads(paths.engine_pids_json.read_text()) == {}


def test_under_nohup_sighup_is_ignored(env: dict[str, str]) -> None:
    """Started with SIGHUP ignored (`nohup traylm serve`), the daemon keeps ignoring it: it
    answers after the SIGHUP, and what stops it is the SIGTERM after."""
    proc = serve_with_hangup(env, free_loopback_port(), "SIG_IGN")
    try:
        proc.send_signal(signal.SIGHUP)
        status = traylm(env, "status")
        assert status.returncode == 0, status.stderr
        proc.send_signal(signal.SIGTERM)  # handled in order after the SIGHUP, were it handled
        assert proc.wait(30) == 0
    finally:
        stop_daemon(proc)
    log = serve_log(env).read_text()
    assert "SIGHUP is ignored (nohup)" in log, log
    assert "stop requested: SIGTERM" in log and "stop requested: SIGHUP" not in log, log


def test_the_terminal_closing_stops_the_daemon_cleanly(env: dict[str, str]) -> None:
    """A real hang-up: `traylm serve` runs in a pseudo-terminal of its own (session leader, the
    terminal its controlling one), and the terminal closes. The kernel sends SIGHUP; the
    daemon stops cleanly although its stderr is now a dead terminal, and says why in its
    log file."""
    master, slave = pty.openpty()
    start = (
        "import fcntl, os, signal, sys, termios; "
        "signal.signal(signal.SIGHUP, signal.SIG_DFL); "
        "os.setsid(); fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
        "os.execv(sys.executable, "
        f"[sys.executable, '-m', 'engines', 'serve', '--port', '{free_loopback_port()}'])"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", start], env=env, stdin=slave, stdout=slave, stderr=slave
    )
    os.close(slave)
    try:
        shown = b""
        deadline = time.monotonic() + 30
        while b"serving on" not in shown:
            assert proc.poll() is None and time.monotonic() < deadline, shown.decode()
            if select.select([master], [], [], 0.5)[0]:
                shown += os.read(master, 65536)
        os.close(master)  # the terminal closes (ssh session gone, window closed)
        master = -1
        assert proc.wait(30) == 0
    finally:
        if master >= 0:
            os.close(master)
        stop_daemon(proc)
    paths = Paths.from_env(env)
    log = (paths.logs_dir / "daemon.log").read_text()
    assert "stop requested: SIGHUP" in log, log
    assert not paths.daemon_json.exists()
