"""The `traylm` command as a user runs it (real subprocesses), with the FAKE vLLM env."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from engines.cli import run_command
from engines.config.sections import Paths
from engines.config.tomlfile import write_toml_atomic
from engines.core.procs import free_loopback_port


def traylm(
    env: dict[str, str], *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "engines", *args],
        env=env,
        text=True,
        capture_output=True,
        timeout=timeout,
        check=False,
    )


def serve_log(env: dict[str, str]) -> Path:
    """Where ``serve`` writes the daemon's output."""
    return Path(env["TRAYLM_HOME"] + "-serve.log")


def serve(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    """`traylm serve ARGS` in the background (output in ``serve_log``); returns once it wrote
    daemon.json."""
    log = serve_log(env)
    with log.open("w") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "engines", "serve", "--ollama-port", "0", *args],
            env=env,
            text=True,
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    paths = Paths.from_env(env)
    deadline = time.monotonic() + 30
    while not paths.daemon_json.exists():
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return proc


def stop_daemon(proc: subprocess.Popen[str]) -> None:
    """End a `traylm serve` as a person would (SIGTERM: it stops its engines first); SIGKILL
    only if it does not go, since a killed daemon leaves its engines running."""
    if proc.poll() is not None:
        return
    os.kill(proc.pid, signal.SIGCONT)  # a test may have stopped it
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_the_daemon_runs_on_uvloop(
    env: dict[str, str], served: tuple[subprocess.Popen[str], int]
) -> None:
    log = Path(env["TRAYLM_HOME"] + "-serve.log").read_text()
    assert "event loop: uvloop" in log, log


def test_run_command_picks_the_loop() -> None:
    async def loop_module() -> int:
        return 1 if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else 0

    assert run_command(loop_module(), fast_loop=True) == 1
    assert run_command(loop_module()) == 0


def test_without_daemon_says_how_to_start_it(env: dict[str, str]) -> None:
    out = traylm(env, "status")
    assert out.returncode == 1
    assert "daemon is not running; start it with `traylm serve`" in out.stderr


def test_profiles_and_config(env: dict[str, str]) -> None:
    out = traylm(env, "profiles")
    assert out.returncode == 0 and "qwen2.5-32b-awq-tp2" in out.stdout
    out = traylm(env, "profiles", "llama-3.3-70b-awq-tp2")
    assert 'kv_cache_dtype = "fp8"' in out.stdout and "tensor_parallel_size = 2" in out.stdout
    assert traylm(env, "config", "set", "gateway.port", "8123").returncode == 0
    assert traylm(env, "config", "get", "gateway.port").stdout.strip() == "8123"
    bad = traylm(env, "config", "set", "gateway.prot", "1")
    assert bad.returncode == 1 and "did you mean 'port'" in bad.stderr


def test_keys_add_list_remove(env: dict[str, str]) -> None:
    out = traylm(env, "keys", "add")
    assert out.returncode == 0
    key = out.stdout.splitlines()[1]
    assert key.startswith("tlm-") and len(key) > 40
    fingerprint = traylm(env, "keys", "list").stdout.strip()
    assert len(fingerprint) == 8
    config = (Path(env["TRAYLM_HOME"]) / "config" / "config.toml").read_text()
    assert key not in config  # only the digest is stored
    assert traylm(env, "keys", "remove", fingerprint).returncode == 0
    assert "no API keys" in traylm(env, "keys", "list").stdout


@pytest.mark.slow
def test_serve_overrides_are_never_written_to_config_toml(env: dict[str, str]) -> None:
    """`serve --port P --simulate-gpus 2` holds for that daemon only: a settings change made
    while it runs (`traylm keys add` and `config set`, which save the file and apply it to the
    daemon) must not write P or the simulated GPUs into config.toml."""
    config = Path(env["TRAYLM_HOME"]) / "config" / "config.toml"
    assert traylm(env, "config", "set", "gateway.max_queue", "77").returncode == 0
    port = free_loopback_port()
    proc = serve(env, "--port", str(port), "--simulate-gpus", "2")
    try:
        added = traylm(env, "keys", "add")
        assert added.returncode == 0, added.stderr
        assert "applied to the running daemon" in added.stdout
        changed = traylm(env, "config", "set", "gateway.max_concurrent", "99")
        assert "applied to the running daemon" in changed.stdout, changed.stderr
        status = json.loads(traylm(env, "status", "--json").stdout)
        assert status["url"].endswith(f":{port}") and status["api_key_required"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    saved = config.read_text()
    assert "port" not in saved and "simulate_gpus" not in saved, saved
    assert "max_queue = 77" in saved and "max_concurrent = 99" in saved
    assert "api_key_sha256" in saved
    assert traylm(env, "config", "get", "gateway.port").stdout.strip() == "8000"
    assert traylm(env, "config", "get", "gpu.simulate_gpus").stdout.strip() == "0"
    assert traylm(env, "config", "get", "gateway.max_queue").stdout.strip() == "77"


@pytest.mark.slow
def test_start_stop_status_logs(
    env: dict[str, str], served: tuple[subprocess.Popen[str], int]
) -> None:
    profiles = Path(env["TRAYLM_HOME"]) / "config" / "profiles"
    write_toml_atomic(profiles / "f.toml", {"model": "org/f", "served_name": "f", "device": "cpu"})
    out = traylm(env, "start", "f", "--wait", "--timeout", "30")
    assert out.returncode == 0, out.stderr
    assert "ready: point apps at" in out.stdout
    status = traylm(env, "status").stdout
    assert "f " in status and "ready" in status and "serves f" in status
    logs = traylm(env, "logs", "f").stdout
    assert "Starting fake server" in logs
    bad = traylm(env, "start", "nosuch")
    assert bad.returncode == 1 and "no profile named 'nosuch'" in bad.stderr
    assert traylm(env, "stop").returncode == 0  # the only engine
    assert "stopped" in traylm(env, "status").stdout


@pytest.mark.slow
def test_sigterm_stops_engines_and_cleans_up(
    env: dict[str, str], served: tuple[subprocess.Popen[str], int]
) -> None:
    proc, _ = served
    profiles = Path(env["TRAYLM_HOME"]) / "config" / "profiles"
    write_toml_atomic(
        profiles / "s.toml",
        {
            "model": "org/s",
            "served_name": "s",
            "device": "cpu",
            "env": {"FAKE_ENGINE_ARGS": "--spawn-child"},
        },
    )
    assert traylm(env, "start", "s", "--wait", "--timeout", "30").returncode == 0
    engines = json.loads(traylm(env, "status", "--json").stdout)["engines"]
    engine_pid = engines[0]["pid"]
    family = [engine_pid, *(c.pid for c in psutil.Process(engine_pid).children(recursive=True))]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    for pid in family:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    paths = Paths.from_env(env)
    assert not paths.daemon_json.exists()
    assert json.loads(paths.engine_pids_json.read_text()) == {}


@pytest.mark.slow
def test_serve_on_a_busy_port_names_the_holder(
    env: dict[str, str], served: tuple[subprocess.Popen[str], int]
) -> None:
    _, port = served
    other = dict(env, TRAYLM_HOME=env["TRAYLM_HOME"] + "-2")
    out = traylm(other, "serve", "--port", str(port))
    assert out.returncode == 1
    assert f"port {port} is held by pid {served[0].pid}" in out.stderr
    assert "gateway.port" in out.stderr


@pytest.mark.slow
def test_second_daemon_same_user_is_refused(
    env: dict[str, str], served: tuple[subprocess.Popen[str], int]
) -> None:
    out = traylm(env, "serve", "--port", str(free_loopback_port()))
    assert out.returncode == 1 and "already running" in out.stderr
