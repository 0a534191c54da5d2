"""Bad input around the daemon: none reachable, one of another version, one that goes away and
comes back, one the app has to start itself (and one that cannot start); and the single-instance
handshake of a second ``traylm``. Each shows a clear state and recovers on its own."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import Any

import psutil
import pytest

from desktop.daemon.messages import LinkState
from desktop.dashboard.settings_page import SettingsPage
from desktop.session import autostart
from desktop.session.instance import InstanceServer, PrimaryLock
from desktop.tray.icons import TrayState
from engines.config.sections import Paths
from engines.config.tomlfile import write_toml_atomic
from engines.core.procs import free_loopback_port
from engines.events import EngineState
from tests.conftest import fast_settings
from tests.desktop.conftest import AppFactory, ThreadedDaemon


def test_no_daemon_shows_it_and_connects_when_one_appears(
    qtbot, app_factory: AppFactory, paths: Paths, fake_env
) -> None:
    app = app_factory(connect=False)
    qtbot.waitUntil(lambda: app.state.connection.state == LinkState.UNREACHABLE, timeout=5000)
    assert app.tray.current == TrayState.ERROR
    assert "daemon is not running" in app.tray.icon.toolTip()
    assert app.dashboard is not None  # offscreen: the fallback window shows the banner
    banner = app.dashboard.findChild(type(app.dashboard.fallback_note), "bannerText")
    assert banner is not None and "not running" in banner.text()
    assert app.tray.start_daemon_action.isEnabled()
    assert not app.tray.start_action.isEnabled()

    d = ThreadedDaemon(paths, fast_settings(free_loopback_port())).start()
    try:
        qtbot.waitUntil(lambda: app.state.connection.state == LinkState.CONNECTED, timeout=10000)
        assert app.tray.current == TrayState.STOPPED
        assert app.state.endpoint_url == f"{d.url}/v1"
    finally:
        d.stop()


def test_daemon_of_another_version_is_reported_then_recovers(
    qtbot, app_factory: AppFactory, paths: Paths, fake_env, monkeypatch: pytest.MonkeyPatch
) -> None:
    import engines.control.service
    import engines.daemon

    monkeypatch.setattr(engines.daemon, "__version__", "9.9.9")  # daemon.json
    monkeypatch.setattr(engines.control.service, "__version__", "9.9.9")  # /api/status
    settings = fast_settings(free_loopback_port())
    d = ThreadedDaemon(paths, settings).start()
    app = app_factory(connect=False)
    qtbot.waitUntil(lambda: app.state.connection.state == LinkState.VERSION_MISMATCH, timeout=10000)
    message = app.state.connection.message
    assert "traylm 9.9.9" in message and "restart the daemon" in message.lower()
    assert app.tray.current == TrayState.ERROR
    assert "9.9.9" in app.tray.icon.toolTip()
    assert app.tray.restart_daemon_action.isEnabled()
    # the daemon is replaced by one of this version (an upgrade): the app follows on its own
    d.stop()
    monkeypatch.undo()
    d = ThreadedDaemon(paths, settings).start()
    try:
        qtbot.waitUntil(lambda: app.state.connection.state == LinkState.CONNECTED, timeout=10000)
        assert app.tray.current == TrayState.STOPPED
    finally:
        d.stop()


def test_daemon_restart_reloads_what_it_runs(
    qtbot, daemon_thread: ThreadedDaemon, app_factory: AppFactory
) -> None:
    app = app_factory()
    daemon_thread.write_fake_profile("fake")
    app.actions.start_profile("fake")
    qtbot.waitUntil(lambda: app.tray.current == TrayState.READY, timeout=20000)
    messages: list[str] = []
    app.state.connection_changed.connect(lambda c: messages.append(c.message))
    daemon_thread.stop()
    qtbot.waitUntil(lambda: app.state.connection.state == LinkState.UNREACHABLE, timeout=10000)
    assert app.state.engines == {}  # unknown while the daemon is away
    assert any(m.startswith("lost the daemon") for m in messages)
    daemon_thread.start()
    qtbot.waitUntil(lambda: app.state.connection.state == LinkState.CONNECTED, timeout=10000)
    app.actions.start_profile("fake")
    qtbot.waitUntil(lambda: app.tray.current == TrayState.READY, timeout=20000)


def _write_port(paths: Paths, port: int) -> None:
    paths.config_dir.mkdir(parents=True, exist_ok=True)
    paths.config_file.write_text(f"[gateway]\nport = {port}\n")


@pytest.mark.slow
def test_starts_the_daemon_detached_when_none_runs(
    qtbot, app_factory: AppFactory, paths: Paths, fake_env
) -> None:
    port = free_loopback_port()
    _write_port(paths, port)
    app = app_factory(spawn_daemon=True, connect=False)
    qtbot.waitUntil(lambda: app.state.connection.state == LinkState.CONNECTED, timeout=30000)
    conn = app.state.connection
    assert conn.spawned and conn.url == f"http://127.0.0.1:{port}"
    assert conn.daemon_pid is not None and conn.daemon_pid != os.getpid()
    daemon = psutil.Process(conn.daemon_pid)
    assert daemon.cmdline()[-3:] == ["-m", "engines", "serve"]
    assert os.getsid(conn.daemon_pid) == conn.daemon_pid  # its own session: outlives the app
    with qtbot.waitSignal(app.finished, timeout=30000):
        app.quit_with("stop")
    daemon.wait(30)  # the daemon stopped (and was reaped)


@pytest.mark.slow
def test_restarting_the_daemon_says_what_it_does_and_brings_the_models_back(
    qtbot, app_factory: AppFactory, paths: Paths, fake_env
) -> None:
    """Settings ▸ Restart the daemon: the first click says what it stops and brings back (and
    the new port); the restart finishes, says so, serves on the new port, and the model that
    was loaded is loaded again. Until then, Settings shows the port really bound."""
    port, new_port = free_loopback_port(), free_loopback_port()
    _write_port(paths, port)
    write_toml_atomic(
        paths.profiles_dir / "fake.toml",
        {"model": "org/fake", "served_name": "fake", "device": "cpu",
         "env": {"FAKE_ENGINE_ARGS": ""}},
    )  # fmt: skip
    app = app_factory(spawn_daemon=True, connect=False)
    try:
        qtbot.waitUntil(lambda: app.state.connection.state == LinkState.CONNECTED, timeout=30000)
        old_pid = app.state.connection.daemon_pid
        app.actions.start_profile("fake")
        qtbot.waitUntil(lambda: app.state.served_models() == ["fake"], timeout=30000)
        page = app.open_dashboard("settings").page("settings")
        assert isinstance(page, SettingsPage)
        page.port.setValue(new_port)
        page.port.editingFinished.emit()
        qtbot.waitUntil(lambda: app.state.settings.gateway.port == new_port, timeout=5000)
        qtbot.waitUntil(lambda: f"port {new_port} after a restart" in page.bound.text())
        assert page.bound.text().startswith(f"127.0.0.1:{port}")  # still served there

        page.restart_daemon.click()
        said = page.result.text()
        assert "Restarting stops fake" in said and "loads it again" in said, said
        assert f"moves to port {new_port}" in said and page.restart_daemon.text() == "Restart now"
        assert app.state.connection.daemon_pid == old_pid  # nothing happened yet
        page.restart_daemon.click()
        qtbot.waitUntil(lambda: "The daemon restarted" in page.result.text(), timeout=60000)
        assert f":{new_port}" in page.result.text() and "loading fake again" in page.result.text()
        assert app.state.connection.daemon_pid != old_pid
        qtbot.waitUntil(lambda: app.state.served_models() == ["fake"], timeout=30000)
        qtbot.waitUntil(lambda: page.bound.text() == f"127.0.0.1:{new_port} (no API key)")
    finally:
        with qtbot.waitSignal(app.finished, timeout=30000):
            app.quit_with("stop")


@pytest.mark.slow
def test_a_daemon_that_cannot_start_says_why(
    qtbot, app_factory: AppFactory, paths: Paths, fake_env
) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    _write_port(paths, holder.getsockname()[1])
    try:
        app = app_factory(spawn_daemon=True, connect=False)
        qtbot.waitUntil(lambda: "exited with code" in app.state.connection.message, timeout=30000)
        message = app.state.connection.message
        assert app.state.connection.state == LinkState.UNREACHABLE
        assert f"port {holder.getsockname()[1]} is held by" in message  # the daemon's own words
        assert "gateway.port" in message
    finally:
        holder.close()


def test_second_instance_shows_the_windows_of_the_first(qtbot, paths: Paths) -> None:
    lock = PrimaryLock.try_acquire(paths)
    assert lock is not None
    assert PrimaryLock.try_acquire(paths) is None  # one app per user and TRAYLM_HOME
    commands: list[dict[str, Any]] = []

    def handle(command: dict[str, Any]) -> dict[str, Any]:
        commands.append(command)
        return {"ok": True}

    server = InstanceServer(paths, handle)
    assert server.listen()
    try:
        second = subprocess.Popen(
            [sys.executable, "-m", "desktop", "--show", "chat"],
            env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
        )
        qtbot.waitUntil(lambda: second.poll() is not None, timeout=30000)
        assert second.returncode == 0
        assert commands == [{"cmd": "show", "what": "chat", "page": ""}]
    finally:
        server.close()
        lock.release()


def test_a_relaunch_brings_back_the_window_of_a_first_app_without_a_tray(
    qtbot, app, paths: Paths
) -> None:
    """On a desktop without a system tray the first app is its window; a
    relaunch (the menu entry again, a real second process) must bring that window back, also
    when it was minimized, instead of showing nothing."""
    assert app.fallback and app.dashboard is not None
    app.dashboard.showMinimized()
    qtbot.waitUntil(lambda: app.dashboard.isMinimized())
    lock = PrimaryLock.try_acquire(paths)  # as desktop.app.main holds it for the first app
    assert lock is not None
    server = InstanceServer(paths, app.handle_command)
    assert server.listen()
    try:
        second = subprocess.Popen(
            [sys.executable, "-m", "desktop"], env={**os.environ, "QT_QPA_PLATFORM": "offscreen"}
        )
        qtbot.waitUntil(lambda: second.poll() is not None, timeout=30000)
        assert second.returncode == 0
        qtbot.waitUntil(lambda: app.dashboard.isVisible() and not app.dashboard.isMinimized())
    finally:
        server.close()
        lock.release()


def test_status_command_describes_the_app(qtbot, app, daemon_thread) -> None:
    status = app.handle_command({"cmd": "status"})
    assert status["link"] == "connected" and status["tray_state"] == "stopped"
    assert status["fallback"] is True and status["dashboard_visible"] is True
    assert app.handle_command({"cmd": "nope"})["ok"] is False
    app.handle_command({"cmd": "show", "what": "chat"})
    assert app.chat_window is not None and app.chat_window.isVisible()


def test_engine_state_survives_a_fresh_app(qtbot, daemon_thread, app_factory: AppFactory):
    first = app_factory()
    daemon_thread.write_fake_profile("fake")
    first.actions.start_profile("fake")
    qtbot.waitUntil(lambda: first.tray.current == TrayState.READY, timeout=20000)
    first.shutdown()  # "leave serving": the engine keeps running
    second = app_factory()
    qtbot.waitUntil(lambda: second.tray.current == TrayState.READY, timeout=5000)
    assert daemon_thread.engine_state("fake") == EngineState.READY


def test_traylm_shutdown_closes_the_app_too(qtbot, app_factory: AppFactory, paths: Paths, fake_env):
    """`traylm shutdown` stops traylm as a whole (a real daemon process); the app's own
    Quit → stop is its own flow."""
    port = free_loopback_port()
    daemon = subprocess.Popen(
        [sys.executable, "-m", "engines", "serve", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        qtbot.waitUntil(paths.daemon_json.exists, timeout=30000)
        app = app_factory()
        shutdown = subprocess.Popen(
            [sys.executable, "-m", "engines", "shutdown"], stdout=subprocess.PIPE, text=True
        )
        with qtbot.waitSignal(app.finished, timeout=30000):
            pass
        assert daemon.wait(60) == 0  # reaped here (its parent), so the CLI sees it gone
        out, _ = shutdown.communicate(timeout=90)
        assert shutdown.returncode == 0 and "daemon stopped" in out, out
        assert app._finished and not app.tray.icon.isVisible()
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()


def test_a_launch_by_the_user_opens_the_chat_with_the_model_last_used(
    qtbot, daemon_thread: ThreadedDaemon, app_factory: AppFactory
) -> None:
    """Launched from the desktop (not at login) with the setup done, the app opens a window:
    the chat, on the model last used, never the setup again."""
    daemon_thread.write_fake_profile("mine")
    daemon_thread.write_fake_profile("other")
    changes = {"ui.last_profile": "mine", "ui.setup_done": True}
    daemon_thread.run(lambda c: c.update_settings(changes))
    app = app_factory(offer_setup=True, open_window=True)
    qtbot.waitUntil(
        lambda: app.chat_window is not None and app.chat_window.isVisible(), timeout=15000
    )
    assert app.chat_window is not None
    qtbot.waitUntil(lambda: app.chat_window.model_picker.currentText() == "mine", timeout=10000)
    assert app.setup is None


def test_started_at_login_the_app_opens_no_window(
    qtbot, daemon_thread: ThreadedDaemon, app_factory: AppFactory
) -> None:
    daemon_thread.run(lambda c: c.update_settings({"ui.setup_done": True}))
    app = app_factory(offer_setup=True, open_window=False)  # what --at-login gives
    qtbot.waitUntil(lambda: app._setup_offered, timeout=15000)
    assert app.chat_window is None and app.setup is None  # (no tray here: the dashboard is)
    assert "--at-login" in autostart.entry_text()


@pytest.mark.slow
def test_the_tray_asks_before_a_restart_and_keeps_how_the_daemon_was_started(
    qtbot, app_factory: AppFactory, paths: Paths, fake_env
) -> None:
    """A daemon the user started as `traylm serve --simulate-gpus 2`: Tray ▸ Daemon ▸ Restart
    says what it does first (a Cancel does nothing), comes back with the same flags, and the
    app never reports the daemon as gone meanwhile."""
    port = free_loopback_port()
    _write_port(paths, port)
    user_daemon = subprocess.Popen(
        [sys.executable, "-m", "engines", "serve", "--simulate-gpus", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        app = app_factory(connect=False)
        qtbot.waitUntil(lambda: app.state.connection.state == LinkState.CONNECTED, timeout=30000)
        assert app.state.connection.serve_args == ("--simulate-gpus", "2")
        plans: list[str] = []
        app.tray.confirm_restart = lambda plan: plans.append(plan) and False  # Cancel
        app.tray.restart_daemon_action.trigger()
        assert "traylm serve --simulate-gpus 2" in plans[0] and "Restart now" in plans[0]
        assert app.state.connection.daemon_pid == user_daemon.pid  # cancelled: nothing done

        states: list[LinkState] = []
        app.state.connection_changed.connect(lambda c: states.append(c.state))
        app.tray.confirm_restart = lambda plan: True
        app.tray.restart_daemon_action.trigger()
        qtbot.waitUntil(
            lambda: (
                app.state.connection.state == LinkState.CONNECTED
                and app.state.connection.daemon_pid not in (None, user_daemon.pid)
            ),
            timeout=60000,
        )
        assert LinkState.UNREACHABLE not in states, states  # no "daemon is not running"
        new = psutil.Process(app.state.connection.daemon_pid)
        assert new.cmdline()[-4:] == ["engines", "serve", "--simulate-gpus", "2"]
        assert app.state.connection.serve_args == ("--simulate-gpus", "2")
        assert user_daemon.wait(30) == 0
    finally:
        if user_daemon.poll() is None:
            user_daemon.terminate()
            user_daemon.wait(30)
        with qtbot.waitSignal(app.finished, timeout=30000):
            app.quit_with("stop")


@pytest.mark.slow
def test_stop_engines_and_quit_during_a_restart_leaves_no_daemon(
    qtbot, app_factory: AppFactory, paths: Paths, fake_env
) -> None:
    """Quit with "Stop engines and quit" while a restart is under way (the link is not
    connected): neither the old daemon nor a new one is left running."""
    _write_port(paths, free_loopback_port())
    app = app_factory(spawn_daemon=True, connect=False)
    qtbot.waitUntil(lambda: app.state.connection.state == LinkState.CONNECTED, timeout=30000)
    old = psutil.Process(app.state.connection.daemon_pid)
    app.actions.restart_daemon()
    qtbot.waitUntil(lambda: app.state.connection.state != LinkState.CONNECTED, timeout=10000)
    with qtbot.waitSignal(app.finished, timeout=30000):
        app.quit_with("stop")
    old.wait(30)
    home = os.environ["TRAYLM_HOME"]  # this test's own daemons only
    serving = [
        p
        for p in psutil.process_iter(["cmdline", "environ"])
        if (p.info["cmdline"] or [])[-2:] == ["engines", "serve"]
        and (p.info["environ"] or {}).get("TRAYLM_HOME") == home
    ]
    assert serving == [], serving
