"""The Tune page against a REAL daemon and the FAKE vLLM engine (which honours --max-num-seqs as
vLLM's scheduler does, so the candidates really differ): a tune started from the form shows its
progress, then the table and the recommendation; Apply writes the profile and Undo puts back the
very same bytes; a tune started elsewhere (as `traylm tune` does) shows here and is cancelled
from here, which starts the profile's engine again; the daemon's refusals are shown under the
form with the bad field marked; without a daemon the page says so."""

from __future__ import annotations

import time
from pathlib import Path

import openai
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from desktop.app import DesktopApp
from desktop.dashboard.tune_page import TunePage
from desktop.dashboard.tune_results import COST, HEADERS, PARETO_MARK, TuneResults
from engines.config.profiles import ProfileStore
from engines.config.sections import Paths
from engines.config.tomlfile import write_toml_atomic
from engines.core.procs import free_loopback_port
from engines.events import EngineState, TuneConfig, TuneJob, TuneProgress, TuneRow, TuneState
from engines.tune.interrupted import RunningTuneFile
from tests.conftest import fast_settings
from tests.desktop.conftest import AppFactory, ThreadedDaemon
from tests.fakes.fake_trt_env import make_tiny_hf_model

pytestmark = pytest.mark.slow
TOKEN_S = 0.005  # 128 tokens a reply: 0.64 s; max-num-seqs 2 at 8 in flight: 4 waves


def _tune_page(qtbot, app: DesktopApp, d: ThreadedDaemon, args: str) -> TunePage:
    d.write_fake_profile("chat", args=args, max_num_seqs=2)
    app.actions.reload_profiles()
    qtbot.waitUntil(lambda: app.state.profile("chat") is not None)
    app.actions.start_profile("chat")
    qtbot.waitUntil(lambda: "chat" in app.state.served_models(), timeout=20000)
    page = app.open_dashboard("tune").page("tune")
    assert isinstance(page, TunePage)
    qtbot.waitUntil(
        lambda: page.form.selected_profile() == "chat" and page.start_button.isEnabled()
    )
    return page


def _cell(page: TunePage, row: int, header: str) -> str:
    item = page.results.table.item(row, HEADERS.index(header))
    assert item is not None
    return item.text()


def test_tune_from_the_page_then_apply_and_undo(qtbot, app: DesktopApp, daemon_thread) -> None:
    d = daemon_thread
    page = _tune_page(qtbot, app, d, f"--token-delay {TOKEN_S}")
    profile = d.paths.profiles_dir / "chat.toml"
    before = profile.read_bytes()
    assert "Undo: the tuner has not changed profile chat." in page.why.text()
    assert not page.apply_button.isEnabled() and not page.cancel_button.isEnabled()
    page.form.requests.setValue(8)
    page.form.concurrency.setValue(8)
    page.form.only.setText("max-num-seqs-32")
    seen: list[TuneProgress] = []
    shown: list[tuple[str, str]] = []  # what the page said at each step (its slot runs first)

    def on_event(e: object) -> None:
        if isinstance(e, TuneProgress):
            seen.append(e)
            shown.append((page.now.text(), page.progress.format()))

    app.state.event_received.connect(on_event)
    page.start_button.click()
    qtbot.waitUntil(lambda: page.running is not None, timeout=20000)
    qtbot.waitUntil(lambda: any(p.phase == "measure" for p in seen), timeout=30000)
    assert not page.start_button.isEnabled() and page.cancel_button.isEnabled()
    assert "is running" in page.why.text()
    qtbot.waitUntil(lambda: "budget used" in page.time_left.text(), timeout=10000)
    assert "of the 20 min 00 s budget used · at most" in page.time_left.text()
    qtbot.waitUntil(
        lambda: page.job is not None and page.job.state == TuneState.DONE, timeout=120000
    )
    assert page.status.state == "ok" and "done" in page.status.message
    assert page.progress.format() == f"tune #{page.job.id}: done"
    assert ("Measuring max-num-seqs 32 (run 2 of 2)", f"tune #{page.job.id}: 3 of 4 measurements "
            "done") in shown  # fmt: skip
    assert ("Starting what ran before", f"tune #{page.job.id}: 4 of 4 measurements done") in shown
    # the table: your profile and the candidate, figures with their noise band, the verdict
    table = page.results.table
    assert table.rowCount() == 2 and table.isVisible()
    assert _cell(page, 0, "Candidate") == "your profile as it is"
    assert _cell(page, 1, "Candidate") == "max-num-seqs 32"
    assert _cell(page, 1, "Verdict") == f"better {PARETO_MARK}"  # on the Pareto front
    assert _cell(page, 0, "Verdict") == "default"
    assert "\n±" in _cell(page, 1, "Output\ntok/s")  # the figure over its noise band
    assert table.item(1, 0).font().bold() and not table.item(0, 0).font().bold()
    assert table.isColumnHidden(HEADERS.index("Mean\nW"))  # no GPU here, no GPU column
    assert not page.results.simulated.isVisible()
    words = page.results.recommendation.text()
    assert "Recommendation:" in words and "Max-num-seqs 32: " in words
    assert "x the tokens/s of your profile at concurrency 8" in words
    assert "max_num_seqs = 32" in words  # the profile change it would write
    # Apply writes it and keeps the previous one; Undo puts back the very same bytes
    assert page.apply_button.isEnabled() and profile.read_bytes() == before
    page.apply_button.click()
    qtbot.waitUntil(lambda: page.outcome.state != "", timeout=10000)
    assert page.outcome.state == "ok", page.outcome.message
    assert "max_num_seqs = 32" in profile.read_text()
    qtbot.waitUntil(lambda: page.undo_button.isEnabled(), timeout=10000)
    assert "Put back profile chat" in page.undo_button.toolTip()
    assert not page.apply_button.isEnabled() and "already written" in page.why.text()
    model = page.form.model
    other = next(i for i in range(model.count()) if model.itemData(i) != "chat")
    model.setCurrentIndex(other)  # Undo follows the model picked (a greyed one: none)
    assert not page.undo_button.isEnabled() and not page.start_button.isEnabled()
    assert "the tuner has not changed profile (none)" in page.why.text()
    model.setCurrentIndex(model.findData("chat"))
    assert page.undo_button.isEnabled()
    page.undo_button.click()
    assert not page.undo_button.isEnabled() and "Wait: undoing…" in page.why.text()
    qtbot.waitUntil(lambda: "before" in page.outcome.message, timeout=10000)
    assert page.outcome.state == "ok" and profile.read_bytes() == before
    qtbot.waitUntil(lambda: "has not changed profile chat" in page.why.text(), timeout=10000)
    assert not page.undo_button.isEnabled()
    assert page.apply_button.isEnabled()  # undone: it can be written again
    # the last result is there when the page opens again (the app's next start)
    page.results.show_job(None)
    page.page_shown()
    qtbot.waitUntil(lambda: page.results.table.rowCount() == 2, timeout=10000)


def test_rows_arrive_live_counts_agree_and_the_tuners_engines_stay_quiet(
    qtbot, app: DesktopApp, daemon_thread
) -> None:
    """During the run the table gains a row as each candidate is first measured; the progress
    bar, the heading and the job say one count of planned measurements; the tuner's own
    engines raise no pop-up and leave no row on the Engines page; the figures show the runs'
    real spread."""
    d = daemon_thread
    page = _tune_page(qtbot, app, d, f"--token-delay {TOKEN_S}")
    notes: list[str] = []
    app.notifier.notified.connect(lambda n: notes.append(n.title))
    app.notifier.history.clear()  # "chat is ready" said: the same words again are not hidden
    page.form.requests.setValue(4)
    page.form.concurrency.setValue(4)
    page.form.only.setText("max-num-seqs-16")
    page.start_button.click()

    def rows_while_running(count: int) -> bool:
        running = page.job is not None and page.job.state == TuneState.RUNNING
        return running and page.results.table.rowCount() == count

    qtbot.waitUntil(lambda: rows_while_running(1), timeout=30000)  # your profile, measured once
    assert _cell(page, 0, "Output\ntok/s").endswith("\none run: no spread")
    qtbot.waitUntil(lambda: rows_while_running(2), timeout=30000)  # then the candidate
    qtbot.waitUntil(
        lambda: page.job is not None and page.job.state == TuneState.DONE, timeout=120000
    )
    job = page.job
    assert job.planned == 4 == len(job.measures)
    assert page.progress.format() == f"tune #{job.id}: done"
    assert "4 of 4 measurements" in page.results.heading.text()
    assert not [t for t in notes if t.startswith("tune-")], notes
    qtbot.waitUntil(lambda: "tune-chat" not in app.state.engines, timeout=10000)
    values = [m.figures["output_tps"] for m in job.measures if m.candidate == "max-num-seqs-16"]
    spread = (max(values) - min(values)) / 2 / (sum(values) / 2)
    assert _cell(page, 1, "Output\ntok/s").endswith(f"\n±{spread * 100:.0f}%")


def test_a_tune_started_elsewhere_shows_and_cancels_here(
    qtbot, app: DesktopApp, daemon_thread
) -> None:
    d = daemon_thread
    page = _tune_page(qtbot, app, d, "--token-delay 0.05")
    before = (d.paths.profiles_dir / "chat.toml").read_bytes()
    config = TuneConfig(model="chat", concurrency=2, requests=40, only=("max-num-seqs-8",))
    job = d.run(lambda c: c.tune_start(config))  # as `traylm tune` does
    qtbot.waitUntil(lambda: page.running == job.id, timeout=20000)
    qtbot.waitUntil(lambda: page.now.text().startswith("Measuring"), timeout=30000)
    assert f"Tune #{job.id} of chat is running" in page.why.text()
    assert not page.start_button.isEnabled()
    page.cancel_button.click()
    qtbot.waitUntil(
        lambda: page.job is not None and page.job.state == TuneState.CANCELLED, timeout=60000
    )
    assert page.status.state == "warning", page.status.message
    assert "started again" in page.status.message and "unchanged" in page.status.message
    assert page.running is None and page.start_button.isEnabled()
    qtbot.waitUntil(lambda: d.engine_state("chat") == EngineState.READY, timeout=20000)
    assert (d.paths.profiles_dir / "chat.toml").read_bytes() == before
    assert "nothing to apply" in page.why.text()


def test_the_daemons_refusals_are_shown_at_the_field(
    qtbot, app: DesktopApp, daemon_thread, tmp_path: Path
) -> None:
    page = _tune_page(qtbot, app, daemon_thread, "")

    def refused(contains: str) -> None:
        page.status.neutral("")
        page.start_button.click()
        qtbot.waitUntil(lambda: page.status.state == "error", timeout=20000)
        assert contains in page.status.message
        assert "Traceback" not in page.status.message
        qtbot.waitUntil(page.start_button.isEnabled)

    # by keyboard: Tab walks the form to Start, and Alt+S starts
    dash = app.open_dashboard("tune")
    dash.activateWindow()
    qtbot.waitUntil(dash.isActiveWindow)
    page.form.model.setFocus()
    reached = []
    for _ in range(20):
        widget = QApplication.focusWidget()
        reached.append(widget.objectName())
        qtbot.keyClick(widget, Qt.Key.Key_Tab)
    assert {"tuneModel", "tuneGoal", "tuneBudget", "tuneOnly", "startTune"} <= set(reached)
    page.form.only.setText("warp-drive")
    page.status.neutral("")
    qtbot.keyClick(page.form.only, Qt.Key.Key_S, Qt.KeyboardModifier.AltModifier)
    qtbot.waitUntil(lambda: page.status.state == "error", timeout=20000)
    assert "no candidate warp-drive here" in page.status.message
    qtbot.waitUntil(page.start_button.isEnabled)
    refused("no candidate warp-drive here; this machine has: ")
    assert page.form._invalid is page.form.only and "d62828" in page.form.only.styleSheet()
    page.form.only.setText("")
    page.form.workload.setCurrentIndex(page.form.workload.findData("file"))
    refused("pick the workload file")  # caught before the daemon is asked
    assert page.form._invalid is page.form.workload_file
    bad = tmp_path / "day.csv"
    bad.write_text("model,prompt\nchat,hello\n")
    page.form.workload_file.setText(str(bad))
    refused("day.csv:1: not JSON")
    assert page.form._invalid is page.form.workload_file
    page.form.workload.setCurrentIndex(page.form.workload.findData("recorded"))
    refused("the request recorder holds no request to replay yet")
    assert page.form._invalid is page.form.workload
    assert page.running is None and daemon_thread.engine_state("chat") == EngineState.READY


def test_my_recorded_traffic_is_exported_and_replayed(
    qtbot, app: DesktopApp, daemon_thread
) -> None:
    d = daemon_thread
    page = _tune_page(qtbot, app, d, f"--token-delay {TOKEN_S}")
    client = openai.OpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0)
    for i in range(3):  # this computer's own traffic, kept by the request recorder
        client.chat.completions.create(
            model="chat", max_tokens=8, messages=[{"role": "user", "content": f"q{i}"}]
        )
    qtbot.waitUntil(lambda: len(d.run(lambda c: c.requests_list())) == 3)  # written in batches
    page.form.workload.setCurrentIndex(page.form.workload.findData("recorded"))
    page.form.concurrency.setValue(4)
    page.form.only.setText("max-num-seqs-16")
    page.start_button.click()

    def ended() -> bool:
        return page.status.state == "error" or (page.job is not None and page.job.state == "done")

    qtbot.waitUntil(ended, timeout=120000)
    assert page.job is not None and page.job.state == TuneState.DONE, page.status.message
    config = page.job.config
    assert config.workload == "file" and "your recorded traffic" in page.results.heading.text()
    path = Path(config.workload_file)
    assert path.parent == d.paths.state_dir / "tune"
    assert len(path.read_text().splitlines()) == 3
    run = d.run(lambda c: c.bench_run(page.job.measures[0].bench_run_id or 0))
    assert run.levels[0].completed == 3  # the three recorded requests, replayed


def test_the_folder_model_is_tuned_and_a_small_budget_offers_the_least(
    qtbot, app: DesktopApp, daemon_thread, tmp_path: Path
) -> None:
    """The only model this computer can run is a registered folder: the page lists it (the GPU
    presets greyed, with why), picks it, answers a 3-minute budget with the smallest that
    works as a button, and the button starts the tune of the folder, as it is."""
    d = daemon_thread
    model = make_tiny_hf_model(tmp_path / "tiny-chat")
    d.run(lambda c: c.add_local_folder(str(model), name="tiny"))
    page = app.open_dashboard("tune").page("tune")
    assert isinstance(page, TunePage)
    page.page_shown()
    qtbot.waitUntil(lambda: page.form.selected_profile() == "tiny", timeout=20000)
    combo = page.form.model
    assert combo.currentText() == "tiny (model folder)"
    preset = combo.findData("llama-3.1-8b-1gpu")
    entry = combo.model().item(preset)
    assert not entry.isEnabled() and "needs an NVIDIA GPU" in entry.toolTip()
    assert combo.itemText(preset).endswith(": cannot start here)")
    page.form.budget.setValue(3)
    page.form.requests.setValue(4)
    page.form.concurrency.setValue(2)
    page.form.only.setText("max-num-seqs-8")
    page.start_button.click()
    qtbot.waitUntil(lambda: page.use_budget.isVisible(), timeout=20000)
    assert page.status.state == "error"
    assert "the smallest budget that fits 2 candidates is 9 min" in page.status.message
    assert "--" not in page.status.message  # no command-line option in the app
    assert page.use_budget.text() == "Use 9 min"
    page.use_budget.click()
    assert page.form.budget.value() == 9 and not page.use_budget.isVisible()
    qtbot.waitUntil(
        lambda: page.job is not None and page.job.state == TuneState.DONE, timeout=120000
    )
    assert page.job.profile == "tiny" and page.job.config.budget_s == 540
    assert [r.key for r in page.job.rows] == ["default", "max-num-seqs-8"]


def test_simulated_figures_and_what_was_not_measured_are_said(qtbot) -> None:
    row = TuneRow(key="tp-2", label="tensor parallel on 2 GPUs", changes=("tensor_parallel = 2",),
                  runs=1, figures={"output_tps": 300.0, "power_mean_w": 700.0},
                  band={"output_tps": 0.02, "power_mean_w": 0.02}, verdict="one run",
                  cost_per_100m=2.5, error="did not start: no room")  # fmt: skip
    job = TuneJob(id=4, config=TuneConfig(model="chat"), state=TuneState.DONE, profile="chat",
                  rows=(row,), simulated=True, currency="EUR",
                  dropped=("KV cache fp8: the engine refuses --kv-cache-dtype",))  # fmt: skip
    view = TuneResults()
    qtbot.addWidget(view)
    view.show()
    view.show_job(job)
    assert view.simulated.isVisible() and "SIMULATED" in view.simulated.text()
    headers = [view.table.horizontalHeaderItem(i).text() for i in range(view.table.columnCount())]
    assert "Mean\nW\n(sim)" in headers and "Per 100 M\ntokens\n(sim)" in headers
    assert "Output\ntok/s" in headers  # measured by the gateway, not the GPUs
    assert view.table.item(0, HEADERS.index(COST)).text() == "2.50 EUR"
    verdict = view.table.item(0, HEADERS.index("Verdict"))
    assert verdict.text() == "one run, a run failed (hover for why)"
    assert "did not start: no room" in verdict.toolTip()
    assert "KV cache fp8: the engine refuses" in view.dropped.text()
    view.show_job(None)
    assert not view.simulated.isVisible() and not view.table.isVisible()


def test_the_table_gets_the_room_for_its_rows(qtbot, app_factory: AppFactory) -> None:
    """Eight candidates and nine left out: all eight rows show whole in the dashboard's own
    size, the "not measured" lines folded into one line that opens them."""
    figures = {"output_tps": 100.0, "ttft_p95_ms": 50.0}
    spread = {"output_tps": 0.3, "ttft_p95_ms": 0.1}
    rows = tuple(
        TuneRow(
            key=f"c{i}",
            label=f"candidate {i}",
            changes=(),
            runs=2,
            figures=figures,
            spread=spread,
            verdict="within noise",
        )
        for i in range(8)
    )
    dropped = tuple(f"candidate {i}: over the time budget (70 s a measurement)" for i in range(9))
    config = TuneConfig(model="chat")
    job = TuneJob(id=1, config=config, state=TuneState.DONE, rows=rows, dropped=dropped)
    app = app_factory(connect=False)
    dash = app.open_dashboard("tune")
    page = dash.page("tune")
    assert isinstance(page, TunePage)
    page.results.show_job(job)
    qtbot.waitUntil(lambda: page.results.table.isVisible())
    table = page.results.table
    qtbot.waitUntil(lambda: table.viewport().height() > 0)
    bottom = table.viewport().height()
    shown = [r for r in range(8) if table.rowViewportPosition(r) + table.rowHeight(r) <= bottom]
    assert shown == list(range(8)) and table.verticalScrollBar().maximum() == 0
    assert page.results.dropped_toggle.text() == "Not measured: 9 (show why)"
    assert not page.results.dropped.isVisible()
    page.results.dropped_toggle.click()
    assert page.results.dropped.isVisible() and "candidate 8: over" in page.results.dropped.text()


def test_without_the_daemon_the_page_says_so(qtbot, app_factory: AppFactory) -> None:
    app = app_factory(connect=False)
    page = app.open_dashboard("tune").page("tune")
    assert isinstance(page, TunePage)
    assert not page.start_button.isEnabled()
    assert "The traylm daemon is not running" in page.why.text()
    for button in (page.apply_button, page.undo_button, page.report_button, page.cancel_button):
        assert not button.isEnabled() and button.toolTip()


def test_an_interrupted_tune_says_what_was_started_again(
    qtbot, paths: Paths, fake_env: Path, app_factory: AppFactory
) -> None:
    """The file a daemon killed mid-tune leaves (written by the tuner's own writer: it had
    stopped chat for tune #4) is found by the next REAL daemon, which starts chat again and
    keeps the tune as interrupted; the page says so in words. The SIGKILL itself:
    tests/engines/tune/test_interrupted.py."""
    write_toml_atomic(
        paths.profiles_dir / "chat.toml",
        {"model": "org/chat", "served_name": "chat", "device": "cpu"},
    )
    chat = ProfileStore(paths.profiles_dir).load("chat")
    RunningTuneFile(paths.data_dir / "tune" / "running.json").write(4, "chat", time.time(), [chat])
    d = ThreadedDaemon(paths, fast_settings(free_loopback_port())).start()
    try:
        app = app_factory()
        qtbot.waitUntil(lambda: "chat" in app.state.served_models(), timeout=20000)
        page = app.open_dashboard("tune").page("tune")
        assert isinstance(page, TunePage)
        qtbot.waitUntil(lambda: page.job is not None, timeout=10000)
        assert page.job is not None and page.job.state == TuneState.INTERRUPTED
        assert page.progress.format() == "tune #4: interrupted"
        said = page.results.heading.text()
        assert "Tune #4 of chat" in said and "interrupted" in said
        assert "The daemon stopped mid-tune (killed or crashed)" in said
        assert "what ran before was started again: chat" in said
        app.shutdown()
    finally:
        d.stop()
