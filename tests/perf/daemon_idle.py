"""What an idle daemon costs: CPU of a real ``traylm serve`` with one ready FAKE engine and no
traffic (prints figures; asserts nothing about time).

    python tests/perf/daemon_idle.py [--seconds 10] [--rounds 3]

The daemon runs in a private TRAYLM_HOME with the FAKE vLLM env (tests/fakes/fake_vllm_env.py);
one engine is started and waited for; after a settling pause the daemon process's CPU seconds
(all its threads, from each thread's /proc schedstat) are read over ``--seconds``, ``--rounds``
times. The engine's own CPU is shown apart: it is not the daemon's. Target: ≤ 2 ms of CPU per
second. One request is served before the settling pause, and an event stream stays open as the
tray app's does: the gateway's throughput events must stop with the traffic (counted, expected 0
while idle).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engines.config.tomlfile import write_toml_atomic
from engines.core.procs import free_loopback_port
from tests.fakes.fake_vllm_env import make_fake_vllm_env
from tests.fakes.hub_endpoint import ReachableEndpoint

SETTLE_S = 3.0


def cpu_s(proc: psutil.Process) -> float:
    """CPU seconds of all the process's threads: from each thread's schedstat (nanoseconds)
    where Linux has it, else psutil's clock ticks (10 ms: too coarse for a few ms per second
    unless measured for long)."""
    total_ns = 0
    try:
        for thread in Path(f"/proc/{proc.pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
                total_ns += int((thread / "schedstat").read_text().split()[0])
    except OSError:
        times = proc.cpu_times()
        return float(times.user + times.system)
    return total_ns / 1e9


def call(port: int, token: str, method: str, path: str, body: object = None) -> object:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def one_request(port: int) -> None:
    """A chat request through the gateway: the throughput reporter runs, then must stop."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps({"model": "idle", "messages": [], "max_tokens": 4}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        resp.read()


class ThroughputEvents:
    """Counts the daemon's ``gateway.throughput`` events on an open event stream (a thread)."""

    def __init__(self, port: int, token: str) -> None:
        self.count = 0
        self._req = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/events?kinds=gateway.throughput",
            headers={"Authorization": f"Bearer {token}"},
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        with contextlib.suppress(OSError), urllib.request.urlopen(self._req) as resp:
            for line in resp:
                if line.startswith(b"data:"):
                    self.count += 1


def wait_ready(port: int, token: str, engine_id: str, timeout_s: float) -> int:
    """The engine's pid once it is ready."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        engines = call(port, token, "GET", "/api/engines")
        assert isinstance(engines, list)
        for e in engines:
            if e["engine_id"] == engine_id and e["state"] == "ready":
                return int(e["pid"])
            if e["engine_id"] == engine_id and e["state"] == "failed":
                raise SystemExit(f"the engine failed: {e['detail']}")
        time.sleep(0.2)
    raise SystemExit("the engine was not ready in time")


def measure(seconds: float, rounds: int) -> None:
    hub = ReachableEndpoint().start()  # the made-up repo id starts as with network
    with tempfile.TemporaryDirectory() as home:
        env = {
            **os.environ,
            "TRAYLM_HOME": home,
            "TRAYLM_ENVS_DIR": f"{home}/envs",
            "HF_ENDPOINT": hub.url,
        }
        make_fake_vllm_env(Path(home) / "envs")
        write_toml_atomic(
            Path(home) / "config" / "profiles" / "idle.toml",
            {"model": "org/idle", "served_name": "idle", "device": "cpu"},
        )
        port = free_loopback_port()
        argv = [sys.executable, "-m", "engines", "serve", "--port", str(port)]
        log = Path(home) / "serve.log"
        with log.open("w") as out:
            proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            daemon_json = Path(home) / "state" / "daemon.json"
            deadline = time.monotonic() + 60
            while not daemon_json.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the daemon did not start:\n{log.read_text()}")
                time.sleep(0.1)
            token = json.loads(daemon_json.read_text())["token"]
            call(port, token, "POST", "/api/engines", {"profile": "idle"})
            engine = psutil.Process(wait_ready(port, token, "idle", 60))
            daemon = psutil.Process(proc.pid)
            events = ThroughputEvents(port, token)
            one_request(port)
            time.sleep(SETTLE_S)  # the warm process, first samples, the throughput's last event
            seen = events.count
            figures = []
            for n in range(rounds):
                d0, e0, t0 = cpu_s(daemon), cpu_s(engine), time.monotonic()
                time.sleep(seconds)
                d1, e1, t1 = cpu_s(daemon), cpu_s(engine), time.monotonic()
                per_s = (d1 - d0) / (t1 - t0) * 1000
                figures.append(per_s)
                print(
                    f"  round {n + 1}: daemon {per_s:6.2f} ms CPU per s "
                    f"({daemon.num_threads()} threads), "
                    f"FAKE engine {(e1 - e0) / (t1 - t0) * 1000:6.2f} ms per s"
                )
            print(
                f"idle daemon with one ready engine: median {statistics.median(figures):.2f} ms "
                f"CPU per s over {rounds} x {seconds:.0f} s (target ≤ 2)"
            )
            print(
                f"throughput events: {seen} while the request ran and stopped, "
                f"{events.count - seen} while idle (expected 0)"
            )
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            hub.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    measure(args.seconds, args.rounds)


if __name__ == "__main__":
    main()
