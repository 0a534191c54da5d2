"""The dashboard against a real daemon with the FAKE vLLM env: the page framework (with an honest
placeholder for a page whose API does not exist yet), the Engines page (controls, live chart,
profile editor validated by the daemon, logs with diagnoses, environments and doctor) and the
Settings page (every change goes through PATCH /api/settings)."""

from __future__ import annotations

import shlex
import stat
import urllib.request

from PySide6.QtWidgets import QLabel

from desktop import autostart
from desktop.app import DesktopApp
from desktop.chat.keyfile import read_key
from desktop.dashboard.engines_page import EnginesPage
from desktop.dashboard.pages import PAGES, PageSpec
from desktop.dashboard.settings_page import SettingsPage
from desktop.dashboard.unavailable import UnavailablePage
from desktop.dashboard.window import DashboardWindow
from desktop.hf_token import token_path
from engines.events import EngineState
from tests.desktop.conftest import ThreadedDaemon


def _engines_page(app: DesktopApp) -> tuple[DashboardWindow, EnginesPage]:
    dash = app.open_dashboard("engines")
    page = dash.page("engines")
    assert isinstance(page, EnginesPage)
    return dash, page


def test_every_page_is_listed_and_built(qtbot, app) -> None:
    dash = app.open_dashboard("")
    assert dash.nav.count() == len(PAGES)
    assert dash.current_key() == "gpus"  # the first page
    assert [spec.key for spec in PAGES if not spec.available] == []
    for row, spec in enumerate(PAGES):
        dash.show_page(spec.key)
        assert dash.current_key() == spec.key
        assert not isinstance(dash.current_page(), UnavailablePage)
        assert dash.nav.item(row).toolTip() == spec.purpose


def test_a_page_without_its_api_is_said_plainly(
    qtbot, daemon_thread, app_factory, monkeypatch
) -> None:
    waiting = PageSpec("future", "Future", None, "What it will show.", "an API of issue 99")
    monkeypatch.setattr("desktop.dashboard.window.PAGES", (*PAGES, waiting))
    dash = app_factory().open_dashboard("")
    dash.show_page("future")
    page = dash.current_page()
    assert isinstance(page, UnavailablePage)
    text = " ".join(label.text() for label in page.findChildren(QLabel))
    assert "Not available in this daemon yet" in text
    assert "an API of issue 99" in text and "placeholder, not a finished page" in text
    assert dash.nav.item(len(PAGES)).text().endswith("(not yet)")


def test_engines_page_controls_and_live_chart(qtbot, app, daemon_thread: ThreadedDaemon):
    daemon_thread.write_fake_profile("fake")
    app.actions.reload_profiles()
    dash, page = _engines_page(app)
    qtbot.waitUntil(lambda: page.profile_picker.findText("fake") >= 0)
    page.profile_picker.setCurrentText("fake")
    page.start_button.click()
    qtbot.waitUntil(
        lambda: page.table.rowCount() == 1 and page.table.item(0, 1).text() == "ready",
        timeout=20000,
    )
    assert page.table.item(0, 2).text() == "fake"
    assert page.stop_button.isEnabled() and page.chat_button.isEnabled()
    # a request through the gateway shows up in the live chart (sampled every second)
    body = b'{"model": "fake", "messages": [], "max_tokens": 5}'
    request = urllib.request.Request(
        f"{daemon_thread.url}/v1/chat/completions",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(request).read()
    qtbot.waitUntil(lambda: (page.tokens_chart.latest("all models") or 0) > 0, timeout=10000)
    link = app.bridge.link
    assert link.metrics_interval_s == 1.0  # live charts on screen: sampled every second
    dash.hide()
    qtbot.waitUntil(lambda: link.metrics_interval_s == 5.0)  # hidden: only the tooltip's pace
    dash.show()
    page.chat_button.click()
    assert app.chat_window is not None and app.chat_window.model_picker.currentText() == "fake"
    page.stop_button.click()
    qtbot.waitUntil(lambda: page.table.item(0, 1).text() == "stopped", timeout=20000)
    assert daemon_thread.engine_state("fake") == EngineState.STOPPED


def test_profile_editor_is_validated_by_the_daemon(qtbot, app, daemon_thread) -> None:
    daemon_thread.write_fake_profile("fake")
    app.actions.reload_profiles()
    _, page = _engines_page(app)
    page.tabs.setCurrentWidget(page.profiles)
    editor = page.profiles
    qtbot.waitUntil(lambda: editor.list.count() > 0)
    editor.load_profile("fake")
    qtbot.waitUntil(lambda: editor.valid, timeout=5000)
    form = editor.form
    form.widgets["tensor_parallel_size"].setText("2")  # type: ignore[union-attr]
    form.widgets["device"].setCurrentText("cuda")  # type: ignore[union-attr]
    qtbot.waitUntil(lambda: "needs that many GPUs" in editor.validation.text(), timeout=5000)
    assert not editor.valid and not editor.save_button.isEnabled()
    form.widgets["gpus"].setText("0, 1")  # type: ignore[union-attr]
    qtbot.waitUntil(lambda: editor.valid, timeout=5000)
    form.widgets["max_num_seqs"].setText("many")  # type: ignore[union-attr]
    qtbot.waitUntil(lambda: "must be a whole number" in editor.validation.text(), timeout=5000)
    form.widgets["max_num_seqs"].setText("8")  # type: ignore[union-attr]
    editor.name.setText("fake-tp2")
    qtbot.waitUntil(lambda: editor.valid, timeout=5000)
    editor.save_button.click()
    qtbot.waitUntil(lambda: app.state.profile("fake-tp2") is not None, timeout=5000)
    saved = (daemon_thread.paths.profiles_dir / "fake-tp2.toml").read_text()
    assert "tensor_parallel_size = 2" in saved and "max_num_seqs = 8" in saved
    assert "gpus = [\n    0,\n    1,\n]" in saved or "gpus = [0, 1]" in saved


def test_logs_highlight_diagnoses_and_apply_their_suggestion(qtbot, app, daemon_thread):
    line = (
        "ValueError: To serve at least one request with the model's max seq len (8192), "
        "(1.0 GiB KV cache is needed, which is larger than the available KV cache memory "
        "(0.5 GiB). Based on the available memory, the estimated maximum model length is 4096."
    )
    daemon_thread.write_fake_profile(
        "broken", args=f"--print {shlex.quote(line)} --exit-after-print 1"
    )
    app.actions.reload_profiles()
    _, page = _engines_page(app)
    page.tabs.setCurrentWidget(page.logs)
    app.actions.start_profile("broken")
    logs = page.logs
    qtbot.waitUntil(lambda: logs.diagnosis_list.count() >= 1, timeout=20000)
    qtbot.waitUntil(lambda: line in logs.log.toPlainText(), timeout=5000)
    assert logs.highlighter.lines[line] == "error"
    block = logs.log.document().findBlock(logs.log.toPlainText().index(line))
    formats = block.layout().formats()
    assert formats and formats[0].format.background().color().name() == "#f8d7da"
    assert "max_model_len" in logs.advice.text()
    assert logs.apply_button.isVisibleTo(page)
    logs.apply_button.click()
    assert page.tabs.currentWidget() is page.profiles
    assert page.profiles.name.text() == "broken"
    assert page.profiles.form.widgets["max_model_len"].text() == "4096"  # type: ignore[union-attr]


def test_environments_and_doctor(qtbot, app, daemon_thread) -> None:
    _, page = _engines_page(app)
    page.tabs.setCurrentWidget(page.envs)
    envs = page.envs
    qtbot.waitUntil(lambda: envs.table.rowCount() == 1, timeout=5000)
    assert envs.table.item(0, 0).text() == "vllm-0.32.0-cpu"
    envs.table.selectRow(0)
    envs.doctor_button.click()
    qtbot.waitUntil(lambda: "metadata" in envs.report.text(), timeout=10000)
    assert "install finished" in envs.report.text()
    assert "FAIL" in envs.report.text()  # the FAKE env's python is no vLLM: imports fail
    assert "fix:" in envs.report.text()


def _settings_page(app: DesktopApp) -> SettingsPage:
    page = app.open_dashboard("settings").page("settings")
    assert isinstance(page, SettingsPage)
    return page


def test_settings_apply_through_the_daemon_with_its_docs(qtbot, app, daemon_thread) -> None:
    page = _settings_page(app)
    assert page.port.value() == daemon_thread.port
    assert page.port.toolTip() == "Port of the OpenAI-compatible endpoint."
    assert "Electricity price" in page.price.toolTip()
    page.price.setValue(0.42)
    page.price.editingFinished.emit()
    qtbot.waitUntil(lambda: page.result.property("ok") is True, timeout=5000)
    assert "electricity_price_per_kwh = 0.42" in daemon_thread.paths.config_file.read_text()
    page.simulate.setValue(2)
    page.simulate.editingFinished.emit()
    qtbot.waitUntil(lambda: app.state.settings.gpu.simulate_gpus == 2, timeout=5000)
    page.quit_action.setCurrentText("leave")
    qtbot.waitUntil(lambda: app.state.settings.ui.quit_action == "leave", timeout=5000)
    page.port.setValue(daemon_thread.port + 1)
    page.port.editingFinished.emit()
    qtbot.waitUntil(lambda: "daemon restarts" in page.result.text(), timeout=5000)


def test_lan_sharing_refused_without_a_key_then_allowed(qtbot, app, daemon_thread) -> None:
    page = _settings_page(app)
    assert not page.lan.isEnabled()  # no key yet: the switch explains why it is off
    assert "Add an API key first" in page.lan.toolTip()
    app.actions.update_settings({"gateway.lan_sharing": True})  # even if asked: refused
    notice = app.dashboard.notice  # errors stay in the notice bar, wrapped, until dismissed
    qtbot.waitUntil(lambda: "no API key" in notice.label.text(), timeout=5000)
    assert notice.isVisibleTo(app.dashboard)
    page.findChild(type(page.restart_daemon), "addApiKey").click()
    qtbot.waitUntil(lambda: page.keys.count() == 1, timeout=5000)
    key = page.new_key.text()
    assert key.startswith("tlm-") and page.new_key.isVisible()
    assert read_key(daemon_thread.paths) == key  # the chat window can use it
    assert page.lan.isEnabled()
    page.lan.setChecked(True)
    qtbot.waitUntil(lambda: app.state.settings.gateway.lan_sharing, timeout=5000)
    # a key the LAN needs cannot be removed while sharing is on
    page.keys.setCurrentRow(0)
    page.findChild(type(page.restart_daemon), "removeApiKey").click()
    qtbot.waitUntil(lambda: page.result.property("ok") is False, timeout=5000)
    assert "no API key" in page.result.text()
    assert page.keys.count() == 1


def test_autostart_toggle_writes_the_xdg_entry(qtbot, app, daemon_thread, tmp_path) -> None:
    page = _settings_page(app)
    entry = tmp_path / "xdg-config" / "autostart" / "traylm.desktop"
    assert autostart.autostart_path() == entry and not page.autostart.isChecked()
    page.autostart.setChecked(True)
    qtbot.waitUntil(lambda: app.state.settings.ui.autostart, timeout=5000)
    text = entry.read_text()
    assert "[Desktop Entry]" in text and "Exec=" in text and "traylm" in text
    page.autostart.setChecked(False)
    qtbot.waitUntil(lambda: not app.state.settings.ui.autostart, timeout=5000)
    assert not entry.exists()


def test_hf_token_is_saved_privately(qtbot, app, daemon_thread, tmp_path) -> None:
    page = _settings_page(app)
    assert "No token" in page.hf_status.text()
    page.hf_token.setText("hf_secret")
    page.findChild(type(page.restart_daemon), "saveHfToken").click()
    path = token_path()
    assert path == tmp_path / "hf-home" / "token"
    assert path.read_text() == "hf_secret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "saved in" in page.hf_status.text() and page.hf_token.text() == ""
