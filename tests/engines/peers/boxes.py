"""Two or three traylm boxes on one machine: each `traylm serve` in its own network namespace
that the test creates, joined by veth pairs (A 10.77.0.1 ↔ B 10.77.0.2, A 10.77.1.1 ↔ C
10.77.1.2). The namespaces hold only those links and their own loopback, so nothing a test
sends can reach any other address. Needs root (`ip netns`); the tests skip with the reason
where it is not permitted.

Inside a fresh namespace no other process holds a port, so each box uses the default ports
(gateway 8000, peers 8471), as a real box does."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from engines.config.sections import Paths
from engines.config.tomlfile import write_toml_atomic

LINKS = (("a", "b", "10.77.0"), ("a", "c", "10.77.1"))
START_TIMEOUT_S = 60.0
PEER_PORT = 8471  # peers.port's default


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@dataclass
class Box:
    """One traylm box: its namespace, its TRAYLM_HOME, its daemon while it runs."""

    name: str  # peers.name: "box-a"
    netns: str
    home: Path
    address: str  # where the other boxes reach it
    proc: subprocess.Popen[str] | None = None
    env: dict[str, str] = field(default_factory=dict)

    def command(self, *args: str) -> list[str]:
        return ["ip", "netns", "exec", self.netns, sys.executable, *args]

    def traylm(self, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
        """`traylm ARGS` run in this box's namespace, as a person at this box runs it."""
        return subprocess.run(
            self.command("-m", "engines", *args),
            env=self.env, text=True, capture_output=True, timeout=timeout_s, check=False,
        )  # fmt: skip

    def json(self, *args: str) -> dict[str, object]:
        out = self.traylm(*args, "--json")
        assert out.returncode == 0, out.stderr
        data: dict[str, object] = json.loads(out.stdout)
        return data

    def python(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(*args), env=self.env, text=True, capture_output=True, timeout=60,
            check=False,
        )  # fmt: skip

    def serve(self) -> None:
        log = self.home.with_suffix(".log")
        paths = Paths.from_env(self.env)
        paths.daemon_json.unlink(missing_ok=True)
        with log.open("a") as fh:
            self.proc = subprocess.Popen(
                self.command("-m", "engines", "serve", "--simulate-gpus", "1"),
                env=self.env, text=True, stdout=fh, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        while not paths.daemon_json.exists():
            assert self.proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"{self.name} did not start: {log.read_text()}"
            time.sleep(0.05)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def peers(self) -> list[dict[str, object]]:
        return list(self.json("peers")["peers"])  # type: ignore[call-overload]

    def listening(self) -> str:
        return str(self.json("peers")["listening"])


def _netns_or_skip(tag: str) -> None:
    if shutil.which("ip") is None:
        pytest.skip("the `ip` command (iproute2) is not installed: the pairing tests need it")
    probe = f"{tag}probe"
    result = subprocess.run(
        ["ip", "netns", "add", probe], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        pytest.skip(
            "network namespaces cannot be made here (`ip netns add`: "
            f"{result.stderr.strip() or result.returncode}); the pairing tests need root"
        )
    _ip("netns", "del", probe)


@pytest.fixture
def boxes(tmp_path: Path) -> Iterator[dict[str, Box]]:
    """Boxes a, b, c (daemons not started; ``Box.serve``), their namespaces and links made
    here and removed in teardown even when the test fails."""
    tag = f"tlm{os.getpid() % 100000}"
    _netns_or_skip(tag)
    made: list[str] = []
    boxes: dict[str, Box] = {}
    try:
        for key in "abc":
            netns = f"{tag}{key}"
            _ip("netns", "add", netns)
            made.append(netns)
            _ip("-n", netns, "link", "set", "lo", "up")
        for left, right, net in LINKS:
            here, there = f"v{tag}{left}{right}"[-15:], f"v{tag}{right}{left}"[-15:]
            _ip("-n", f"{tag}{left}", "link", "add", here, "type", "veth", "peer", "name", there,
                "netns", f"{tag}{right}")  # fmt: skip
            _ip("-n", f"{tag}{left}", "addr", "add", f"{net}.1/24", "dev", here)
            _ip("-n", f"{tag}{right}", "addr", "add", f"{net}.2/24", "dev", there)
            _ip("-n", f"{tag}{left}", "link", "set", here, "up")
            _ip("-n", f"{tag}{right}", "link", "set", there, "up")
        hosts = {"a": ("0.0.0.0", "10.77.0.1"), "b": ("10.77.0.2", "10.77.0.2"),
                 "c": ("10.77.1.2", "10.77.1.2")}  # fmt: skip
        for key, (bind, address) in hosts.items():
            home = tmp_path / f"box-{key}"
            box = Box(f"box-{key}", f"{tag}{key}", home, address)
            box.env = {**os.environ, "TRAYLM_HOME": str(home),
                       "TRAYLM_ENVS_DIR": str(tmp_path / "envs")}  # fmt: skip
            write_toml_atomic(
                Paths.from_env(box.env).config_file,
                # a generous time per peer request: the tests run beside CPU hogs
                {"peers": {"name": box.name, "host": bind, "request_timeout_s": 30.0}},
            )
            boxes[key] = box
        yield boxes
    finally:
        for box in boxes.values():
            box.stop()
        for netns in made:
            subprocess.run(["ip", "netns", "del", netns], capture_output=True, check=False)
