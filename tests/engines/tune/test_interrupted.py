"""A daemon SIGKILLed mid-tune (real processes, FAKE engine): at its next start the engine the
tune had stopped is started again, and `traylm status` and GET /api/tune say the tune was
interrupted."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest

from engines.config.sections import Paths
from engines.config.tomlfile import write_toml_atomic
from engines.core.procs import free_loopback_port
from tests.engines.cli.test_cli import serve, stop_daemon, traylm

pytestmark = pytest.mark.slow


def api(paths: Paths, path: str) -> Any:
    info = json.loads(paths.daemon_json.read_text())
    req = urllib.request.Request(
        info["url"] + path, headers={"Authorization": f"Bearer {info['token']}"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def until(check: Any, what: str, timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (got := check()):
        assert time.monotonic() < deadline, what
        time.sleep(0.1)
    return got


def engine_state(paths: Paths, name: str) -> str:
    """The engine's state ("" for none, or while the daemon does not answer yet)."""
    try:
        rows = api(paths, "/api/engines")
    except (OSError, ValueError):  # a killed daemon's daemon.json, until the new one's
        return ""
    rows = rows if isinstance(rows, list) else rows.get("engines", [])
    return next((str(e["state"]) for e in rows if e["engine_id"] == name), "")


def test_a_daemon_killed_mid_tune_starts_what_ran_before_and_says_so(
    env: dict[str, str], tmp_path: Path
) -> None:
    paths = Paths.from_env(env)
    write_toml_atomic(
        paths.profiles_dir / "chat.toml",
        {
            "model": "org/chat",
            "served_name": "chat",
            "device": "cpu",
            "env": {"FAKE_ENGINE_ARGS": "--token-delay 0.05"},
        },
    )
    port = str(free_loopback_port())
    daemon = serve(env, "--port", port)
    tune: subprocess.Popen[str] | None = None
    try:
        out = traylm(env, "start", "chat", "--wait", "--timeout", "30")
        assert out.returncode == 0, out.stderr
        tune = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "engines",
                "tune",
                "chat",
                "--only",
                "max-num-seqs-1",
                "--requests",
                "200",
                "--concurrency",
                "2",
            ],
            env=env,
            text=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        until(lambda: engine_state(paths, "tune-chat") == "ready", "no candidate got ready")
        assert engine_state(paths, "chat") == "stopped"
        engines = psutil.Process(daemon.pid).children(recursive=True)
        daemon.send_signal(signal.SIGKILL)
        daemon.wait(10)
        for p in engines:  # (the reaper's job too, at the next start)
            if p.is_running():
                p.kill()
        tune.kill()
        tune.wait(10)
        daemon = serve(env, "--port", port)
        until(lambda: engine_state(paths, "chat") == "ready", "chat was not started again")
        job = api(paths, "/api/tune")["job"]
        assert job["state"] == "interrupted" and job["profile"] == "chat", job
        assert "started again: chat" in job["detail"], job
        status = traylm(env, "status").stdout
        assert "interrupted" in status and "started again: chat" in status, status
        assert engine_state(paths, "tune-chat") in ("", "stopped")
    finally:
        if tune is not None and tune.poll() is None:
            tune.kill()
        stop_daemon(daemon)
