"""Benchmarks: the stored runs, a form that starts one against a served model (concurrency levels,
prompt and output lengths), its live progress from ``bench.progress`` events with Cancel, the
figures of a run or of two runs compared, and the HTML report (opened in the browser)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QColor, QDesktopServices
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from desktop.daemon.messages import CallResult
from desktop.dashboard.bench_results import BenchResults
from desktop.dashboard.page import Page, PageContext
from desktop.look.formatting import fmt_when
from desktop.look.theme import primary
from desktop.widgets.result_label import ResultLabel
from desktop.widgets.table import SelectionMode, read_only_table
from engines.client import DaemonClient
from engines.events import (
    BenchConfig,
    BenchFinished,
    BenchProgress,
    BenchRun,
    BenchRunSummary,
    BenchState,
    Event,
)

COLUMNS = ("ID", "Name", "State", "Model", "Workload", "Levels", "Best tok/s", "J/token")
STATE_COLORS = {
    BenchState.DONE: "#2f9e44",
    BenchState.RUNNING: "#1971c2",
    BenchState.FAILED: "#d62828",
    BenchState.CANCELLED: "#6c737d",
    BenchState.INTERRUPTED: "#e67700",
}
OpenURL = Callable[[QUrl], object]


def parse_levels(text: str) -> tuple[int, ...]:
    """Concurrency levels from text: "1, 4, 16" → (1, 4, 16); ValueError says what to type."""
    try:
        levels = tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise ValueError("concurrency: whole numbers separated by commas, e.g. 1,4,16") from None
    if not levels or any(n < 1 for n in levels):
        raise ValueError("concurrency: at least one level, each 1 or more, e.g. 1,4,16")
    return levels


class BenchPage(Page):
    def __init__(self, ctx: PageContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        self.summaries: tuple[BenchRunSummary, ...] = ()
        self.running: int | None = None
        self._wanted: list[int] = []
        self.open_url: OpenURL = QDesktopServices.openUrl  # tests look instead of opening
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        top = QHBoxLayout()
        start = self._start_group()
        start.setMaximumWidth(350)
        top.addWidget(start)
        top.addWidget(self._runs_group(), 1)
        split = QSplitter(Qt.Orientation.Vertical)
        head = QWidget()
        head.setLayout(top)
        split.addWidget(head)
        self.results = BenchResults()
        split.addWidget(self.results)
        split.setSizes([330, 330])
        layout.addWidget(split, 1)
        ctx.state.event_received.connect(self.on_event_received)
        ctx.state.engines_changed.connect(self.on_engines_changed)
        self.on_engines_changed()

    # ----------------------------------------------------------------- building

    def _start_group(self) -> QGroupBox:
        box = QGroupBox("New run")
        form = QFormLayout(box)
        self.model = QComboBox()
        self.model.setObjectName("benchModel")
        form.addRow("Model (served)", self.model)
        self.levels = QLineEdit("1,4,16")
        self.levels.setObjectName("benchLevels")
        self.levels.setToolTip("Most requests in flight, one level after the other")
        form.addRow("Concurrency", self.levels)
        self.input_len = QSpinBox(minimum=1, maximum=131072, value=128, suffix=" tokens")
        self.input_len.setObjectName("benchInputLen")
        form.addRow("Prompt length", self.input_len)
        self.output_len = QSpinBox(minimum=1, maximum=32768, value=128, suffix=" tokens")
        self.output_len.setObjectName("benchOutputLen")
        form.addRow("Output length", self.output_len)
        self.requests = QSpinBox(minimum=0, maximum=100000, value=0)
        self.requests.setObjectName("benchRequests")
        self.requests.setSpecialValueText("auto: max(32, 4 × level)")
        form.addRow("Requests per level", self.requests)
        self.workload = QComboBox()
        self.workload.setObjectName("benchWorkload")
        self.workload.addItem("random (fixed lengths)", "random")
        self.workload.addItem("chat (varied prompts)", "chat")
        form.addRow("Workload", self.workload)
        self.name = QLineEdit()
        self.name.setObjectName("benchName")
        self.name.setPlaceholderText("optional, e.g. 350 W tp2")
        form.addRow("Name", self.name)
        buttons = QHBoxLayout()
        self.start_button = primary(QPushButton("Start benchmark"))
        self.start_button.setObjectName("startBench")
        self.start_button.clicked.connect(self.on_start_clicked)
        self.cancel_button = QPushButton("Cancel run")
        self.cancel_button.setObjectName("cancelBench")
        self.cancel_button.setEnabled(False)
        self.cancel_button.clicked.connect(self.on_cancel_clicked)
        buttons.addWidget(self.start_button)
        buttons.addWidget(self.cancel_button)
        buttons.addStretch(1)
        form.addRow(buttons)
        self.progress = QProgressBar()
        self.progress.setObjectName("benchProgress")
        self.progress.setRange(0, 1000)
        self.progress.setValue(0)
        self.progress.setFormat("no run")
        form.addRow(self.progress)
        self.status = ResultLabel("benchStatus")
        form.addRow(self.status)
        return box

    def _runs_group(self) -> QGroupBox:
        box = QGroupBox("Runs")
        layout = QVBoxLayout(box)
        self.table = read_only_table(
            COLUMNS,
            "benchRuns",
            selection=SelectionMode.ExtendedSelection,
            on_select=self.on_selection_changed,
        )
        layout.addWidget(self.table, 1)
        row = QHBoxLayout()
        refresh = QPushButton("Refresh")
        refresh.clicked.connect(self.reload)
        self.compare_button = QPushButton("Compare")
        self.compare_button.setToolTip("Compare the two selected runs")
        self.compare_button.setObjectName("compareBench")
        self.compare_button.clicked.connect(self.on_compare_clicked)
        self.report_button = QPushButton("HTML report")
        self.report_button.setToolTip("Open the selected run's HTML report")
        self.report_button.setObjectName("benchReport")
        self.report_button.clicked.connect(self.on_report_clicked)
        self.delete_button = QPushButton("Delete")
        self.delete_button.setObjectName("deleteBench")
        self.delete_button.clicked.connect(self.on_delete_clicked)
        for b in (refresh, self.compare_button, self.report_button, self.delete_button):
            row.addWidget(b)
        row.addStretch(1)
        self.show_tuner_runs = QCheckBox("Show the tuner's runs")
        self.show_tuner_runs.setObjectName("showTunerRuns")
        self.show_tuner_runs.setToolTip(
            "A tune measures each candidate with a benchmark run of its own; they are kept here "
            "too, and left out of this list unless this is on"
        )
        self.show_tuner_runs.toggled.connect(lambda _on: self.reload())
        row.addWidget(self.show_tuner_runs)
        layout.addLayout(row)
        self.result = ResultLabel("benchResult")
        layout.addWidget(self.result)
        return box

    # ----------------------------------------------------------------- runs list

    def page_shown(self) -> None:
        self.reload()
        self.ctx.bridge.call(lambda c: c.bench_current(), self._on_current)

    def reload(self, select: int | None = None) -> None:
        self.ctx.bridge.call(lambda c: c.bench_runs(), lambda r: self._on_runs(r, select))

    def _on_runs(self, result: CallResult, select: int | None) -> None:
        if not result.ok or not isinstance(result.value, tuple):
            self.result.error(result.error)
            return
        keep = self.selected_ids() if select is None else [select]
        tuner = self.show_tuner_runs.isChecked()
        self.summaries = tuple(
            s
            for s in result.value
            if isinstance(s, BenchRunSummary) and (tuner or s.made_by != "tune")
        )
        self.table.setRowCount(len(self.summaries))
        for r, s in enumerate(self.summaries):
            best = (
                f"{s.best_output_throughput_tps:.1f} @ {s.best_concurrency}"
                if (s.best_output_throughput_tps is not None)
                else "–"
            )
            joules = f"{s.joules_per_token:.2f}" if s.joules_per_token is not None else "–"
            sim = " (sim)" if s.simulated and s.joules_per_token else ""
            values = (
                str(s.id),
                s.name,
                str(s.state),
                s.model,
                f"{s.workload} {s.input_len}/{s.output_len}",
                ",".join(map(str, s.concurrency)),
                best,
                joules + sim,
            )
            for c, value in enumerate(values):
                item = QTableWidgetItem(value)
                item.setToolTip(f"{s.engine or 'engine unknown'} · started {fmt_when(s.created_s)}")
                if c == 2:
                    item.setForeground(QColor(STATE_COLORS.get(s.state, "#6c737d")))
                    item.setToolTip(s.detail)
                self.table.setItem(r, c, item)
        for r, s in enumerate(self.summaries):
            if s.id in keep:
                self.table.selectRow(r)
        self.on_selection_changed()

    def selected_ids(self) -> list[int]:
        rows = sorted({i.row() for i in self.table.selectionModel().selectedRows()})
        return [self.summaries[r].id for r in rows if r < len(self.summaries)]

    def on_selection_changed(self) -> None:
        ids = self.selected_ids()
        self.compare_button.setEnabled(len(ids) == 2)
        self.report_button.setEnabled(bool(ids))
        self.delete_button.setEnabled(bool(ids) and self.running not in ids)
        if len(ids) == 1:
            self.show_runs(ids)

    def show_runs(self, ids: list[int]) -> None:
        async def load(c: DaemonClient) -> tuple[BenchRun, ...]:
            return tuple(await asyncio.gather(*(c.bench_run(i) for i in ids)))

        def done(result: CallResult) -> None:
            if result.ok and isinstance(result.value, tuple) and ids == self._wanted:
                self.results.show_runs(tuple(r for r in result.value if isinstance(r, BenchRun)))
            elif not result.ok:
                self.result.error(result.error)

        self._wanted = ids
        self.ctx.bridge.call(load, done)

    def on_compare_clicked(self) -> None:
        ids = self.selected_ids()
        if len(ids) == 2:
            self.show_runs(sorted(ids))

    def on_report_clicked(self) -> None:
        ids = sorted(self.selected_ids())
        folder = self.ctx.bridge.paths.state_dir / "reports"

        async def write(c: DaemonClient) -> str:
            text = await c.bench_report_html(ids)
            path = folder / f"bench-{'-'.join(map(str, ids))}.html"
            await asyncio.to_thread(_write_text, path, text)
            return str(path)

        def done(result: CallResult) -> None:
            if result.ok and isinstance(result.value, str):
                self.result.ok(f"Report written to {result.value}")
                self.open_url(QUrl.fromLocalFile(result.value))
            else:
                self.result.error(result.error)

        self.ctx.bridge.call(write, done)

    def on_delete_clicked(self) -> None:
        ids = self.selected_ids()

        async def delete(c: DaemonClient) -> None:
            for run_id in ids:
                await c.bench_delete(run_id)

        def done(result: CallResult) -> None:
            if result.ok:
                self.result.ok(f"Deleted run {', '.join(map(str, ids))}")
            else:
                self.result.error(result.error)
            self.reload()

        self.ctx.bridge.call(delete, done)

    # ----------------------------------------------------------------- a run

    def on_engines_changed(self) -> None:
        current = self.model.currentText()
        models = self.ctx.state.served_models()
        if models == [self.model.itemText(i) for i in range(self.model.count())]:
            return
        self.model.clear()
        self.model.addItems(models)
        if current in models:
            self.model.setCurrentText(current)
        self._update_start()

    def _update_start(self) -> None:
        can = self.model.count() > 0 and self.running is None
        self.start_button.setEnabled(can)
        self.start_button.setToolTip(
            "" if self.model.count() else "Start an engine first: only served models can be run"
        )
        self.cancel_button.setEnabled(self.running is not None)

    def config(self) -> BenchConfig:
        return BenchConfig(
            model=self.model.currentText(),
            workload=str(self.workload.currentData()),
            input_len=self.input_len.value(),
            output_len=self.output_len.value(),
            concurrency=parse_levels(self.levels.text()),
            requests=self.requests.value(),
            name=self.name.text().strip(),
        )

    def on_start_clicked(self) -> None:
        try:
            config = self.config()
        except ValueError as exc:
            self.status.error(str(exc))
            return

        def done(result: CallResult) -> None:
            if result.ok and isinstance(result.value, BenchRun):
                self._running(result.value.id)
                self.status.neutral(f"Run #{result.value.id} started")
                self.reload(select=result.value.id)
            else:
                self.status.error(result.error)

        self.status.neutral("Starting…")
        self.ctx.bridge.call(lambda c: c.bench_start(config), done)

    def on_cancel_clicked(self) -> None:
        run_id = self.running
        if run_id is None:
            return

        def done(result: CallResult) -> None:
            if not result.ok:
                self.status.error(result.error)

        self.ctx.bridge.call(lambda c: c.bench_cancel(run_id), done)

    def _running(self, run_id: int | None) -> None:
        if run_id is not None and run_id != self.running:
            self.progress.setValue(0)
            self.progress.setFormat(f"run #{run_id}: starting")
        self.running = run_id
        self._update_start()

    def _on_current(self, result: CallResult) -> None:
        if not result.ok or not isinstance(result.value, tuple):
            return
        run, progress = result.value
        if isinstance(run, BenchRunSummary):
            self._running(run.id)
            if isinstance(progress, BenchProgress):
                self._show_progress(progress)

    def on_event_received(self, event: Event) -> None:
        if isinstance(event, BenchProgress):
            if self.running is None:
                self._running(event.run_id)
            self._show_progress(event)
        elif isinstance(event, BenchFinished):
            s = event.summary
            self._running(None)
            self.progress.setValue(1000 if s.state == BenchState.DONE else self.progress.value())
            self.progress.setFormat(f"run #{s.id}: {s.state}")
            text = f"Run #{s.id} {s.state}" + (f": {s.detail}" if s.detail else "")
            (self.status.ok if s.state == BenchState.DONE else self.status.warning)(text)
            if self.isVisible() or self.summaries:
                self.reload(select=s.id)

    def _show_progress(self, p: BenchProgress) -> None:
        share = p.completed / p.total if p.total else 0.0
        overall = (p.level_index + (share if p.phase == "measure" else 0.0)) / max(
            p.levels_total, 1
        )
        self.progress.setValue(round(1000 * overall))
        self.progress.setFormat(
            f"run #{p.run_id} · level {p.level_index + 1}/{p.levels_total} "
            f"(concurrency {p.concurrency}) · {p.phase} {p.completed}/{p.total}"
        )
        self.status.neutral(progress_text(p))


def progress_text(p: BenchProgress) -> str:
    """The status line of a running benchmark: its phase, what it does, the rate so far."""
    parts = [p.detail] if p.detail else []
    if p.output_throughput_tps:
        parts.append(f"{p.output_throughput_tps:.1f} tok/s so far")
    return f"{p.phase}: {', '.join(parts)}" if parts else p.phase


def _write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
