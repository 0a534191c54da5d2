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

from desktop.session.instance import send_command
from engines.config.sections import Paths
from engines.core.procs import free_loopback_port
from tests.desktop.x11 import (
    FAKE_PROFILE,
    XDesktop,
    missing_x_tools,
    prepare_home,
    start_daemon,
    wait_until,
)

pytestmark = [pytest.mark.tray, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


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

    def menu_open() -> bool:
        nonlocal status
        status = _status(paths)
        return bool(status.get("menu_visible") and "Start fake" in status["menu_actions"])

    # right-click the icon; beside CPU hogs the tray host can drop a click it gets while busy,
    # so a menu not open yet is clicked for again, as a user would
    for attempt in range(3):
        x.click(left + width // 2, top + height // 2, button=3)
        try:
            wait_until(menu_open, 10, "the tray menu")
            break
        except TimeoutError:
            if attempt == 2 or status.get("menu_visible"):
                raise AssertionError(f"no tray menu with 'Start fake': {status}") from None
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


BALLOON_CHILD = """
import json, sys, time
from PySide6.QtCore import QEventLoop
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QApplication, QLabel, QSystemTrayIcon
from desktop.tray.icons import app_icon
from desktop.look.theme import apply_theme
app = QApplication([])
apply_theme(app, "dark")
icon = QSystemTrayIcon(app_icon())
icon.show()
deadline = time.monotonic() + 20
while icon.geometry().width() == 0 and time.monotonic() < deadline:
    app.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 50)
icon.showMessage("qwen failed", "out of memory", QSystemTrayIcon.MessageIcon.Warning, 10000)
tips = []
while not tips and time.monotonic() < deadline:
    app.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 50)
    tips = [w for w in app.topLevelWidgets()
            if w.metaObject().className() == "QBalloonTip" and w.isVisible()]
image = tips[0].grab().toImage()
labels = tips[0].findChildren(QLabel)
print(json.dumps({
    "background": image.pixelColor(image.width() // 2, image.height() - 6).lightnessF(),
    "text": [label.palette().color(QPalette.ColorRole.WindowText).lightnessF()
             for label in labels if label.text()],
}))
"""


def test_notification_balloon_is_readable_in_the_dark_theme(tmp_path) -> None:
    """Where the desktop has no notification service Qt draws the tray's
    balloon itself, in a fixed pale yellow; in the dark theme its text was the theme's light
    grey on that yellow. The text must be dark on the balloon's light background."""
    import subprocess

    missing = missing_x_tools()
    if missing:
        pytest.skip(f"{', '.join(missing)} missing: run tests/desktop/install-x11-deps.sh")
    x = XDesktop().start_x()
    try:
        out = subprocess.run(
            [sys.executable, "-c", BALLOON_CHILD], env={**x.env, "PYTHONPATH": str(ROOT)},
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
    finally:
        x.close()
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["background"] > 0.8 and seen["text"]  # the pale balloon, its title and message
    assert all(seen["background"] - text > 0.6 for text in seen["text"]), seen
