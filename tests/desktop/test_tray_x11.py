"""The real tray: Xvfb + trayer (an XEmbed system tray), the real daemon process and the real
``python -m desktop`` process. A right-click on the icon (xdotool) opens the menu, a click on
"Start fake" starts the engine, and the daemon reports it ready. Marked ``tray`` (slow; needs
the Debian packages of tests/desktop/install-x11-deps.sh)."""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from desktop.instance import send_command
from engines.config import Paths
from engines.procs import free_loopback_port
from tests.desktop.x11 import (
    FAKE_PROFILE,
    XDesktop,
    missing_x_tools,
    prepare_home,
    start_daemon,
    wait_until,
)

pytestmark = [pytest.mark.tray, pytest.mark.slow]


@pytest.fixture
def desktop_session(tmp_path: Path) -> Iterator[tuple[XDesktop, dict[str, str], int]]:
    missing = missing_x_tools()
    if missing:
        pytest.skip(f"{', '.join(missing)} missing: run tests/desktop/install-x11-deps.sh")
    port = free_loopback_port()
    env = prepare_home(tmp_path, port, {"fake": FAKE_PROFILE.format(args="")})
    x = XDesktop().start_x()
    try:
        start_daemon(x, env, tmp_path / "daemon.log")
        yield x, {**env, **x.env}, port
    finally:
        x.close()


def _status(paths: Paths) -> dict[str, Any]:
    return send_command(paths, {"cmd": "status"}, timeout_s=2.0) or {}


def test_right_click_the_real_icon_and_start_an_engine(desktop_session, tmp_path) -> None:
    x, env, port = desktop_session
    paths = Paths.from_env(env)
    app = x.start([sys.executable, "-m", "desktop", "--no-daemon-start"], env, tmp_path / "app.log")
    status: dict[str, Any] = {}

    def icon_ready() -> bool:
        nonlocal status
        assert app.poll() is None, (tmp_path / "app.log").read_text()
        status = _status(paths)
        return bool(status.get("tray_visible") and status["tray_geometry"][2] > 0) and (
            status.get("link") == "connected"
        )

    wait_until(icon_ready, 30, "the tray icon, connected")
    assert status["fallback"] is False and status["tray_state"] == "stopped"
    left, top, width, height = status["tray_geometry"]
    x.click(left + width // 2, top + height // 2, button=3)  # right-click the icon

    def menu_open() -> bool:
        nonlocal status
        status = _status(paths)
        return bool(status.get("menu_visible") and "Start fake" in status["menu_actions"])

    wait_until(menu_open, 10, "the tray menu")
    x.screenshot(tmp_path / "tray-menu.png")
    mx, my, enabled = status["menu_actions"]["Start fake"]
    assert enabled
    x.click(mx, my)

    def engine_ready() -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health") as resp:
            return json.loads(resp.read())["engines"].get("fake") == "ready"

    wait_until(engine_ready, 30, "the daemon to report the engine ready")
    wait_until(lambda: _status(paths).get("tray_state") == "ready", 10, "the ready icon")
    assert "fake: ready" in _status(paths)["tooltip"]
    x.screenshot(tmp_path / "tray-ready.png")
    send_command(paths, {"cmd": "quit", "action": "leave"})
    app.wait(20)
    assert app.returncode == 0


def test_real_tray_turns_hot_when_the_guard_acts(tmp_path) -> None:
    """The daemon process on two SIMULATED GPUs idling at about 31 °C; a guard notice margin of
    65 °C below the 90 °C slowdown makes that 'hot', so the guard acts and the icon turns hot;
    back to 10 °C, the guard stands down."""
    missing = missing_x_tools()
    if missing:
        pytest.skip(f"{', '.join(missing)} missing: run tests/desktop/install-x11-deps.sh")
    port = free_loopback_port()
    env = prepare_home(tmp_path, port, {"fake": FAKE_PROFILE.format(args="")},
                       "\n[gpu]\nsimulate_gpus = 2\nguard_step_s = 600\n")  # fmt: skip
    x = XDesktop().start_x()
    try:
        start_daemon(x, env, tmp_path / "daemon.log")
        env = {**env, **x.env}
        paths = Paths.from_env(env)
        app = x.start([sys.executable, "-m", "engines", "--no-daemon-start"], env,
                      tmp_path / "app.log")  # fmt: skip

        def shown(state: str) -> bool:
            assert app.poll() is None, (tmp_path / "app.log").read_text()
            status = _status(paths)
            return status.get("tray_state") == state and status["tray_geometry"][2] > 0

        wait_until(lambda: shown("stopped"), 30, "the stopped icon")
        wait_until(  # about 31 °C, once the first GPU sample has reached the app
            lambda: "SIMULATED GPU 0: 3" in _status(paths)["tooltip"], 20, "the GPU tooltip line"
        )
        _guard(port, paths, 65)
        wait_until(lambda: shown("hot"), 20, "the hot icon")
        assert "[guard: notice]" in _status(paths)["tooltip"]
        x.screenshot(tmp_path / "tray-hot.png")
        _guard(port, paths, 10)
        wait_until(lambda: shown("stopped"), 20, "the guard standing down")
        send_command(paths, {"cmd": "quit", "action": "leave"})
        assert app.wait(20) == 0
    finally:
        x.close()


def _guard(port: int, paths: Paths, notice_margin_c: float) -> None:
    token = json.loads(paths.daemon_json.read_text())["token"]
    body = json.dumps({"guard_notice_margin_c": notice_margin_c}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/gpus/guard", data=body, method="PUT",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )  # fmt: skip
    urllib.request.urlopen(request).read()
