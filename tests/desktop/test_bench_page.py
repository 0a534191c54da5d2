"""The Benchmarks page against a real daemon on two SIMULATED GPUs and the FAKE vLLM engine (known
token delays): a run started from the form shows progress and its figures (with the daemon's
TPOT definition), a second one is cancelled, two runs compare, and the HTML report is written
and handed to the browser."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import QItemSelectionModel, QUrl

from desktop.app import DesktopApp
from desktop.dashboard.bench_page import BenchPage, parse_levels, progress_text
from desktop.dashboard.bench_results import COLUMNS
from desktop.dashboard.requests_page import COLUMNS as COLUMNS_REQ
from engines.events import BenchConfig, BenchProgress, BenchState
from tests.desktop.conftest import ThreadedDaemon

pytestmark = pytest.mark.slow


def _bench_page(app: DesktopApp) -> BenchPage:
    page = app.open_dashboard("bench").page("bench")
    assert isinstance(page, BenchPage)
    return page


def _start_engine(qtbot, app: DesktopApp, d: ThreadedDaemon, args: str) -> None:
    d.write_fake_profile("fake", args=args, gpus=[0, 1])
    app.actions.reload_profiles()
    qtbot.waitUntil(lambda: app.state.profile("fake") is not None)
    app.actions.start_profile("fake")
    qtbot.waitUntil(lambda: "fake" in app.state.served_models(), timeout=20000)


def _run_state(page: BenchPage, run_id: int) -> str:
    return next((str(s.state) for s in page.summaries if s.id == run_id), "")


def test_start_a_run_see_progress_and_results(qtbot, sim_app, sim_daemon_thread) -> None:
    app = sim_app
    _start_engine(qtbot, app, sim_daemon_thread, "--first-token-delay 0.05 --token-delay 0.01")
    page = _bench_page(app)
    qtbot.waitUntil(lambda: page.model.currentText() == "fake" and page.start_button.isEnabled())
    page.levels.setText("1, 2")
    page.input_len.setValue(16)
    page.output_len.setValue(8)
    page.requests.setValue(4)
    page.name.setText("first")
    progress: list[BenchProgress] = []
    app.state.event_received.connect(
        lambda e: progress.append(e) if isinstance(e, BenchProgress) else None
    )
    page.start_button.click()
    qtbot.waitUntil(lambda: page.running is not None, timeout=10000)
    run_id = page.running
    assert not page.start_button.isEnabled() and page.cancel_button.isEnabled()
    qtbot.waitUntil(lambda: page.running is None, timeout=60000)
    assert progress and {p.concurrency for p in progress} == {1, 2}
    assert page.progress.value() == 1000 and "done" in page.progress.format()
    qtbot.waitUntil(lambda: _run_state(page, run_id) == "done", timeout=10000)
    assert page.selected_ids() == [run_id]
    results = page.results
    qtbot.waitUntil(lambda: results.table.rowCount() == 2, timeout=10000)
    assert results.table.horizontalHeaderItem(5).text() == "TTFT\np50 / p99"
    row = {h: results.table.item(0, i).text() for i, h in enumerate(COLUMNS)}
    assert row["Concurrency"] == "1" and row["Done / failed"] == "4 / 0"
    ttft_p50, ttft_p99 = (float(x) for x in row["TTFT p50 / p99"].split(" / "))
    assert 50 <= ttft_p50 <= ttft_p99  # the fake engine waits 50 ms for its first token
    assert float(row["TPOT p50 / p99"].split(" / ")[0]) >= 10
    assert float(row["Output tok/s"]) > 0
    assert row["J/token"].endswith("(sim)") and row["Mean W"].endswith("(sim)")
    assert "TPOT = (E2EL − TTFT) / (output tokens − 1)" in results.definitions.text()
    assert "AIPerf calls this TPOT 'ITL'" in results.definitions.text()
    assert f"#{run_id} first" in results.heading.text()


def test_cancel_compare_and_report(qtbot, sim_app, sim_daemon_thread, tmp_path: Path) -> None:
    app, d = sim_app, sim_daemon_thread
    _start_engine(qtbot, app, d, "--token-delay 0.02")
    page = _bench_page(app)
    qtbot.waitUntil(lambda: page.start_button.isEnabled())
    page.levels.setText("1")
    page.output_len.setValue(4)
    page.requests.setValue(3)
    page.start_button.click()
    qtbot.waitUntil(lambda: page.running is not None, timeout=10000)
    first = page.running
    qtbot.waitUntil(lambda: page.running is None, timeout=60000)
    page.levels.setText("1,2")
    page.output_len.setValue(200)
    page.requests.setValue(50)
    measured: list[BenchProgress] = []
    app.state.event_received.connect(
        lambda e: measured.append(e) if isinstance(e, BenchProgress) and e.completed else None
    )
    page.start_button.click()
    qtbot.waitUntil(lambda: bool(measured) and page.progress.value() > 0, timeout=20000)
    second = page.running
    assert second == measured[0].run_id and "measure" in page.progress.format()
    page.cancel_button.click()
    qtbot.waitUntil(lambda: page.running is None, timeout=30000)
    qtbot.waitUntil(lambda: _run_state(page, second) == BenchState.CANCELLED, timeout=10000)
    assert "cancelled" in page.progress.format()
    # compare the two runs
    page.table.clearSelection()
    flags = QItemSelectionModel.SelectionFlag.Select | QItemSelectionModel.SelectionFlag.Rows
    for r, s in enumerate(page.summaries):
        if s.id in (first, second):  # as a Ctrl+click would
            page.table.selectionModel().select(page.table.model().index(r, 0), flags)
    assert sorted(page.selected_ids()) == sorted([first, second])
    assert page.compare_button.isEnabled()
    page.compare_button.click()
    results = page.results
    qtbot.waitUntil(lambda: len(results.runs) == 2, timeout=10000)
    assert not results.table.isColumnHidden(0)  # a Run column tells the rows apart
    assert f"#{second} against #{first}" in results.comparison.text()
    assert "concurrency 1: output tok/s" in results.comparison.text()
    assert "(cut short)" in results.table.item(results.table.rowCount() - 1, 1).text()
    # the HTML report is written and given to the browser
    opened: list[QUrl] = []
    page.open_url = opened.append
    page.report_button.click()
    qtbot.waitUntil(lambda: bool(opened), timeout=10000)
    path = Path(opened[0].toLocalFile())
    assert path.parent == d.paths.state_dir / "reports" and path.exists()
    assert "<html" in path.read_text().lower()
    # a bad concurrency text is caught before the daemon sees it
    page.levels.setText("1, many")
    page.start_button.click()
    assert page.status.state == "error" and "whole numbers" in page.status.message


def test_parse_levels() -> None:
    assert parse_levels("1, 4,16") == (1, 4, 16)
    with pytest.raises(ValueError, match="at least one level"):
        parse_levels("0")


def test_failures_say_why_and_the_tuners_runs_stay_out_of_the_way(
    qtbot, sim_app, sim_daemon_thread
) -> None:
    app, d = sim_app, sim_daemon_thread
    _start_engine(qtbot, app, d, "--token-delay 0.2")
    failing = BenchConfig(  # each reply takes 1.6 s: past the request timeout
        model="fake", concurrency=(1,), requests=2, warmup=0, output_len=8, request_timeout_s=0.4
    )
    bad = d.run(lambda c: c.bench_start(failing)).id
    tuned = BenchConfig(
        model="fake", concurrency=(1,), requests=2, warmup=0, output_len=2, made_by="tune"
    )
    qtbot.waitUntil(lambda: d.run(lambda c: c.bench_current())[0] is None, timeout=30000)
    by_tuner = d.run(lambda c: c.bench_start(tuned)).id
    qtbot.waitUntil(lambda: d.run(lambda c: c.bench_current())[0] is None, timeout=30000)
    page = _bench_page(app)
    page.reload(select=bad)
    qtbot.waitUntil(lambda: any(s.id == bad for s in page.summaries), timeout=10000)
    assert all(s.id != by_tuner for s in page.summaries)  # a tuner's measurement: left out
    page.show_tuner_runs.setChecked(True)
    qtbot.waitUntil(lambda: any(s.id == by_tuner for s in page.summaries), timeout=10000)
    page.reload(select=bad)
    results = page.results
    qtbot.waitUntil(lambda: results.failures.isVisibleTo(results), timeout=10000)
    cell = results.table.item(0, COLUMNS.index("Done / failed"))
    assert cell.text() == "0 / 2" and cell.toolTip().startswith("2 × ")
    assert "no reason" not in cell.toolTip()
    assert f"Run #{bad}, concurrency 1: 2 × " in results.failures.text()


def test_the_progress_line_reads_without_empty_parts() -> None:
    def line(detail: str, tps: float) -> str:
        progress = BenchProgress(
            run_id=1,
            phase="measure",
            level_index=0,
            levels_total=1,
            concurrency=1,
            detail=detail,
            output_throughput_tps=tps,
        )
        return progress_text(progress)

    assert line("", 648.7) == "measure: 648.7 tok/s so far"
    assert line("level 1", 0.0) == "measure: level 1"
    assert line("", 0.0) == "measure"


def test_a_failed_run_names_its_log_and_its_requests_are_in_requests(
    qtbot, sim_app, sim_daemon_thread
) -> None:
    app, d = sim_app, sim_daemon_thread
    _start_engine(qtbot, app, d, "--no-text")  # every reply ends without text
    config = BenchConfig(model="fake", concurrency=(1,), requests=2, warmup=0, output_len=4)
    bad = d.run(lambda c: c.bench_start(config)).id
    qtbot.waitUntil(lambda: d.run(lambda c: c.bench_current())[0] is None, timeout=30000)
    page = _bench_page(app)
    page.reload(select=bad)
    results = page.results
    qtbot.waitUntil(lambda: results.failures.isVisibleTo(results), timeout=10000)
    log = d.paths.logs_dir / "bench" / f"run-{bad}.log"
    assert f"Run #{bad}'s log names each failed request" in results.failures.text()
    assert str(log) in results.failures.text()
    assert "the reply carried no text" in log.read_text()

    requests = app.open_dashboard("requests").page("requests")
    requests.client_filter.setCurrentIndex(requests.client_filter.findData("bench"))
    qtbot.waitUntil(lambda: requests.table.rowCount() == 2, timeout=10000)
    assert requests.table.item(0, COLUMNS_REQ.index("Client")).text() == "bench"
    requests.table.selectRow(0)
    qtbot.waitUntil(lambda: "error:" in requests.text.toPlainText(), timeout=10000)
    detail = requests.text.toPlainText()
    assert f"client bench run #{bad}" in detail
    assert f"error: benchmark run #{bad}: the reply carried no text" in detail
