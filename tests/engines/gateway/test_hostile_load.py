"""The daemon under hostile load, as a real `traylm serve` process with a lowered open-files
limit: a flood of half-sent connections does not exhaust its descriptors or its supervision,
slowloris sockets are closed, and a flood of bad requests does not flood the log."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from engines.config.sections import Paths
from engines.config.tomlfile import write_toml_atomic
from engines.core.procs import free_loopback_port
from tests.engines.cli.test_cli import traylm


class LimitedDaemon:
    """`traylm serve` whose soft and hard open-files limits are both ``nofile``."""

    def __init__(self, env: dict[str, str], nofile: int, gateway: dict[str, object]) -> None:
        self.env = env
        self.paths = Paths.from_env(env)
        self.port = free_loopback_port()
        write_toml_atomic(self.paths.config_file, {"gateway": gateway} if gateway else {})
        start = (
            "import os, resource, sys; "
            f"resource.setrlimit(resource.RLIMIT_NOFILE, ({nofile}, {nofile})); "
            "os.execv(sys.executable, [sys.executable, '-m', 'engines', 'serve', "
            f"'--port', '{self.port}'])"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", start],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(lambda: self.paths.daemon_json.exists() or self.proc.poll() is not None, 30)
        assert self.proc.poll() is None, self.log()

    def log(self) -> str:
        path = self.paths.logs_dir / "daemon.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def status(self) -> dict[str, object]:
        out = traylm(self.env, "status", "--json")
        assert out.returncode == 0, out.stderr
        return dict(json.loads(out.stdout))

    def open_fds(self) -> int:
        return psutil.Process(self.proc.pid).num_fds()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture
def limited(env: dict[str, str]) -> Iterator[Callable[..., LimitedDaemon]]:
    started: list[LimitedDaemon] = []

    def start(nofile: int, **gateway: object) -> LimitedDaemon:
        d = LimitedDaemon(env, nofile, gateway)
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()


def half_sent(port: int, count: int) -> list[socket.socket]:
    """Connections that start a request and never finish its head."""
    socks = []
    for _ in range(count):
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect(("127.0.0.1", port))
        socks.append(s)
    for s in socks:
        with contextlib.suppress(OSError):
            select.select([], [s], [], 5)
            s.send(b"GET /v1/models HTTP/1.1\r\nHost: loc")
    return socks


def closed_by_server(s: socket.socket) -> bool:
    try:
        return s.recv(65536, socket.MSG_DONTWAIT) == b"" or _drained_to_eof(s)
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True


def _drained_to_eof(s: socket.socket) -> bool:
    while True:
        try:
            if s.recv(65536, socket.MSG_DONTWAIT) == b"":
                return True
        except BlockingIOError:
            return False
        except OSError:
            return True


@pytest.mark.slow
def test_fd_exhaustion_leaves_supervision_working(
    limited: Callable[..., LimitedDaemon], env: dict[str, str]
) -> None:
    """256 open files for everything: 600 idle half-sent connections must not starve the
    supervisor (a SIGKILLed engine is restarted), the control API or the log."""
    d = limited(256)
    write_toml_atomic(
        d.paths.profiles_dir / "f.toml", {"model": "org/f", "served_name": "f", "device": "cpu"}
    )
    assert traylm(env, "start", "f", "--wait", "--timeout", "60").returncode == 0
    engine_pid = d.status()["engines"][0]["pid"]  # type: ignore[index]
    socks = half_sent(d.port, 600)
    try:
        assert d.open_fds() < 256
        os.kill(engine_pid, signal.SIGKILL)

        def restarted() -> bool:
            (engine,) = d.status()["engines"]  # type: ignore[misc]
            return bool(engine["state"] == "ready" and engine["pid"] != engine_pid)

        wait_for(restarted, 60, "the engine to be restarted")
        (engine,) = d.status()["engines"]  # type: ignore[misc]
        assert engine["restarts"] == 1 and engine["supervision"] == "", engine
        connections = d.status()["connections"]
        assert connections["max"] == 16 and connections["evicted_total"] > 0, connections  # type: ignore[index]
        assert d.open_fds() < 256
    finally:
        for s in socks:
            s.close()
    log = d.log()
    assert "Too many open files" not in log, log[-3000:]
    assert len(log.splitlines()) < 300, log[-3000:]


@pytest.mark.slow
def test_slowloris_sockets_are_closed(limited: Callable[..., LimitedDaemon]) -> None:
    """500 sockets sending one byte a second of a request head that never ends: each is closed
    once gateway.header_timeout_s (10 s) passed, and a normal request is served meanwhile."""
    d = limited(1024)
    socks = half_sent(d.port, 500)
    try:
        deadline = time.monotonic() + 60
        while True:
            open_socks = [s for s in socks if not closed_by_server(s)]
            if not open_socks:
                break
            assert time.monotonic() < deadline, f"{len(open_socks)} slow sockets still open"
            for s in open_socks:  # one more byte of the head, as a slowloris client does
                with contextlib.suppress(OSError):
                    s.send(b"x")
            assert d.status()["pid"] == d.proc.pid  # the control API answers meanwhile
            time.sleep(1)
        connections = d.status()["connections"]
        assert connections["head_timeouts_total"] + connections["evicted_total"] >= 500  # type: ignore[index]
        assert d.open_fds() < 200
    finally:
        for s in socks:
            s.close()


def test_a_flood_of_bad_requests_does_not_flood_the_log(
    limited: Callable[..., LimitedDaemon],
) -> None:
    d = limited(4096)
    for _ in range(300):
        with socket.create_connection(("127.0.0.1", d.port), timeout=10) as s:
            s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nno colon\r\n\r\n")
            while s.recv(65536):
                pass
    assert d.status()["pid"] == d.proc.pid
    lines = [line for line in d.log().splitlines() if "malformed request" in line]
    assert 1 <= len(lines) <= 10, len(lines)
    assert "identical lines are held back" in lines[-1]
    assert "Traceback" not in d.log()


def test_file_limit_is_raised_to_the_hard_limit(env: dict[str, str]) -> None:
    port = free_loopback_port()
    start = (
        "import os, resource, sys; "
        "resource.setrlimit(resource.RLIMIT_NOFILE, (300, 4000)); "
        f"os.execv(sys.executable, [sys.executable, '-m', 'engines', 'serve', '--port', '{port}'])"
    )
    paths = Paths.from_env(env)
    proc = subprocess.Popen([sys.executable, "-c", start], env=env, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: paths.daemon_json.exists(), 30)
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
        (line,) = [x for x in limits.splitlines() if x.startswith("Max open files")]
        assert line.split()[3:5] == ["4000", "4000"], line
        status = json.loads(traylm(env, "status", "--json").stdout)
        assert status["connections"]["max"] == (4000 - 256) // 2
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
