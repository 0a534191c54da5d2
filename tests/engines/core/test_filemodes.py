"""Private files: traylm's folders 0700 and its files 0600, for a fresh install and for one whose
files were created before (0644 in 0755 folders), with the real `traylm` command."""

from __future__ import annotations

import json
import signal
import sqlite3
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from engines.config.sections import Paths
from engines.config.tomlfile import write_toml_atomic
from engines.core.procs import free_loopback_port
from tests.engines.cli.test_cli import traylm


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def old_install(paths: Paths) -> list[Path]:
    """Files as an older traylm left them: readable by everyone."""
    made: list[Path] = []
    for folder in (paths.config_dir, paths.profiles_dir, paths.data_dir, paths.logs_dir):
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o755)
    write_toml_atomic(paths.config_file, {"gateway": {"max_queue": 9}})
    write_toml_atomic(paths.profiles_dir / "p.toml", {"model": "org/p", "device": "cpu"})
    with sqlite3.connect(paths.db_path) as db:
        db.execute("CREATE TABLE t (x)")
    (paths.logs_dir / "daemon.log").write_text("an old log line with a prompt in it\n")
    for path in (
        paths.config_file,
        paths.profiles_dir / "p.toml",
        paths.db_path,
        paths.logs_dir / "daemon.log",
    ):
        path.chmod(0o644)
        made.append(path)
    return made


def serve_with_umask_022(env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
    paths = Paths.from_env(env)
    proc = subprocess.Popen(
        [sys.executable, "-m", "engines", "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        umask=0o022,  # the usual desktop umask: files 0644 unless traylm says otherwise
    )
    deadline = time.monotonic() + 30
    while not paths.daemon_json.exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    return proc


@pytest.mark.slow
def test_folders_0700_files_0600_and_an_old_install_is_fixed(env: dict[str, str]) -> None:
    paths = Paths.from_env(env)
    old = old_install(paths)
    port = free_loopback_port()
    proc = serve_with_umask_022(env, port)
    try:
        token = json.loads(paths.daemon_json.read_text())["token"]
        put = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/profiles/q",
            data=json.dumps({"model": "org/q", "device": "cpu"}).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            method="PUT",
        )
        with urllib.request.urlopen(put, timeout=10) as r:
            assert r.status == 200
        assert traylm(env, "config", "set", "gateway.max_queue", "5").returncode == 0
        write_toml_atomic(
            paths.profiles_dir / "f.toml", {"model": "org/f", "served_name": "f", "device": "cpu"}
        )
        started = traylm(env, "start", "f", "--wait", "--timeout", "30")
        assert started.returncode == 0, started.stderr
        assert (paths.logs_dir / "engines" / "f.log").exists()
        status = json.loads(traylm(env, "status", "--json").stdout)
        engine_pid = status["engines"][0]["pid"]
        umask = [x for x in Path(f"/proc/{engine_pid}/status").read_text().splitlines()]
        assert "Umask:\t0022" in umask  # the engine writes shared caches with the user's modes
        wal = paths.data_dir / (paths.db_path.name + "-wal")
        shm = paths.data_dir / (paths.db_path.name + "-shm")
        assert wal.exists() and shm.exists()  # WAL mode while the daemon runs
        for folder in (
            paths.config_dir,
            paths.profiles_dir,
            paths.data_dir,
            paths.state_dir,
            paths.logs_dir,
            paths.cache_dir,
        ):
            assert mode(folder) == 0o700, (folder, oct(mode(folder)))
        for path in [
            *old,
            paths.profiles_dir / "q.toml",
            wal,
            shm,
            paths.daemon_json,
            paths.engine_pids_json,
            paths.state_dir / "daemon.lock",
        ]:
            assert mode(path) == 0o600, (path, oct(mode(path)))
        assert "max_queue = 5" in paths.config_file.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    for path in paths.logs_dir.rglob("*"):
        assert mode(path) == (0o700 if path.is_dir() else 0o600), (path, oct(mode(path)))


def test_config_written_without_a_daemon_is_private(env: dict[str, str]) -> None:
    """`traylm config set` and `keys add` before any daemon ran: the config folder and file
    are created private, whatever the user's umask."""
    paths = Paths.from_env(env)
    out = subprocess.run(
        [sys.executable, "-m", "engines", "keys", "add"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        umask=0o022,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert mode(paths.config_file) == 0o600
    assert mode(paths.config_dir) == 0o700
