"""The tray (offscreen: its menu and state, without a panel) against a real daemon with the FAKE
vLLM env: the icon follows engine state, the menu starts, stops and restarts engines,
notifications say ready/failed with the diagnosis, and Quit asks and is remembered."""

from __future__ import annotations

import shlex
import threading

import openai
import pytest
from PySide6.QtGui import QAction, QGuiApplication

from desktop.app import DesktopApp
from desktop.daemon.notify import Notification
from desktop.tray.icons import TrayState
from engines.events import EngineState, EngineStatus, GatewayThroughput
from engines.gpu.sim import sim_uuid
from tests.desktop.conftest import AppFactory, ThreadedDaemon


def _engine_state(app: DesktopApp, engine_id: str) -> EngineState | None:
    engine = app.state.engines.get(engine_id)
    return engine.state if engine else None


def _menu_action(app: DesktopApp, name: str) -> QAction:
    app.tray.menu.aboutToShow.emit()  # the menu refreshes itself when it opens
    for action in [*app.tray.menu.actions(), *app.tray.profiles_menu.actions()]:
        if action.objectName() == name:
            return action
    raise AssertionError(f"no menu action {name}")


@pytest.mark.slow
def test_tray_follows_engine_state_and_menu_starts_and_stops(
    qtbot, app: DesktopApp, daemon_thread: ThreadedDaemon
) -> None:
    daemon_thread.write_fake_profile("fake", args="--startup-delay 0.5")
    app.actions.reload_profiles()
    qtbot.waitUntil(lambda: app.state.profile("fake") is not None)
    assert app.tray.current == TrayState.STOPPED
    assert "no engine running" in app.tray.icon.toolTip()

    states: list[TrayState] = []
    app.tray.state_changed.connect(states.append)
    with qtbot.waitSignal(app.notifier.notified, timeout=20000) as ready_note:
        _menu_action(app, "profile:fake").trigger()  # Profiles ▸ fake starts it
    note = ready_note.args[0]
    assert isinstance(note, Notification) and note.title == "fake is ready"
    assert app.tray.current == TrayState.READY
    assert TrayState.STARTING in states  # it passed through starting
    assert daemon_thread.engine_state("fake") == EngineState.READY
    tooltip = app.tray.icon.toolTip()
    assert f"{daemon_thread.url}/v1" in tooltip and "fake: ready" in tooltip
    assert app.state.settings is not None
    qtbot.waitUntil(lambda: app.state.settings.ui.last_profile == "fake")  # remembered

    stop = _menu_action(app, "stop")
    assert stop.text() == "Stop fake" and stop.isEnabled()
    stop.trigger()
    qtbot.waitUntil(lambda: app.tray.current == TrayState.STOPPED, timeout=20000)
    assert daemon_thread.engine_state("fake") == EngineState.STOPPED

    start = _menu_action(app, "start")
    assert start.text() == "Start fake" and start.isEnabled()
    start.trigger()
    qtbot.waitUntil(lambda: _engine_state(app, "fake") == EngineState.READY, timeout=20000)
    restarted: list[EngineState] = []
    app.state.engines_changed.connect(lambda: restarted.append(_engine_state(app, "fake")))
    _menu_action(app, "restart").trigger()
    qtbot.waitUntil(
        lambda: EngineState.STOPPED in restarted and restarted[-1] == EngineState.READY,
        timeout=20000,
    )


def test_failed_engine_turns_the_tray_red_and_notifies_the_diagnosis(
    qtbot, app: DesktopApp, daemon_thread: ThreadedDaemon
) -> None:
    line = (
        "ValueError: To serve at least one request with the model's max seq len (8192), "
        "(1.0 GiB KV cache is needed, which is larger than the available KV cache memory "
        "(0.5 GiB). Based on the available memory, the estimated maximum model length is 4096."
    )
    daemon_thread.write_fake_profile(
        "broken", args=f"--print {shlex.quote(line)} --exit-after-print 1"
    )
    notes: list[Notification] = []
    app.notifier.notified.connect(notes.append)
    app.actions.start_profile("broken")
    qtbot.waitUntil(lambda: app.tray.current == TrayState.ERROR, timeout=20000)
    qtbot.waitUntil(lambda: any(n.title == "broken failed" for n in notes))
    failed = next(n for n in notes if n.title == "broken failed")
    assert failed.level == "error"
    assert "max_model_len" in failed.message  # the diagnosis's advice, not just "failed"
    assert "broken: failed" in app.tray.icon.toolTip()


def test_busy_while_a_reply_streams(qtbot, app: DesktopApp, daemon_thread) -> None:
    daemon_thread.write_fake_profile("fake", args="--token-delay 0.05")
    app.actions.start_profile("fake")
    qtbot.waitUntil(lambda: app.tray.current == TrayState.READY, timeout=20000)
    chat = app.open_chat("fake")
    qtbot.waitUntil(lambda: "fake" in chat.controller.loaded, timeout=5000)
    chat.max_tokens.setValue(400)
    chat.composer.setPlainText("go")
    chat.on_send_clicked()
    qtbot.waitUntil(lambda: app.tray.current == TrayState.BUSY, timeout=5000)
    chat.controller.stop()
    qtbot.waitUntil(lambda: app.tray.current == TrayState.READY, timeout=5000)


def test_copy_endpoint_and_lan_state(qtbot, app: DesktopApp, daemon_thread) -> None:
    _menu_action(app, "copyUrl").trigger()
    assert QGuiApplication.clipboard().text() == f"{daemon_thread.url}/v1"
    lan = _menu_action(app, "lan")
    assert lan.text().startswith("LAN sharing: off")
    lan.trigger()
    assert app.dashboard is not None
    qtbot.waitUntil(lambda: app.dashboard.current_key() == "settings")


def test_models_submenu_opens_the_chat_with_that_model(qtbot, app: DesktopApp, daemon_thread):
    daemon_thread.write_fake_profile("fake")
    app.actions.start_profile("fake")
    qtbot.waitUntil(lambda: app.state.served_models() == ["fake"], timeout=20000)
    app.tray.menu.aboutToShow.emit()
    (action,) = [a for a in app.tray.models_menu.actions() if a.objectName() == "model:fake"]
    action.trigger()
    assert app.chat_window is not None and app.chat_window.isVisible()
    assert app.chat_window.model_picker.currentText() == "fake"


def test_the_models_menu_unloads_a_loaded_model(qtbot, app: DesktopApp, daemon_thread) -> None:
    """Models on demand: a model loaded by its first request is listed under Loaded with
    Unload; unloading stops its engine and the entry goes away."""
    daemon_thread.write_fake_profile("fake")
    daemon_thread.run(lambda c: c.load_model("fake"))
    qtbot.waitUntil(lambda: app.state.served_models() == ["fake"], timeout=20000)
    # what Stop and Unload do, on hover (a menu hides its actions' tooltips unless told)
    assert "cut off" in _menu_action(app, "stop").toolTip()
    assert "start it again" in _menu_action(app, "restart").toolTip()
    app.tray.menu.aboutToShow.emit()
    (unload,) = [a for a in app.tray.models_menu.actions() if a.objectName() == "unload:fake"]
    assert unload.text() == "Unload fake"
    assert "once the replies it is writing are done" in unload.toolTip()
    assert app.tray.models_menu.toolTipsVisible() and app.tray.menu.toolTipsVisible()
    unload.trigger()
    qtbot.waitUntil(lambda: _engine_state(app, "fake") == EngineState.STOPPED, timeout=20000)
    assert daemon_thread.engine_state("fake") == EngineState.STOPPED
    app.tray.menu.aboutToShow.emit()
    assert not [a for a in app.tray.models_menu.actions() if a.objectName() == "unload:fake"]


def test_a_sleeping_model_counts_as_loaded(qtbot, app: DesktopApp) -> None:
    """vLLM sleep mode (CUDA only, so not startable here): a sleeping engine is live, chat-able
    (a request wakes it) and offered for unload; the tray shows it as ready."""
    status = EngineStatus(
        "big", "vllm", EngineState.SLEEPING, ("big",), 1234, 99, 0, "", None, None, None, "big",
        "cuda", "0.32.0",
    )  # fmt: skip
    app.state.engines["big"] = status
    app.state.engines_changed.emit()
    assert app.state.live_engines() == [status] and app.state.served_models() == ["big"]
    assert app.tray.current == TrayState.READY
    app.tray.menu.aboutToShow.emit()
    names = {a.objectName(): a.text() for a in app.tray.models_menu.actions()}
    assert names["model:big"] == "Chat with big" and names["unload:big"] == "Unload big (asleep)"


def test_without_a_system_tray_the_dashboard_is_the_main_window(
    qtbot, daemon_thread, app_factory: AppFactory
) -> None:
    app = app_factory()  # offscreen has no system tray
    assert app.fallback
    assert app.dashboard is not None and app.dashboard.isVisible()
    assert app.dashboard.fallback_note.isVisible()
    menus = [a.text() for a in app.dashboard.menuBar().actions()]
    assert menus == ["traylm"]  # the tray's menu, in the menu bar
    daemon_thread.run(lambda c: c.update_settings({"ui.quit_action": "leave"}))
    app.actions.reload_profiles()
    app.bridge.call(app.bridge.link.load_settings)
    qtbot.waitUntil(lambda: app.state.settings.ui.quit_action == "leave")
    with qtbot.waitSignal(app.finished, timeout=10000):
        app.dashboard.close()  # closing the main window quits (here: leave serving)
    assert daemon_thread.run(lambda c: c.status())["version"]  # the daemon still serves


def test_quit_asks_and_remembers_stop(qtbot, daemon_thread, app_factory: AppFactory) -> None:
    app = app_factory()
    daemon_thread.write_fake_profile("fake")
    app.actions.start_profile("fake")
    qtbot.waitUntil(lambda: _engine_state(app, "fake") == EngineState.READY, timeout=20000)
    app.request_quit()
    dialog = app.quit_dialog
    assert dialog is not None and dialog.isVisible()
    assert "1 engine running (fake)" in dialog.informativeText()
    dialog.cancel_button.click()
    assert not app._finished
    app.request_quit()
    dialog = app.quit_dialog
    assert dialog is not None
    dialog.remember.setChecked(True)
    with qtbot.waitSignal(app.finished, timeout=30000):
        dialog.stop_button.click()
    # remembered, and the daemon was asked to stop (it stops its engines first)
    config = daemon_thread.paths.config_file.read_text()
    assert 'quit_action = "stop"' in config
    qtbot.waitUntil(lambda: not daemon_thread.paths.daemon_json.exists(), timeout=30000)


@pytest.mark.slow
def test_throughput_comes_from_the_daemons_events(qtbot, app: DesktopApp, daemon_thread) -> None:
    """Another program's stream makes the tray busy and shows its tokens per second, from the
    daemon's throughput events (no /metrics scraping); the zero event after it ends clears both."""
    daemon_thread.write_fake_profile("fake", args="--token-delay 0.2")
    app.actions.start_profile("fake")
    qtbot.waitUntil(lambda: app.tray.current == TrayState.READY, timeout=20000)
    samples: list[object] = []
    app.state.throughput_sampled.connect(samples.append)
    client = openai.OpenAI(base_url=f"{daemon_thread.url}/v1", api_key="unused", max_retries=0)

    def ask() -> None:
        stream = client.chat.completions.create(
            model="fake", messages=[{"role": "user", "content": "hi"}], max_tokens=10, stream=True
        )
        for _ in stream:
            pass

    asker = threading.Thread(target=ask)
    asker.start()
    qtbot.waitUntil(lambda: app.tray.current == TrayState.BUSY, timeout=10000)
    qtbot.waitUntil(lambda: "tokens/s" in app.tray.icon.toolTip() and any(
        isinstance(s, GatewayThroughput) and s.tokens_per_s > 0 for s in samples
    ), timeout=20000)  # fmt: skip
    asker.join(timeout=20)
    qtbot.waitUntil(lambda: app.tray.current == TrayState.READY, timeout=10000)
    qtbot.waitUntil(lambda: samples[-1] == app.state.throughput and not (
        app.state.throughput.tokens_per_s or app.state.throughput.in_flight
    ), timeout=10000)  # fmt: skip
    assert "0.0 tokens/s" in app.tray.icon.toolTip()
    client.close()


def test_a_tuners_engine_never_becomes_the_model_the_tray_starts(
    qtbot, app: DesktopApp, daemon_thread: ThreadedDaemon
) -> None:
    """Relaunched mid-tune with no model chatted with yet: the live engine is the tuner's
    measurement (tune-...), gone when the tune ends; Start names the user's own model."""
    daemon_thread.write_fake_profile("mine")
    daemon_thread.write_fake_profile("tune-mine")  # stands for the tuner's candidate engine
    daemon_thread.run(lambda c: c.start("tune-mine"))
    app.actions.reload_profiles()
    qtbot.waitUntil(lambda: _engine_state(app, "tune-mine") == EngineState.READY, timeout=20000)
    assert app.state.settings is not None and app.state.settings.ui.last_profile == ""
    assert app.state.current_profile() == "mine"
    assert _menu_action(app, "start").text() == "Start mine"


def _efficiency_action(app: DesktopApp, name: str):  # type: ignore[no-untyped-def]
    app.tray.menu.aboutToShow.emit()  # the menu refreshes itself when it opens
    menu = app.tray.efficiency_menu
    return next(a for a in menu.actions() if a.objectName() == f"efficiency:{name}")


def test_the_tray_menu_switches_the_efficiency_profile(qtbot, sim_app, sim_daemon_thread) -> None:
    app, d = sim_app, sim_daemon_thread
    qtbot.waitUntil(lambda: app.state.gpu.efficiency is not None, timeout=5000)
    menu = app.tray.efficiency_menu
    app.tray.menu.aboutToShow.emit()
    assert menu.title() == "GPU efficiency" and menu.menuAction().isVisible()
    assert [a.text() for a in menu.actions()] == ["quiet", "eco", "max"]
    assert not any(a.isChecked() for a in menu.actions())
    assert _efficiency_action(app, "quiet").toolTip().startswith("60 % power")
    d.run(lambda c: c.set_efficiency_profile("eco"))
    qtbot.waitUntil(lambda: _efficiency_action(app, "eco").isChecked(), timeout=10000)
    notes: list[Notification] = []
    app.notifier.notified.connect(notes.append)
    _efficiency_action(app, "quiet").trigger()
    qtbot.waitUntil(lambda: any(n.title == "GPU efficiency" for n in notes), timeout=20000)
    note = next(n for n in notes if n.title == "GPU efficiency")
    assert note.level == "info" and note.message == "quiet is in force on 2 simulated GPUs"
    assert d.run(lambda c: c.efficiency_profiles()).in_force == {
        sim_uuid(0): "quiet",
        sim_uuid(1): "quiet",
    }
    # the menu is filled again from the daemon's answer: the check moved
    qtbot.waitUntil(lambda: app.state.gpu.profile_in_force() == "quiet", timeout=5000)
    assert [a.text() for a in menu.actions() if a.isChecked()] == ["quiet"]


def test_a_refused_profile_in_the_tray_is_said_and_the_check_stays(
    qtbot, sim_app, sim_daemon_thread
) -> None:
    app, d = sim_app, sim_daemon_thread
    folder = d.paths.config_dir / "efficiency"
    folder.mkdir(parents=True)
    (folder / "far.toml").write_text("[gpus.5]\npower_w = 300\n")  # a GPU that is gone
    d.run(lambda c: c.set_efficiency_profile("eco"))
    app.actions.reload_efficiency()
    qtbot.waitUntil(lambda: app.state.gpu.profile_in_force() == "eco", timeout=10000)
    notes: list[Notification] = []
    app.notifier.notified.connect(notes.append)
    _efficiency_action(app, "far").trigger()  # Qt checks it at once; the daemon refuses it
    qtbot.waitUntil(lambda: any(n.level == "error" for n in notes), timeout=20000)
    note = next(n for n in notes if n.level == "error")
    assert note.title == "switching the GPUs to far failed"
    assert "names GPU '5', which is not here" in note.message
    qtbot.waitUntil(lambda: _efficiency_action(app, "eco").isChecked(), timeout=5000)
    assert not _efficiency_action(app, "far").isChecked()
    assert d.run(lambda c: c.efficiency_profiles()).in_force == {
        sim_uuid(0): "eco",
        sim_uuid(1): "eco",
    }
