"""What the app shows comes from the daemon's events and stays true: one test per stale text a
new user met (a REAL daemon, the FAKE vLLM engine, the REAL installer with the FAKE wheel).
Every error offers its fix as a button, with the CLI command as a hint."""

from __future__ import annotations

import dataclasses
import shlex
import shutil
from pathlib import Path

import pytest

from desktop.app import DesktopApp
from desktop.chat.window import ChatWindow
from desktop.dashboard.engines_page import EnginesPage
from desktop.dashboard.models_page import ModelsPage
from engines.config.sections import Paths
from engines.core.procs import free_loopback_port
from engines.envs.manager import RECIPES
from engines.events import EngineState
from tests.conftest import fast_settings
from tests.desktop.conftest import AppFactory, ThreadedDaemon
from tests.fakes.fake_trt_env import make_tiny_hf_model
from tests.fakes.fake_vllm_wheel import build_fake_vllm_wheel, fake_cpu_recipe

KV_LINE = (
    "ValueError: To serve at least one request with the model's max seq len (8192), "
    "(1.0 GiB KV cache is needed, which is larger than the available KV cache memory "
    "(0.5 GiB). Based on the available memory, the estimated maximum model length is 4096."
)


def _engines_page(app: DesktopApp) -> EnginesPage:
    page = app.open_dashboard("engines").page("engines")
    assert isinstance(page, EnginesPage)
    return page


def test_an_engine_started_elsewhere_shows_its_version_and_device(
    qtbot, app: DesktopApp, daemon_thread: ThreadedDaemon
) -> None:
    page = _engines_page(app)
    daemon_thread.write_fake_profile("fake")
    daemon_thread.run(lambda c: c.start("fake"))  # from the CLI, say: the app only hears events
    qtbot.waitUntil(lambda: app.state.engines.get("fake") is not None, timeout=10000)
    qtbot.waitUntil(lambda: app.state.engines["fake"].version == "0.32.0", timeout=10000)
    assert app.state.engines["fake"].device == "cpu"
    qtbot.waitUntil(lambda: app.state.engines["fake"].state == EngineState.READY, timeout=20000)
    page.table.selectRow(0)
    assert "(vllm 0.32.0, cpu)" in page.detail.text()


@pytest.mark.slow
def test_the_environments_tab_follows_an_install(
    qtbot, paths: Paths, app_factory: AppFactory, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setitem(RECIPES, ("vllm", "cpu"), fake_cpu_recipe(build_fake_vllm_wheel(tmp_path)))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    d = ThreadedDaemon(paths, fast_settings(free_loopback_port())).start()
    try:
        app = app_factory()
        page = _engines_page(app)
        page.tabs.setCurrentWidget(page.envs)
        envs = page.envs
        qtbot.waitUntil(lambda: "No engine installed yet" in envs.report.text(), timeout=5000)
        envs.device.setCurrentIndex(envs.device.findData("cpu"))
        envs.install_button.click()
        qtbot.waitUntil(lambda: envs.install_status.state == "ok", timeout=240000)
        qtbot.waitUntil(
            lambda: envs.table.rowCount() == 1 and envs.table.item(0, 4).text() == "yes",
            timeout=10000,
        )
        assert "No engine installed yet" not in envs.report.text()
        # the app's env list follows the install's events (the table may be drawn first)
        qtbot.waitUntil(
            lambda: [e.name for e in app.state.envs or ()] == ["vllm-0.32.0-cpu"], timeout=10000
        )
    finally:
        d.stop()


def _ask_a_fake_that_fails(qtbot, app: DesktopApp, d: ThreadedDaemon) -> ChatWindow:
    """A chat with the profile "fake", whose engine fails its start (the KV cache diagnosis)."""
    d.write_fake_profile(
        "fake", args=f"--startup-delay 0.5 --print {shlex.quote(KV_LINE)} --exit-after-print 1"
    )
    app.actions.reload_profiles()
    qtbot.waitUntil(lambda: app.state.profile("fake") is not None)
    chat = app.open_chat("")
    chat.select_model("fake")
    chat.composer.setPlainText("are you there?")
    chat.on_send_clicked()
    return chat


def test_a_chat_whose_model_fails_to_load_says_why_with_the_engines_log(
    qtbot, app: DesktopApp, daemon_thread: ThreadedDaemon
) -> None:
    """Models on demand: sending loads the model; a load that fails answers with the engine's
    diagnosis, and the card offers its log (and Retry)."""
    chat = _ask_a_fake_that_fails(qtbot, app, daemon_thread)
    card = chat.transcript.error_card
    qtbot.waitUntil(card.isVisible, timeout=20000)
    assert card.message.text().startswith("fake failed to load")
    assert "KV cache" in card.message.text() and "max_model_len = 4096" in card.message.text()
    log = card.button("loadFix")
    assert log is not None and log.text() == "Open the log of fake"
    assert card.hint.text() == "or in a terminal: traylm logs fake"
    assert card.button("retry") is not None
    log.click()
    page = _engines_page(app)
    assert page.tabs.currentWidget() is page.logs and page.logs.picker.currentText() == "fake"


def test_with_jit_off_the_chats_starting_card_says_when_the_start_failed_with_its_fix(
    qtbot, paths: Paths, fake_env: Path, app_factory: AppFactory
) -> None:
    """engines.jit = false: the model is not loaded on send; the card's Start button starts it
    and the card follows the start, saying why it failed."""
    base = fast_settings(free_loopback_port())
    jit_off = dataclasses.replace(base, engines=dataclasses.replace(base.engines, jit=False))
    d = ThreadedDaemon(paths, jit_off).start()
    try:
        app = app_factory()
        chat = _ask_a_fake_that_fails(qtbot, app, d)
        card = chat.transcript.error_card
        qtbot.waitUntil(card.isVisible, timeout=5000)
        assert "'fake' is not loaded (engines.jit is off)" in card.message.text()
        start = card.button("startEngine")
        assert start is not None
        start.click()
        assert card.message.text().startswith("Starting fake")
        qtbot.waitUntil(lambda: "could not start" in card.message.text(), timeout=20000)
        assert "KV cache" in card.message.text()  # the diagnosis, not a stale "Starting…"
        assert chat.controller.retry_when_served == ""
        log = card.button("startFix")
        assert log is not None and log.text() == "Open its log"
        assert card.hint.text() == "or in a terminal: traylm logs fake"
        assert card.button("startEngine") is not None  # and Start again
        log.click()
        page = _engines_page(app)
        assert page.tabs.currentWidget() is page.logs and page.logs.picker.currentText() == "fake"
    finally:
        d.stop()


def test_a_start_refused_at_once_offers_the_install_in_app(
    qtbot, sim_app: DesktopApp, sim_daemon_thread: ThreadedDaemon, fake_cuda_env: Path
) -> None:
    """GPUs (simulated) but no CUDA build of vLLM: the start is refused for the engine."""
    shutil.rmtree(fake_cuda_env)  # the simulated computer's FAKE CUDA build is not installed
    app = sim_app
    sim_daemon_thread.write_profile("gpu-only", model="org/m", device="cuda")
    app.actions.reload_profiles()
    qtbot.waitUntil(lambda: app.state.profile("gpu-only") is not None)
    dash = app.open_dashboard("engines")
    app.actions.start_profile("gpu-only")
    notice = dash.notice
    qtbot.waitUntil(notice.isVisible, timeout=10000)
    assert "no vllm engine (cuda build) is installed" in notice.label.text()
    assert notice.fix_button.text() == "Install the engine…"
    assert notice.hint.text() == "or in a terminal: traylm engines install vllm"
    notice.fix_button.click()
    assert app.setup is not None and app.setup.isVisible()
    assert len([n for n in app.notifier.history if n.level == "error"]) == 1  # said once


def test_the_tray_lists_library_folders_and_starts_one(
    qtbot, app: DesktopApp, daemon_thread: ThreadedDaemon, tmp_path: Path
) -> None:
    folder = make_tiny_hf_model(tmp_path / "my-llama")
    page = app.open_dashboard("models").page("models")
    assert isinstance(page, ModelsPage)
    page.show_library()
    view = page.folders
    view.choose_folder = lambda _parent, _start: str(tmp_path)  # not a model: said plainly
    view.add_button.click()
    qtbot.waitUntil(lambda: view.result.state == "error", timeout=10000)
    assert "is not a model folder: no config.json" in view.result.message
    view.choose_folder = lambda _parent, _start: str(folder)
    view.add_button.click()
    qtbot.waitUntil(lambda: view.table.rowCount() == 1, timeout=10000)
    assert view.table.item(0, 0).text() == "my-llama"
    assert view.table.item(0, 4).text() == "ready to serve"
    # the next Browse… opens beside the last model folder, not in the home folder
    asked: list[str] = []
    view.choose_folder = lambda _parent, start: asked.append(start) or ""
    view.add_button.click()
    assert asked == [str(tmp_path)]

    app.tray.menu.aboutToShow.emit()
    [start] = [a for a in app.tray.models_menu.actions() if a.objectName() == "library:my-llama"]
    assert start.text() == "Start my-llama" and start.isEnabled()
    start.trigger()
    qtbot.waitUntil(lambda: app.state.served_models() == ["my-llama"], timeout=20000)
    app.tray.menu.aboutToShow.emit()
    names = [a.objectName() for a in app.tray.models_menu.actions()]
    assert "model:my-llama" in names and "library:my-llama" not in names
    daemon_thread.run(lambda c: c.stop("my-llama"))

    # deleted while registered: the library says what is missing; the tray cannot start it
    shutil.rmtree(folder)
    app.bridge.call(app.bridge.link.load_library)
    qtbot.waitUntil(lambda: "does not exist" in view.table.item(0, 4).text(), timeout=10000)
    app.tray.menu.aboutToShow.emit()
    [start] = [a for a in app.tray.models_menu.actions() if a.objectName() == "library:my-llama"]
    assert not start.isEnabled() and "does not exist" in start.text()


@pytest.mark.parametrize("answer", ["", "/models/llama"])
def test_the_profile_editors_model_field_has_a_browse_button(
    qtbot, app: DesktopApp, answer: str
) -> None:
    page = _engines_page(app)
    form = page.profiles.form
    form.widgets["model"].setText("org/name")
    starts: list[str] = []
    form.choose_folder = lambda _parent, start: starts.append(start) or answer
    browse = form.findChild(type(page.start_button), "browseModel")
    assert browse is not None
    browse.click()
    assert form.widgets["model"].text() == (answer or "org/name")  # cancelled: unchanged
    assert starts == [""]  # a Hub id is no place to look, and the library has no folder yet


def test_an_offline_hub_search_says_so_across_the_page_with_its_fix(
    qtbot, paths: Paths, fake_env: Path, app_factory: AppFactory, monkeypatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_loopback_port()}")  # no Hub
    d = ThreadedDaemon(paths, fast_settings(free_loopback_port())).start()
    try:
        app = app_factory()
        page = app.open_dashboard("models").page("models")
        assert isinstance(page, ModelsPage)
        search = page.search
        search.query.setText("qwen")
        search.search_button.click()
        qtbot.waitUntil(lambda: search.status.state == "error", timeout=30000)
        assert "cannot reach" in search.status.message
        assert search.status.width() > search.width() // 2  # not squeezed into a column
        assert search.fix_button.isVisible()
        assert search.fix_button.text() == "Use a model folder on this computer…"
        asked: list[bool] = []
        page.folders.choose_folder = lambda _parent, _start: asked.append(True) or ""
        search.fix_button.click()
        assert asked == [True] and page.tabs.currentWidget() is page.shelf
    finally:
        d.stop()


@pytest.mark.slow
def test_while_it_starts_the_engines_table_tooltip_and_chat_show_port_pid_and_stage(
    qtbot, app: DesktopApp, daemon_thread: ThreadedDaemon
) -> None:
    line = "(Worker pid=7) INFO [cpu_model_runner.py:68] Starting to load model /models/x..."
    daemon_thread.write_fake_profile("fake", args=f"--print {shlex.quote(line)} --startup-delay 3")
    page = _engines_page(app)
    app.actions.start_profile("fake")

    def starting_with_pid() -> bool:
        e = app.state.engines.get("fake")
        return e is not None and e.state == EngineState.STARTING and e.pid is not None

    qtbot.waitUntil(starting_with_pid, timeout=10000)
    # the start's phases come as engine.phase events; the printed line begins "weights" at once
    qtbot.waitUntil(lambda: app.state.engines["fake"].phase == "weights", timeout=10000)
    e = app.state.engines["fake"]
    assert e.phase_label == "loading weights" and e.phases[-1].phase == "weights"
    row = [page.table.item(0, c).text() for c in range(page.table.columnCount())]
    assert row[:2] == ["fake", "starting"] and row[3] == str(e.port) and row[4] == str(e.pid)
    assert row[6] == "loading weights"
    assert "fake: starting (loading weights)" in app.tray.icon.toolTip()
    qtbot.waitUntil(lambda: app.state.engines["fake"].state == EngineState.READY, timeout=20000)
