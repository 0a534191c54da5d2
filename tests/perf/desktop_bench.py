"""Desktop app benchmark: start-up to a visible tray icon, idle CPU, CPU with live charts, RSS.

    .venv/bin/python tests/perf/desktop_bench.py [--runs 5] [--seconds 30]

Runs under Xvfb + trayer (a real XEmbed tray; tests/desktop/install-x11-deps.sh installs them)
with a real daemon process on two SIMULATED GPUs (`gpu.simulate_gpus = 2`: a ``gpu.sample``
event reaches the app every second, as with real GPUs) and the FAKE vLLM engine, in a private
TRAYLM_HOME. It measures the real ``traylm`` command (the console script: engines.cli →
desktop.app):

- start-up: from launching ``traylm`` until the app reports its icon embedded in the panel (a
  non-empty geometry), with the daemon already running; target ≤ 1.5 s.
- idle CPU of the GUI process over a window, with an engine ready and no window open (the tray
  takes every GPU sample for its tooltip and samples the gateway every 5 s); target ≤ 1 % of a
  core.
- CPU with the dashboard's Engines page open (live charts sampled every second) while one small
  request a second goes through the gateway; target ≤ 5 %.
- CPU with the GPUs page open (two cards, eight live charts, one sample a second) under the same
  traffic; target ≤ 5 %.
- RSS with the tray, the dashboard (every page visited) and the chat window open; target ≤ 200 MB.

Prints the figures and their ratio to the targets; asserts nothing (tests/ never asserts on
wall-clock time).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from PySide6.QtCore import QCoreApplication  # noqa: E402

from desktop.session.instance import send_command  # noqa: E402
from engines.config.sections import Paths  # noqa: E402
from engines.core.procs import free_loopback_port  # noqa: E402
from tests.desktop.x11 import (  # noqa: E402
    FAKE_PROFILE,
    XDesktop,
    missing_x_tools,
    prepare_home,
    start_daemon,
    wait_until,
)

TARGET_STARTUP_S = 1.5
TARGET_IDLE_PCT = 1.0
TARGET_CHARTS_PCT = 5.0
TARGET_RSS_MB = 200.0


def traylm_command() -> list[str]:
    script = Path(sys.executable).with_name("traylm")
    return [str(script)] if script.exists() else [sys.executable, "-m", "desktop"]


def status(paths: Paths) -> dict[str, Any]:
    return send_command(paths, {"cmd": "status"}, timeout_s=1.0) or {}


def start_app(x: XDesktop, env: dict[str, str], log: Path) -> tuple[Any, float]:
    """Launch ``traylm``; returns the process and seconds until its icon is in the panel."""
    paths = Paths.from_env(env)
    started = time.perf_counter()
    proc = x.start(traylm_command(), env, log)  # attaches to the running daemon

    def icon_visible() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"traylm exited with {proc.returncode}; see {log}")
        s = status(paths)
        return bool(s.get("tray_visible") and s["tray_geometry"][2] > 0)

    wait_until(icon_visible, 30, "the tray icon")
    return proc, time.perf_counter() - started


def cpu_percent(pid: int, seconds: float) -> float:
    import psutil

    p = psutil.Process(pid)
    before = p.cpu_times()
    t0 = time.perf_counter()
    time.sleep(seconds)
    after = p.cpu_times()
    used = (after.user - before.user) + (after.system - before.system)
    return 100.0 * used / (time.perf_counter() - t0)


def request_loop(port: int, stop: threading.Event) -> None:
    body = b'{"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}'
    while not stop.is_set():
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        urllib.request.urlopen(req).read()
        stop.wait(1.0)


def line(name: str, value: float, unit: str, target: float) -> str:
    ratio = value / target
    return f"{name:<50} {value:8.2f} {unit:<4} target {target:g} {unit}  ({ratio:.2f}× target)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="start-up measurements")
    ap.add_argument("--seconds", type=float, default=30.0, help="CPU measurement window")
    args = ap.parse_args()
    missing = missing_x_tools()
    if missing:
        sys.exit(f"{', '.join(missing)} missing: run tests/desktop/install-x11-deps.sh")
    QCoreApplication([sys.argv[0]])  # QLocalSocket (the app's status command) needs one
    home = Path(tempfile.mkdtemp(prefix="traylm-bench-"))
    port = free_loopback_port()
    env = prepare_home(
        home, port, {"fake": FAKE_PROFILE.format(args="")}, "\n[gpu]\nsimulate_gpus = 2\n"
    )
    paths = Paths.from_env(env)
    x = XDesktop()
    try:
        x.start_x()
        env = {**env, **x.env}
        start_daemon(x, env, home / "daemon.log")
        print(f"traylm command: {' '.join(traylm_command())}   daemon on 127.0.0.1:{port}")

        startups = []
        for run in range(args.runs):
            proc, seconds = start_app(x, env, home / f"app-{run}.log")
            startups.append(seconds)
            send_command(paths, {"cmd": "quit", "action": "leave"})
            proc.wait(20)
        print(f"start-up runs (s): {', '.join(f'{s:.3f}' for s in startups)}")

        proc, _ = start_app(x, env, home / "app.log")
        wait_until(lambda: status(paths).get("link") == "connected", 20, "connection")
        urllib.request.urlopen(
            urllib.request.Request(
                f"http://127.0.0.1:{port}/api/engines",
                data=b'{"profile": "fake"}',
                headers={
                    "Authorization": f"Bearer {_token(paths)}",
                    "Content-Type": "application/json",
                },
            )
        ).read()
        wait_until(lambda: status(paths).get("tray_state") == "ready", 30, "engine ready")
        time.sleep(2.0)  # let start-up work (window-less) settle before measuring idle
        idle = cpu_percent(proc.pid, args.seconds)

        send_command(paths, {"cmd": "show", "what": "dashboard", "page": "engines"})
        wait_until(lambda: status(paths).get("dashboard_visible"), 10, "the dashboard")
        stop = threading.Event()
        traffic = threading.Thread(target=request_loop, args=(port, stop), daemon=True)
        traffic.start()
        time.sleep(2.0)
        charts = cpu_percent(proc.pid, args.seconds)
        send_command(paths, {"cmd": "show", "what": "dashboard", "page": "gpus"})
        time.sleep(2.0)
        gpu_charts = cpu_percent(proc.pid, args.seconds)
        stop.set()
        traffic.join(10)
        for page in ("models", "fans", "bench", "settings", "gpus"):  # every page built
            send_command(paths, {"cmd": "show", "what": "dashboard", "page": page})
            time.sleep(0.5)

        send_command(paths, {"cmd": "show", "what": "chat"})
        wait_until(lambda: status(paths).get("chat_visible"), 10, "the chat window")
        time.sleep(1.0)
        import psutil

        rss_mb = psutil.Process(proc.pid).memory_info().rss / 1e6
        send_command(paths, {"cmd": "quit", "action": "leave"})
        proc.wait(20)

        print()
        print(line("start-up to visible tray icon (median)", statistics.median(startups), "s",
                   TARGET_STARTUP_S))  # fmt: skip
        print(line("start-up to visible tray icon (worst)", max(startups), "s", TARGET_STARTUP_S))
        print(line("GUI CPU, engine ready, no window, 2 sim GPUs", idle, "%", TARGET_IDLE_PCT))
        print(line("GUI CPU, Engines page live charts + 1 req/s", charts, "%", TARGET_CHARTS_PCT))
        print(line("GUI CPU, GPUs page (2 cards, 8 charts) + 1 req/s", gpu_charts, "%",
                   TARGET_CHARTS_PCT))  # fmt: skip
        print(line("RSS, tray + dashboard (all pages) + chat", rss_mb, "MB", TARGET_RSS_MB))
    finally:
        x.close()
        shutil.rmtree(home, ignore_errors=True)


def _token(paths: Paths) -> str:
    import json

    return str(json.loads(paths.daemon_json.read_text())["token"])


if __name__ == "__main__":
    from tests.fakes.hub_endpoint import reachable_hub_env

    with reachable_hub_env():  # the FAKE engine serves made-up repo ids
        main()
