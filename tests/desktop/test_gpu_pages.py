"""The GPUs page, Fans & power and the tray's hot state against a real daemon on two SIMULATED
RTX 4090s (`traylm serve --simulate-gpus 2`, with its in-process traylm-gpud): the cards follow
the simulator live, the curve editor's edits are judged by the daemon and applied through the
helper, the power slider and guard thresholds go through dry runs, and the tray turns hot when
the thermal guard acts. Without GPUs (this machine's real NVML), the pages say so and show the
helper's install hint."""

from __future__ import annotations

import re
import threading
import urllib.request
from pathlib import Path

import pytest
from PySide6.QtCore import QPoint, Qt

from desktop.app import DesktopApp
from desktop.daemon.notify import Notification
from desktop.dashboard.fans_page import FansPage
from desktop.dashboard.gpus_page import GPUsPage
from desktop.tray.icons import TrayState
from engines.events import GPUSampled
from engines.gpu.sim import SimulatedBackend, sim_uuid
from tests.desktop.conftest import ThreadedDaemon

GPU0, GPU1 = sim_uuid(0), sim_uuid(1)
ROOT = Path(__file__).resolve().parents[2]


def _sim(d: ThreadedDaemon) -> SimulatedBackend:
    backend = d.feature("gpu").backend
    assert isinstance(backend, SimulatedBackend)
    return backend


def _gpus_page(app: DesktopApp) -> GPUsPage:
    page = app.open_dashboard("gpus").page("gpus")
    assert isinstance(page, GPUsPage)
    return page


def _fans_page(app: DesktopApp) -> FansPage:
    page = app.open_dashboard("fans").page("fans")
    assert isinstance(page, FansPage)
    return page


def test_gpu_cards_follow_the_simulator_live(qtbot, sim_app, sim_daemon_thread) -> None:
    app, d = sim_app, sim_daemon_thread
    page = _gpus_page(app)
    qtbot.waitUntil(lambda: list(page.cards) == [GPU0, GPU1], timeout=5000)
    assert "SIMULATED" in page.source.text() and page.source.property("kind") == "simulated"
    card = page.cards[GPU0]
    assert card.sim_badge.isVisibleTo(card)
    # the charts start from the daemon's history, then follow the samples
    qtbot.waitUntil(lambda: len(card.temp_chart.series["GPU"]) >= 3, timeout=10000)
    _sim(d).set_load(GPU0, 1.0, memory_used_bytes=20 << 30)
    qtbot.waitUntil(lambda: (card.power_chart.latest("draw") or 0) > 400, timeout=10000)
    assert card.power_chart.latest("limit") == 450
    assert (card.pct_chart.latest("util") or 0) == 100
    assert 80 < (card.pct_chart.latest("VRAM") or 0) < 90
    assert (card.clock_chart.latest("SM") or 0) > 2000
    assert "of a 450 W limit" in card.facts["Power"].text()
    assert "Gen 4 ×16" in card.facts["PCIe link"].text()
    assert "21.1 of 24.0 GiB" in card.facts["VRAM"].text()  # and the desktop's 1.1 GiB
    # a power limit set through the helper: the dashed line drops and the reason is in words
    d.run(lambda c: c.set_power_limit(GPU0, watts=300))
    qtbot.waitUntil(lambda: card.power_chart.latest("limit") == 300, timeout=10000)
    qtbot.waitUntil(lambda: "held at the power limit" in card.facts["Clock events"].text())
    assert "not an alarm" in card.facts["Clock events"].text()
    assert "(default 450 W)" in card.facts["Power"].text()
    idle = page.cards[GPU1]
    assert "idle" in idle.facts["Clock events"].text()
    assert "Power supply 1600 W" in page.summary.text()


@pytest.mark.slow
def test_energy_per_token_appears_on_the_cards(qtbot, sim_app, sim_daemon_thread) -> None:
    app, d = sim_app, sim_daemon_thread
    d.write_fake_profile("gen", device="cuda", gpus=[0, 1])
    page = _gpus_page(app)
    app.actions.start_profile("gen")
    qtbot.waitUntil(lambda: "gen" in app.state.served_models(), timeout=20000)
    stop = threading.Event()

    def load() -> None:
        body = b'{"model": "gen", "messages": [], "max_tokens": 40}'
        while not stop.is_set():
            request = urllib.request.Request(
                f"{d.url}/v1/chat/completions", data=body,
                headers={"Content-Type": "application/json"},
            )  # fmt: skip
            urllib.request.urlopen(request).read()
            stop.wait(0.05)

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    try:
        qtbot.waitUntil(lambda: "J/token" in page.cards[GPU1].facts["Energy"].text(), timeout=30000)
    finally:
        stop.set()
        loader.join(10)
    text = page.cards[GPU0].facts["Energy"].text()
    assert "gen:" in text and "EUR per million tokens" in text
    energy = app.state.gpu.energy_for(GPU0)
    assert energy and energy[0].simulated and (energy[0].joules_per_token or 0) > 0


def test_an_engine_on_the_cpu_is_never_drawn_on_a_gpu(qtbot, sim_app, sim_daemon_thread) -> None:
    """A model served on the CPU beside simulated GPUs holds none of their
    memory (it was drawn holding 22 GiB of GPU 0); one on CUDA does."""
    app, d = sim_app, sim_daemon_thread
    d.write_fake_profile("local", device="cpu", gpus=[0])
    d.write_fake_profile("big", device="cuda", gpus=[1])
    page = _gpus_page(app)
    app.actions.start_profile("local")
    app.actions.start_profile("big")
    qtbot.waitUntil(lambda: {"local", "big"} <= set(app.state.served_models()), timeout=20000)
    # the simulator draws both engines in one pass: once "big" holds GPU 1, "local" was judged
    held = page.cards[GPU1].pct_chart
    qtbot.waitUntil(lambda: (held.latest("VRAM") or 0) > 50, timeout=15000)
    # GPU 0 holds its desktop (Xorg and gnome-shell, 1.1 GiB) and nothing of "local"
    assert page.cards[GPU0].facts["VRAM"].text() == "1.1 of 24.0 GiB (4 %)"
    assert page.cards[GPU0].pct_chart.latest("VRAM") == pytest.approx(4.5, abs=0.1)


def _drag(qtbot, editor, index: int, to: tuple[float, float]) -> None:
    start = editor.to_pixel(editor.points[index]).toPoint()
    end = editor.to_pixel(to).toPoint()
    qtbot.mousePress(editor, Qt.MouseButton.LeftButton, pos=start)
    qtbot.mouseMove(editor, QPoint((start.x() + end.x()) // 2, (start.y() + end.y()) // 2))
    qtbot.mouseMove(editor, end)
    qtbot.mouseRelease(editor, Qt.MouseButton.LeftButton, pos=end)


def test_curve_editor_is_judged_by_the_daemon_and_applied_by_the_helper(
    qtbot, sim_app, sim_daemon_thread
) -> None:
    app, d = sim_app, sim_daemon_thread
    page = _fans_page(app)
    view = page.fans
    qtbot.waitUntil(lambda: page.current_uuid() == GPU0 and view.status is not None)
    assert "traylm-gpud is running" in page.helper.text()
    qtbot.waitUntil(lambda: view.preset_picker.findText("quiet") >= 0, timeout=5000)
    view.preset_picker.setCurrentText("quiet")
    view.on_load_preset_clicked()
    assert view.editor.points[0] == (50.0, 30.0) and view.curve_name == "quiet"
    assert view.preset_picker.findText("custom") < 0
    qtbot.waitUntil(lambda: view.validation.state == "ok", timeout=5000)
    # drag the first point under the card's 30 % fan floor: the daemon refuses, with its words
    editor = view.editor
    _drag(qtbot, editor, 0, (45.0, 12.0))
    assert editor.points[0] == (45.0, 12.0) and view.curve_name == "custom"
    assert view.preset_picker.currentText() == "custom"  # no longer "quiet"
    qtbot.waitUntil(lambda: view.validation.state == "error", timeout=5000)
    assert "below this card's fan floor of 30 %" in view.validation.message
    assert not view.apply_button.isEnabled()
    # drag it back above the floor, and make the last point too low: valid with a warning
    _drag(qtbot, editor, 0, (45.0, 35.0))
    qtbot.waitUntil(lambda: view.validation.state == "ok", timeout=5000)
    assert view.apply_button.isEnabled()
    view.fan_boxes[1].setChecked(False)  # only fan 0
    qtbot.waitUntil(lambda: view.apply_button.isEnabled(), timeout=5000)
    curve = view.curve()
    view.apply_button.click()
    qtbot.waitUntil(lambda: view.result.state == "ok", timeout=10000)
    assert "fans 0" in view.result.message
    # the simulated helper now reports the curve on fan 0, and fan 1 stays automatic
    status = d.run(lambda c: c.fans(GPU0))
    [control] = [c for c in status.controls if c.fan == 0]
    assert control.mode == "curve" and control.curve is not None
    assert control.curve.points == curve.points
    assert all(c.mode != "curve" for c in status.controls if c.fan == 1)
    qtbot.waitUntil(lambda: "curve 'custom' by traylm-gpud" in view.fan_state.text(), timeout=5000)
    # above the curve's first point the helper drives fan 0 itself (below it: the firmware)
    _sim(d).inject(GPU0, force_temperature_c=60.0)
    qtbot.waitUntil(lambda: _sim(d).control_state()[GPU0]["fans"][0]["manual"], timeout=10000)
    assert 35 <= _sim(d).control_state()[GPU0]["fans"][0]["pct"] <= 40
    assert not _sim(d).control_state()[GPU0]["fans"][1]["manual"]
    view.auto_button.click()
    qtbot.waitUntil(lambda: "automatic" in view.result.message, timeout=10000)
    assert not any(c.mode == "curve" for c in d.run(lambda c: c.fans(GPU0)).controls)


def test_curve_editor_adds_and_removes_points(qtbot, sim_app) -> None:
    view = _fans_page(sim_app).fans
    editor = view.editor
    editor.set_points([(40.0, 30.0), (80.0, 100.0)])
    edits: list[object] = []
    editor.curve_edited.connect(edits.append)
    middle = editor.to_pixel((60.0, 50.0)).toPoint()
    qtbot.mouseDClick(editor, Qt.MouseButton.LeftButton, pos=middle)
    assert editor.points == [(40.0, 30.0), (60.0, 50.0), (80.0, 100.0)]
    # a dragged point cannot pass its neighbours
    _drag(qtbot, editor, 1, (95.0, 60.0))
    assert editor.points[1] == (79.0, 60.0)
    qtbot.mouseClick(
        editor, Qt.MouseButton.RightButton, pos=editor.to_pixel((79.0, 60.0)).toPoint()
    )
    assert editor.points == [(40.0, 30.0), (80.0, 100.0)]
    qtbot.mouseClick(
        editor, Qt.MouseButton.RightButton, pos=editor.to_pixel((40.0, 30.0)).toPoint()
    )
    assert len(editor.points) == 2  # two points stay
    assert len(edits) == 3


def test_power_slider_and_guard_thresholds_through_dry_runs(
    qtbot, sim_app, sim_daemon_thread
) -> None:
    app, d = sim_app, sim_daemon_thread
    page = _fans_page(app)
    power = page.power
    qtbot.waitUntil(lambda: power.status is not None and power.slider.maximum() == 600)
    assert power.slider.minimum() == 150 and power.slider.value() == 450
    qtbot.waitUntil(lambda: len(power.preset_buttons) == 3, timeout=5000)
    efficient = next(b for b in power.preset_buttons if b.objectName() == "powerPreset-efficient")
    efficient.click()
    assert power.slider.value() == 300
    qtbot.waitUntil(lambda: power.validation.state == "ok" and power.apply_button.isEnabled())
    power.apply_button.click()
    qtbot.waitUntil(lambda: power.result.state == "ok", timeout=10000)
    enforced = "Enforced now: 300 W (set by you)"  # may come with the next sample
    qtbot.waitUntil(lambda: enforced in power.facts.text(), timeout=30000)
    assert _sim(d).control_state()[GPU0]["power_limit_mw"] == 300_000
    assert power.slider.value() == 300  # what was applied, not the limit from before it
    power.reset_button.click()
    qtbot.waitUntil(lambda: _sim(d).control_state()[GPU0]["power_limit_mw"] == 450_000)
    qtbot.waitUntil(lambda: "Enforced now: 450 W" in power.facts.text(), timeout=30000)
    assert power.slider.value() == 450  # the slider follows the card when nobody is choosing

    guard = page.guard
    qtbot.waitUntil(lambda: guard.status is not None, timeout=5000)
    assert (
        "<b>GPU 0</b> (slows down at 90 °C): notify 80 °C · lower power 83 °C"
        in guard.meaning.text()
    )
    guard.spins["guard_stop_margin_c"].setValue(6.0)  # closer to slowdown than pause (4): wrong
    qtbot.waitUntil(lambda: guard.validation.state == "error", timeout=5000)
    assert "must not exceed guard_pause_margin_c" in guard.validation.message
    assert not guard.apply_button.isEnabled()
    guard.spins["guard_stop_margin_c"].setValue(3.0)
    qtbot.waitUntil(lambda: guard.validation.state == "ok", timeout=5000)
    guard.apply_button.click()
    qtbot.waitUntil(lambda: guard.result.state == "ok", timeout=5000)
    assert d.run(lambda c: c.guard()).thresholds["guard_stop_margin_c"] == 3.0
    assert "guard_stop_margin_c = 3.0" in d.paths.config_file.read_text()


def test_tray_turns_hot_when_the_guard_acts_and_cools_down(
    qtbot, sim_app, sim_daemon_thread
) -> None:
    app, d = sim_app, sim_daemon_thread
    qtbot.waitUntil(lambda: bool(app.state.gpu.latest), timeout=5000)
    assert app.tray.current == TrayState.STOPPED
    notes: list[Notification] = []
    app.notifier.notified.connect(notes.append)
    with qtbot.waitSignal(app.state.gpu.hot_changed, timeout=10000):
        _sim(d).inject(GPU0, force_temperature_c=84.0)  # past the notice threshold (80 °C)
    assert app.tray.current == TrayState.HOT
    qtbot.waitUntil(lambda: any(n.title == "Thermal guard: GPU 0" for n in notes), timeout=5000)
    note = next(n for n in notes if n.title == "Thermal guard: GPU 0")
    assert note.level == "warning" and "84 °C" in note.message
    tooltip = app.tray.icon.toolTip()
    assert "SIMULATED GPU 0: 84 °C" in tooltip and "[guard: notice]" in tooltip
    assert "GPU 1:" in tooltip and "/ 450 W" in tooltip
    app.tray.menu.aboutToShow.emit()
    assert app.tray.hot_action.isVisible()
    page = _gpus_page(app)
    qtbot.waitUntil(lambda: page.cards[GPU0].guard_badge.text() == "guard: warned")
    _sim(d).inject(GPU0, force_temperature_c=60.0)  # cooled down: the guard stands down
    qtbot.waitUntil(lambda: app.tray.current == TrayState.STOPPED, timeout=10000)
    assert not app.state.gpu.hot


def test_without_gpus_the_pages_say_so_and_show_the_helper_hint(qtbot, app) -> None:
    """This machine has no NVIDIA driver: the real NVML backend answers 'unavailable'."""
    page = _gpus_page(app)
    qtbot.waitUntil(lambda: app.state.gpu.overview is not None, timeout=5000)
    assert "No GPU telemetry" in page.source.text() and not page.cards
    assert "retrying in" not in page.source.text()  # a countdown that never moved on
    fans = _fans_page(app)
    assert "Read-only: traylm-gpud is not running" in fans.helper.text()
    assert fans.helper.text().count("install-gpud.sh") == 1  # the hint, said once
    # the installer this computer has, by its full path (not one relative to a source checkout)
    assert f"sudo bash {ROOT}/installers/linux/install-gpud.sh" in fans.helper.text()
    assert not fans.fans.isEnabled()
    # no GPU at all: no curve editor for nothing, no helper to install for it
    assert fans.no_gpu.isVisibleTo(fans) and "No NVIDIA GPU" in fans.no_gpu.text()
    assert not fans.tabs.isVisibleTo(fans) and not fans.helper.isVisibleTo(fans)
    assert app.tray.current == TrayState.STOPPED and "GPU" not in app.tray.icon.toolTip()


def test_without_gpus_the_gpus_page_shows_cpu_ram_and_the_engines_use_of_them(
    qtbot, app, daemon_thread
) -> None:
    daemon_thread.write_fake_profile("fake")
    app.actions.start_profile("fake")
    qtbot.waitUntil(lambda: app.state.served_models() == ["fake"], timeout=20000)
    page = _gpus_page(app)
    app.dashboard.show_page("gpus")
    qtbot.waitUntil(lambda: "fake: CPU" in page.host.text(), timeout=10000)
    text = page.host.text()
    assert "This computer:</b> CPU" in text and "cores · RAM" in text
    assert re.search(r"fake: CPU \d+ % · RAM \d+\.\d [MG]B", text), text
    assert page.summary.text() == ""  # no fan control or charts to speak of


def test_without_gpus_the_dashboard_lands_on_a_page_with_something_to_show(qtbot, app) -> None:
    qtbot.waitUntil(lambda: app.state.gpu.overview is not None, timeout=5000)
    dash = app.open_dashboard("")
    assert dash.current_key() == "engines"  # not the GPUs page, which has nothing to show
    dash.show_page("gpus")  # asked for: shown
    assert dash.current_key() == "gpus"


def test_with_gpus_the_dashboard_lands_on_them(qtbot, sim_app) -> None:
    assert sim_app.open_dashboard("").current_key() == "gpus"


def test_each_sample_reaches_the_charts_once_shown_or_hidden(qtbot, sim_app) -> None:
    page = _gpus_page(sim_app)
    qtbot.waitUntil(lambda: GPU0 in page.cards and page.history_shown, timeout=5000)
    chart = page.cards[GPU0].temp_chart
    qtbot.waitUntil(lambda: len(chart.series["GPU"]) >= 3, timeout=5000)
    samples: list[GPUSampled] = []
    sim_app.state.gpu.sampled.connect(samples.append)
    before = len(chart.series["GPU"])
    page.on_overview_changed()  # words are rewritten, no point is added
    page.on_overview_changed()
    qtbot.waitUntil(lambda: len(samples) >= 2, timeout=5000)
    assert len(chart.series["GPU"]) == before + len(samples)
    sim_app.dashboard.hide()  # hidden: the charts keep their history
    seen = len(samples)
    qtbot.waitUntil(lambda: len(samples) >= seen + 2, timeout=5000)
    assert len(chart.series["GPU"]) == before + len(samples)


def test_samples_reach_the_app_once_per_sample(qtbot, sim_app) -> None:
    samples: list[GPUSampled] = []
    sim_app.state.gpu.sampled.connect(samples.append)
    qtbot.waitUntil(lambda: len(samples) >= 3, timeout=5000)
    assert [len(s.gpus) for s in samples[:3]] == [2, 2, 2]
    assert all(s.simulated for s in samples)
    assert len({s.ts_s for s in samples}) == len(samples)


def _efficiency_view(qtbot, app: DesktopApp):  # type: ignore[no-untyped-def]
    view = _gpus_page(app).efficiency
    qtbot.waitUntil(lambda: view.isVisibleTo(view.parentWidget()), timeout=5000)
    qtbot.waitUntil(lambda: view.apply_button.isEnabled(), timeout=5000)  # the helper is up
    return view


def test_the_gpus_page_switches_the_efficiency_profile(qtbot, sim_app, sim_daemon_thread) -> None:
    app, d = sim_app, sim_daemon_thread
    view = _efficiency_view(qtbot, app)
    picker = view.picker
    assert [picker.itemText(i) for i in range(picker.count())] == ["quiet", "eco", "max"]
    eco = picker.findText("eco")
    tooltip = picker.itemData(eco, Qt.ItemDataRole.ToolTipRole)
    assert tooltip.startswith("75 % power, SM clock at 75 %")
    assert view.in_force.text().startswith("No profile in force")
    picker.setCurrentIndex(eco)
    picker.activated.emit(eco)  # as a click on the item does
    assert view.description.text() == tooltip
    qtbot.mouseClick(view.apply_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: view.result.state == "ok", timeout=20000)
    assert view.result.message == "eco is in force on 2 simulated GPUs."
    assert d.run(lambda c: c.efficiency_profiles()).in_force == {GPU0: "eco", GPU1: "eco"}
    qtbot.waitUntil(lambda: view.in_force.text() == "In force: eco on both GPUs.", timeout=5000)
    assert picker.currentText() == "eco"
    assert "SIMULATED" in _gpus_page(app).source.text()  # the source still says so
    # switched elsewhere (the CLI): the page follows the daemon
    d.run(lambda c: c.set_efficiency_profile("max"))
    qtbot.waitUntil(lambda: view.in_force.text() == "In force: max on both GPUs.", timeout=10000)
    assert picker.currentText() == "max"


def test_a_profile_naming_a_gone_gpu_or_a_broken_file_is_refused_in_words(
    qtbot, sim_app, sim_daemon_thread
) -> None:
    app, d = sim_app, sim_daemon_thread
    folder = d.paths.config_dir / "efficiency"
    folder.mkdir(parents=True)
    (folder / "far.toml").write_text('description = "for a third card"\n[gpus.5]\npower_w = 300\n')
    (folder / "typo.toml").write_text("power_pct = 70\nfanz = 'quiet'\n")
    d.run(lambda c: c.set_efficiency_profile("eco"))
    view = _efficiency_view(qtbot, app)
    app.actions.reload_efficiency()
    qtbot.waitUntil(lambda: view.picker.findText("far") >= 0, timeout=5000)
    qtbot.waitUntil(lambda: view.in_force.text() == "In force: eco on both GPUs.", timeout=5000)
    assert view.picker.findText("typo") == -1  # not offered: it cannot be used
    assert view.problems.state == "warning"
    assert "typo.toml: unknown field(s) fanz" in view.problems.message
    sampler = d.feature("gpu").sampler
    eco_limits = [337_500, 337_500]
    qtbot.waitUntil(lambda: [s.power_limit_mw for s in sampler.latest] == eco_limits, timeout=5000)
    far = view.picker.findText("far")
    view.picker.setCurrentIndex(far)
    view.picker.activated.emit(far)
    qtbot.mouseClick(view.apply_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: view.result.state == "error", timeout=20000)
    said = view.result.message
    assert said.startswith("far was not applied; the GPUs are as they were:")
    assert "names GPU '5', which is not here" in said and "edit the profile" in said
    # nothing half-applied: eco still holds on both, limits included
    assert d.run(lambda c: c.efficiency_profiles()).in_force == {GPU0: "eco", GPU1: "eco"}
    limits = [d.run(lambda c, g=g: c.power_limit(g)).enforced_mw for g in (GPU0, GPU1)]
    assert limits == eco_limits
    assert view.in_force.text() == "In force: eco on both GPUs."
