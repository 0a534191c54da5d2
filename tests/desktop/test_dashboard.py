"""The dashboard against a real daemon with the FAKE vLLM env: the page framework (with an honest
placeholder for a page whose API does not exist yet), the Engines page (controls, live chart,
profile editor validated by the daemon, logs with diagnoses, environments and doctor) and the
Settings page (every change goes through PATCH /api/settings)."""

from __future__ import annotations

import asyncio
import re
import shlex
import socket
import stat
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from PySide6.QtGui import QStandardItemModel
from PySide6.QtWidgets import QLabel

import desktop.daemon.link
from desktop.app import DesktopApp
from desktop.daemon.keyfile import read_key
from desktop.dashboard.engines_page import EnginesPage
from desktop.dashboard.pages import PAGES, PageSpec
from desktop.dashboard.settings_page import SettingsPage
from desktop.dashboard.unavailable import UnavailablePage
from desktop.dashboard.window import DashboardWindow
from desktop.session import autostart
from engines.client import DaemonClient
from engines.core.procs import free_loopback_port
from engines.envs.manager import EnvManager
from engines.errors import DaemonUnavailable
from engines.events import EngineState, EnvInstallProgress
from tests.desktop.conftest import AppFactory, ThreadedDaemon
from tests.fakes.fake_trt_env import make_tiny_hf_model


def _engines_page(app: DesktopApp) -> tuple[DashboardWindow, EnginesPage]:
    dash = app.open_dashboard("engines")
    page = dash.page("engines")
    assert isinstance(page, EnginesPage)
    return dash, page


def test_every_page_is_listed_and_built(qtbot, app) -> None:
    dash = app.open_dashboard("")
    assert dash.nav.count() == len(PAGES)
    # no GPU here: once the daemon says so, the landing page is Engines, not the empty GPUs
    qtbot.waitUntil(lambda: dash.current_key() == "engines", timeout=5000)
    assert [spec.key for spec in PAGES if not spec.available] == []
    for row, spec in enumerate(PAGES):
        dash.show_page(spec.key)
        assert dash.current_key() == spec.key
        assert not isinstance(dash.current_page(), UnavailablePage)
        assert dash.nav.item(row).toolTip() == spec.purpose


def test_a_page_without_its_api_is_said_plainly(
    qtbot, daemon_thread, app_factory, monkeypatch
) -> None:
    waiting = PageSpec("future", "Future", None, "What it will show.", "an API not built yet")
    monkeypatch.setattr("desktop.dashboard.window.PAGES", (*PAGES, waiting))
    dash = app_factory().open_dashboard("")
    dash.show_page("future")
    page = dash.current_page()
    assert isinstance(page, UnavailablePage)
    text = " ".join(label.text() for label in page.findChildren(QLabel))
    assert "Not available in this daemon yet" in text
    assert "an API not built yet" in text and "placeholder, not a finished page" in text
    assert dash.nav.item(len(PAGES)).text().endswith("(not yet)")


def test_engines_page_controls_and_live_chart(qtbot, app, daemon_thread: ThreadedDaemon):
    daemon_thread.write_fake_profile("fake")
    app.actions.reload_profiles()
    _, page = _engines_page(app)
    qtbot.waitUntil(lambda: page.profile_picker.findText("fake") >= 0)
    page.profile_picker.setCurrentText("fake")
    page.start_button.click()
    qtbot.waitUntil(
        lambda: page.table.rowCount() == 1 and page.table.item(0, 1).text() == "ready",
        timeout=20000,
    )
    assert page.table.item(0, 2).text() == "fake"
    assert page.stop_button.isEnabled() and page.chat_button.isEnabled()
    # a request through the gateway shows up in the live chart (the daemon's throughput
    # events, about one a second while requests run)
    body = b'{"model": "fake", "messages": [], "max_tokens": 5}'
    request = urllib.request.Request(
        f"{daemon_thread.url}/v1/chat/completions",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(request).read()
    qtbot.waitUntil(lambda: (page.tokens_chart.latest("all models") or 0) > 0, timeout=10000)
    # the traffic stopped: one event of zeros, and the chart says so
    qtbot.waitUntil(lambda: page.tokens_chart.latest("all models") == 0, timeout=10000)
    assert page.inflight_chart.latest("requests") == 0
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
    # a version a guarded upgrade held back says so, and why
    manager = EnvManager(daemon_thread.paths.envs_dir)
    manager.hold(manager.find("vllm", device="cpu"), "TTFT p50 ms worse by 12% than 0.31.0")
    envs.reload()
    qtbot.waitUntil(lambda: envs.table.item(0, 4).text() == "yes, held back", timeout=5000)
    assert "TTFT p50 ms worse by 12%" in envs.table.item(0, 4).toolTip()


@pytest.mark.slow
def test_a_slow_doctor_is_waited_for_not_called_a_dead_daemon(
    qtbot, daemon_thread, fake_env: Path, app_factory: AppFactory, monkeypatch
) -> None:
    """Importing vLLM and torch can take longer than an ordinary call may: the doctor waits
    for its checks. Any call that outlasts its time says the daemon is busy, never that it
    is not running (it once proposed `traylm serve` while the daemon was serving)."""
    python = fake_env / "bin" / "python"  # the FAKE env's import of vLLM takes 3 s here
    script = python.read_text().replace(
        "\n", '\ncase "$2" in *"import vllm"*) sleep 3 ;; esac\n', 1
    )
    python.write_text(script)
    monkeypatch.setattr(desktop.daemon.link, "CLIENT_TIMEOUT_S", 1.0)
    app = app_factory()
    _, page = _engines_page(app)
    page.tabs.setCurrentWidget(page.envs)
    envs = page.envs
    qtbot.waitUntil(lambda: envs.table.rowCount() == 1, timeout=5000)
    envs.table.selectRow(0)
    envs.doctor_button.click()
    qtbot.waitUntil(lambda: "metadata" in envs.report.text(), timeout=20000)
    assert "imports" in envs.report.text() and "serve" not in envs.report.text()

    async def doctor_within_1_s() -> None:
        client = await DaemonClient.connect(daemon_thread.paths)
        try:
            await client.env_doctor(fake_env.name, timeout_s=1.0)
        finally:
            await client.close()

    with pytest.raises(DaemonUnavailable) as err:
        asyncio.run(doctor_within_1_s())
    assert "running but busy" in err.value.message and "traylm serve" not in err.value.message


def test_a_long_download_shows_bytes_rate_time_left_and_a_ticking_clock(
    qtbot, app, daemon_thread
) -> None:
    """pip downloading a large wheel (its events as the daemon publishes them, through the real
    event stream): the Engines tab says how many bytes of how many, how fast, about how long is
    left, and its clock keeps moving while pip says nothing."""
    _, page = _engines_page(app)
    page.tabs.setCurrentWidget(page.envs)
    envs = page.envs
    assert daemon_thread.daemon is not None
    bus = daemon_thread.daemon.bus
    mb = 1_000_000
    for elapsed_s, done in ((60.0, 100 * mb), (64.0, 300 * mb)):  # 50 MB/s
        bus.publish_threadsafe(EnvInstallProgress(
            engine="vllm", device="cpu", phase="install", line="", elapsed_s=elapsed_s,
            step="downloading", package="torch-2.9.0-cp311-linux_x86_64.whl", done_bytes=done,
            file_done_bytes=done, file_total_bytes=1300 * mb,
        ))  # fmt: skip
    qtbot.waitUntil(lambda: "300.0 MB of 1.3 GB" in envs.install_status.message, timeout=5000)
    text = envs.install_status.message
    assert "50.0 MB/s" in text and "about 20 s left" in text, text

    def clock_s() -> int:
        minutes, seconds = re.findall(r"· (\d+) min (\d+) s$", envs.install_status.message)[0]
        return int(minutes) * 60 + int(seconds)

    first = clock_s()
    assert first >= 64
    qtbot.waitUntil(lambda: clock_s() >= first + 2, timeout=5000)  # no event meanwhile
    bus.publish_threadsafe(
        EnvInstallProgress(engine="vllm", device="cpu", phase="cancelled", line="test")
    )
    qtbot.waitUntil(lambda: "Cancelled" in envs.install_status.message, timeout=5000)


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
    assert page.result.text() == "Saved: Electricity price 0.42"  # words, not setting keys
    page.theme.setCurrentText("dark")
    qtbot.waitUntil(lambda: page.result.text() == "Saved: Colours dark", timeout=15000)
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
    add = page.findChild(type(page.restart_daemon), "addApiKey")
    add.click()  # the first click says what a key changes; the second adds it
    add.click()
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


def test_a_key_says_what_it_changes_and_never_locks_out_the_chat(qtbot, app, daemon_thread) -> None:
    """Add key says first what a key changes; once added, the open chat keeps answering with
    its own credential (no key of its own), while other apps on this computer need the key
    until keys are for LAN clients only."""
    daemon_thread.write_fake_profile("fake")
    app.actions.start_profile("fake")
    qtbot.waitUntil(lambda: app.state.served_models() == ["fake"], timeout=20000)
    chat = app.open_chat("")
    qtbot.waitUntil(lambda: chat.controller.loaded == ("fake",), timeout=5000)
    models_url = f"{daemon_thread.url}/v1/models"

    def outside_status() -> int:  # another app on this computer, without a key
        try:
            with urllib.request.urlopen(models_url, timeout=5) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return e.code

    page = _settings_page(app)
    add = page.add_key_button
    add.click()
    assert page.key_note.isVisibleTo(page) and "apps on this computer too" in page.key_note.text()
    assert add.text() == "Add the key" and page.keys.count() == 0  # nothing changed yet
    assert outside_status() == 200
    add.click()
    qtbot.waitUntil(lambda: page.keys.count() == 1, timeout=5000)
    assert outside_status() == 401
    qtbot.waitUntil(lambda: "(API key required)" in page.bound.text(), timeout=5000)

    app.bridge.link.gateway.api_key = ""  # the chat has no key: its own credential does
    chat.controller.loaded = ()
    chat.controller.load_models()  # the picker still lists what is served
    qtbot.waitUntil(lambda: chat.controller.loaded == ("fake",), timeout=5000)
    assert chat.controller.models_error is None
    chat.controller.options = None
    chat.max_tokens.setValue(2)
    chat.composer.setPlainText("still there?")
    chat.on_send_clicked()
    qtbot.waitUntil(lambda: len(chat.transcript.messages) == 2, timeout=10000)
    qtbot.waitUntil(lambda: chat.controller.streaming is None, timeout=10000)
    assert chat.transcript.messages[1].text == "w0 w1 "
    assert not chat.transcript.error_card.isVisible()

    page.keys_for.setCurrentIndex(page.keys_for.findData("lan"))
    qtbot.waitUntil(lambda: app.state.settings.gateway.keys_for == "lan", timeout=5000)
    saved = "Saved: Keys needed by LAN clients only"
    qtbot.waitUntil(lambda: page.result.text() == saved, timeout=5000)  # the call's answer
    qtbot.waitUntil(lambda: outside_status() == 200, timeout=5000)
    qtbot.waitUntil(lambda: "required from the LAN" in page.bound.text(), timeout=5000)


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
    """The token goes through the daemon's hub route: the daemon writes the login file (0600),
    the page shows where the daemon finds its token, and Remove deletes the saved one."""
    page = _settings_page(app)
    qtbot.waitUntil(lambda: "No token" in page.hf_status.text(), timeout=5000)
    assert not page.clear_hf_token.isEnabled()
    page.hf_token.setText("hf_secret")
    page.findChild(type(page.restart_daemon), "saveHfToken").click()
    path = tmp_path / "hf-home" / "token"
    qtbot.waitUntil(lambda: "saved in" in page.hf_status.text(), timeout=5000)
    assert str(path) in page.hf_status.text() and page.hf_token.text() == ""
    assert path.read_text() == "hf_secret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert daemon_thread.run(lambda c: c.hf_token()).source == "file"  # the daemon's view
    page.clear_hf_token.click()
    qtbot.waitUntil(lambda: "No token" in page.hf_status.text(), timeout=5000)
    assert not path.exists()
    page.hf_token.setText("not a token")
    page.findChild(type(page.restart_daemon), "saveHfToken").click()
    qtbot.waitUntil(lambda: "not a Hugging Face token" in page.result.text(), timeout=5000)
    assert not path.exists()


def test_without_a_gpu_the_engines_page_greys_the_gpu_presets_and_offers_the_local_model(
    qtbot, daemon_thread: ThreadedDaemon, app_factory, tmp_path
) -> None:
    """A computer without a GPU (no simulator): the shipped RTX 4090 presets are greyed with the
    daemon's reason (the Profiles tab says so beside "valid"), the registered model folder
    (vllm-cpu, the FAKE env) is offered, picked, and starts."""
    model = make_tiny_hf_model(tmp_path / "tiny-chat")
    daemon_thread.run(lambda c: c.add_local_folder(str(model), name="tiny"))
    app = app_factory()
    _dash, page = _engines_page(app)
    picker = page.profile_picker
    preset = "llama-3.1-8b-1gpu"
    qtbot.waitUntil(
        lambda: picker.findData("tiny") >= 0 and bool(app.state.why_blocked(preset)),
        timeout=15000,
    )
    items = picker.model()
    assert isinstance(items, QStandardItemModel)
    for name in (preset, "llama-3.3-70b-awq-tp2", "qwen2.5-32b-awq-tp2"):
        row = picker.findData(name)
        assert row >= 0 and not items.item(row).isEnabled(), name
        assert "needs an NVIDIA GPU (this computer has none)" in picker.itemText(row)
        assert items.item(row).toolTip() == app.state.why_blocked(name)
    tiny = picker.findData("tiny")
    assert items.item(tiny).isEnabled() and picker.itemText(tiny) == "tiny"
    assert picker.currentIndex() == tiny and page.start_button.isEnabled()  # offered first
    picker.setCurrentIndex(picker.findData(preset))
    assert not page.start_button.isEnabled()
    assert "needs an NVIDIA GPU" in page.start_button.toolTip()
    page.profiles.load_profile(preset)  # the Profiles tab: valid, but not startable here
    qtbot.waitUntil(lambda: page.profiles.validation.text().startswith("✓ valid"))
    assert page.profiles.validation.text().endswith(
        "as saved it cannot start on this computer: needs an NVIDIA GPU (this computer has none)"
    )
    assert "#b7791f" in page.profiles.validation.styleSheet()  # amber: valid, not startable
    picker.setCurrentIndex(tiny)
    page.start_button.click()
    qtbot.waitUntil(lambda: daemon_thread.engine_state("tiny") == EngineState.READY, timeout=30000)


def test_the_profiles_tab_lists_a_folder_model_and_makes_a_profile_of_it(
    qtbot, daemon_thread: ThreadedDaemon, app_factory, tmp_path
) -> None:
    model = make_tiny_hf_model(tmp_path / "tiny-chat")
    daemon_thread.run(lambda c: c.add_local_folder(str(model), name="tiny"))
    app = app_factory()
    _dash, page = _engines_page(app)
    editor = page.profiles
    qtbot.waitUntil(
        lambda: any(
            editor.list.item(i).text() == "tiny  (model folder)" for i in range(editor.list.count())
        ),
        timeout=15000,
    )
    row = next(
        i for i in range(editor.list.count()) if editor.list.item(i).text().startswith("tiny ")
    )
    editor.list.setCurrentRow(row)
    # the profile list read again while the draft is open (the link's resync reads it shortly
    # after connecting; any profile change too): the draft stays, its folder still picked
    with qtbot.waitSignal(app.state.profiles_changed, timeout=10000):
        app.actions.reload_profiles()
    assert editor.list.currentRow() == row
    assert editor.name.text() == "tiny-custom"  # never the folder's own name: no clash
    assert "saving makes the profile tiny-custom" in editor.preset_note.text()
    qtbot.waitUntil(lambda: editor.validation.text().startswith("✓ valid"), timeout=10000)
    editor.save_button.click()
    qtbot.waitUntil(lambda: app.state.profile("tiny-custom") is not None, timeout=10000)
    assert app.state.profile("tiny-custom").fields["model"] == str(model)


def test_ollamas_api_state_and_its_port_move_live(qtbot, app, daemon_thread) -> None:
    """The page says whether Ollama's API is served, and when its port is taken (Ollama itself
    runs there) who holds it and how to move either; the port and on/off apply at once."""
    page = _settings_page(app)
    qtbot.waitUntil(lambda: page.ollama_state.text() == "off", timeout=5000)
    assert not page.ollama_on.isChecked()
    assert "Ollama's API" in page.ollama_on.toolTip()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        page.ollama_port.setValue(taken)
        page.ollama_port.editingFinished.emit()
        qtbot.waitUntil(lambda: app.state.settings.ollama.port == taken, timeout=5000)
        page.ollama_on.setChecked(True)
        qtbot.waitUntil(lambda: "NOT served" in page.ollama_state.text(), timeout=5000)
        said = page.ollama_state.text()
        assert f"port {taken} is held by" in said and "change the port here" in said
        assert f"traylm config set ollama.port {taken + 1}" in said
    free = free_loopback_port()
    page.ollama_port.setValue(free)
    page.ollama_port.editingFinished.emit()
    serving = f"serving on http://127.0.0.1:{free}"
    qtbot.waitUntil(lambda: serving in page.ollama_state.text(), timeout=5000)
    assert page.result.text() == f"Saved: Ollama's port {free} (applied now)"
    with urllib.request.urlopen(f"http://127.0.0.1:{free}/api/version", timeout=5) as r:
        assert r.status == 200
    page.ollama_on.setChecked(False)
    qtbot.waitUntil(lambda: page.ollama_state.text() == "off", timeout=5000)
