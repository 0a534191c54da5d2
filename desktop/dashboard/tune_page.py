"""Tune: `traylm tune` from the dashboard. Pick what to tune (the daemon's list of what can
start here: profiles, model folders, downloaded models; the loaded or last-used one first), a
workload (a preset, the recorded traffic or a file), a goal and a time budget (one too small is
answered with the smallest that works, offered as a button); Start; follow the tuner's
``tune.progress`` events (which candidate, starting or measuring, the time used against the
budget, the rows as they are measured); Cancel (the daemon starts again what ran before); then
this machine's table with the recommendation, Apply (the profile is written, the previous one
kept) and Undo. The daemon owns the run: a tune started with `traylm tune` shows here the same
way, and the last one is shown when the page opens.

Every button that cannot act now is disabled and the line under the buttons says why; an error
from the daemon is shown beside the form, and the field it names is marked and gets the focus.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Callable

from PySide6.QtCore import Qt, QTimer, QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from desktop.daemon.messages import CallResult, ConnectionChanged
from desktop.daemon.state import LOADED_STATES
from desktop.dashboard.page import Page, PageContext
from desktop.dashboard.tune_form import TuneForm
from desktop.dashboard.tune_results import TuneResults
from desktop.dashboard.tune_workload import FILE, RECORDED, export_recorded
from desktop.look.formatting import fmt_duration
from desktop.look.theme import primary
from desktop.widgets.result_label import ResultLabel
from engines.client import DaemonClient
from engines.config.tomlfile import write_bytes_atomic
from engines.events import (
    Event,
    TuneBudget,
    TuneConfig,
    TuneFinished,
    TuneJob,
    TuneProgress,
    TuneState,
)

OpenURL = Callable[[QUrl], object]
TIPS = {
    "startTune": "Plan the candidates, then start and measure each one in turn",
    "cancelTune": "Stops it; the engines that ran before are started again",
    "applyTune": "Write the recommended settings into the profile (the previous one is kept)",
    "undoTune": "Put back the profile as it was before the tuner",
    "tuneReport": "Open the tune's report (table and charts) in the browser",
}
NOT_RUNNING = (
    "The traylm daemon is not running, and the tuner runs inside it: start it with the button "
    "in the banner above (or `traylm serve`)."
)


class TunePage(Page):
    def __init__(self, ctx: PageContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        self.job: TuneJob | None = None  # the running tune, else the last one
        self.running: int | None = None  # its id while it runs
        self.previous: tuple[str, ...] = ()  # profiles whose pre-tune version Undo puts back
        self.busy = ""  # "starting" | "cancelling" | "applying" | "undoing" while a call runs
        self.progress_event: TuneProgress | None = None
        self._loaded: set[str] = set()  # engines ready when the targets were last asked for
        self._progress_at = 0.0  # monotonic time the event came
        self.open_url: OpenURL = QDesktopServices.openUrl  # tests look instead of opening
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        top = QHBoxLayout()
        self.form = TuneForm()
        top.addWidget(self.form, 3)
        top.addWidget(self._run_group(), 2)
        layout.addLayout(top)
        layout.addWidget(self._result_group(), 1)  # the table takes the page's width
        self.clock = QTimer(self)
        self.clock.setInterval(1000)
        self.clock.timeout.connect(self._show_clock)
        ctx.state.event_received.connect(self.on_event_received)
        ctx.state.profiles_changed.connect(self.load_targets)
        ctx.state.servable_changed.connect(self.load_targets)
        ctx.state.engines_changed.connect(self.on_engines_changed)
        ctx.state.connection_changed.connect(self.on_connection_changed)
        self.form.model.currentIndexChanged.connect(lambda _row: self.update_buttons())
        self.update_buttons()

    # ----------------------------------------------------------------- building

    def _run_group(self) -> QGroupBox:
        box = QGroupBox("Run")
        layout = QVBoxLayout(box)
        buttons = QHBoxLayout()
        self.start_button = primary(QPushButton("&Start tune"))
        self.start_button.setObjectName("startTune")
        self.start_button.clicked.connect(self.on_start_clicked)
        self.cancel_button = QPushButton("&Cancel tune")
        self.cancel_button.setObjectName("cancelTune")
        self.cancel_button.clicked.connect(self.on_cancel_clicked)
        buttons.addWidget(self.start_button)
        buttons.addWidget(self.cancel_button)
        buttons.addStretch(1)
        layout.addLayout(buttons)
        self.progress = QProgressBar()
        self.progress.setObjectName("tuneProgress")
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.progress.setFormat("no tune running")
        layout.addWidget(self.progress)
        self.now = QLabel("")
        self.now.setObjectName("tuneNow")
        self.now.setWordWrap(True)
        layout.addWidget(self.now)
        self.time_left = QLabel("")
        self.time_left.setObjectName("tuneClock")
        self.time_left.setWordWrap(True)
        layout.addWidget(self.time_left)
        self.status = ResultLabel("tuneStatus")
        layout.addWidget(self.status)
        self.use_budget = QPushButton("")
        self.use_budget.setObjectName("tuneUseBudget")
        self.use_budget.setToolTip("Set the budget to the smallest that works here, and start")
        self.use_budget.clicked.connect(self.on_use_budget_clicked)
        self.use_budget.hide()
        layout.addWidget(self.use_budget, 0, Qt.AlignmentFlag.AlignLeft)
        return box

    def _result_group(self) -> QGroupBox:
        box = QGroupBox("This machine's table")
        layout = QVBoxLayout(box)
        self.results = TuneResults()
        layout.addWidget(self.results, 1)
        row = QHBoxLayout()
        self.apply_button = primary(QPushButton("&Apply recommendation"))
        self.apply_button.setObjectName("applyTune")
        self.apply_button.clicked.connect(self.on_apply_clicked)
        self.undo_button = QPushButton("U&ndo the tuner's change")
        self.undo_button.setObjectName("undoTune")
        self.undo_button.clicked.connect(self.on_undo_clicked)
        self.report_button = QPushButton("HTML &report")
        self.report_button.setObjectName("tuneReport")
        self.report_button.clicked.connect(self.on_report_clicked)
        for b in (self.apply_button, self.undo_button, self.report_button):
            row.addWidget(b)
        row.addStretch(1)
        layout.addLayout(row)
        self.outcome = ResultLabel("tuneOutcome")
        layout.addWidget(self.outcome)
        self.why = QLabel("")
        self.why.setObjectName("tuneWhy")
        self.why.setWordWrap(True)
        layout.addWidget(self.why)
        return box

    # ----------------------------------------------------------------- what the daemon says

    def page_shown(self) -> None:
        self.refresh()

    def refresh(self) -> None:
        """Read the running or last tune and the profiles Undo can put back."""

        async def load(c: DaemonClient) -> tuple[TuneJob | None, tuple[str, ...]]:
            return await c.tune_current(), await c.tune_previous()

        def done(result: CallResult) -> None:
            if not result.ok or not isinstance(result.value, tuple):
                self.update_buttons()
                if self.ctx.state.connected:
                    self.status.error(result.error)
                return
            job, previous = result.value
            self.previous = tuple(previous)
            self.show_job(job if isinstance(job, TuneJob) else None)

        if self.ctx.state.connected:
            self.ctx.bridge.call(load, done)
            self.load_targets()
        self.update_buttons()

    def show_job(self, job: TuneJob | None) -> None:
        self.job = job
        running = job is not None and job.state == TuneState.RUNNING
        self.running = job.id if job is not None and running else None
        if running and self.progress_event is None and job is not None:
            self.progress.setRange(0, 0)  # busy until its next step says how far it is
            self.progress.setFormat(f"tune #{job.id} of {job.profile}: running")
        elif not running:
            self._stop_progress(job)
        self.results.show_job(job)
        self.update_buttons()

    def load_targets(self) -> None:
        """Ask the daemon again what can be tuned here (GET /api/tune/targets)."""

        def done(result: CallResult) -> None:
            if result.ok and isinstance(result.value, tuple):
                targets, left_out = result.value
                self.form.set_targets(targets, left_out, self.ctx.state.current_profile())
            self.update_buttons()

        if self.ctx.state.connected:
            self.ctx.bridge.call(lambda c: c.tune_targets(), done)
        self.update_buttons()

    def on_engines_changed(self) -> None:
        """An engine loaded or stopped: the "loaded" marks change (a tune's own candidates,
        ``tune-…``, are not targets and change nothing)."""
        loaded = {n for n, e in self.ctx.state.engines.items() if e.state in LOADED_STATES}
        if loaded != self._loaded:
            self._loaded = loaded
            self.load_targets()

    def on_connection_changed(self, conn: ConnectionChanged) -> None:
        if conn.state.usable:
            self.refresh()
        else:
            self.update_buttons()

    def on_event_received(self, event: Event) -> None:
        if isinstance(event, TuneProgress):
            if self.running != event.job_id or event.phase == "measured":
                self.refresh()  # started elsewhere, or a row changed: read the job again
            self.running = event.job_id
            self.progress_event, self._progress_at = event, time.monotonic()
            self._show_progress(event)
            self.update_buttons()
        elif isinstance(event, TuneFinished):
            self.running = None
            self.progress_event = None
            self.status.say(*finished_words(event.job_id, event.state, event.detail))
            self.refresh()

    # ----------------------------------------------------------------- progress

    def _show_progress(self, p: TuneProgress) -> None:
        self.progress.setRange(0, max(p.steps, 1))
        self.progress.setValue(min(p.step, max(p.steps, 1)))
        self.progress.setFormat(f"tune #{p.job_id}: {p.step} of {p.steps} measurements done")
        what = p.detail[:1].upper() + p.detail[1:]
        if p.phase in ("start", "measure") and p.candidate:
            what += f" (run {p.round + 1} of {self.job.config.repeat if self.job else '?'})"
        self.now.setText(what)
        self._show_clock()
        if not self.clock.isActive():
            self.clock.start()

    def _show_clock(self) -> None:
        p = self.progress_event
        if p is None or self.running is None:
            self.clock.stop()
            return
        used = p.elapsed_s + time.monotonic() - self._progress_at
        self.time_left.setText(
            f"{fmt_duration(used)} of the {fmt_duration(p.budget_s)} budget used · at most "
            f"{fmt_duration(max(0.0, p.budget_s - used))} left"
        )

    def _stop_progress(self, job: TuneJob | None) -> None:
        self.clock.stop()
        self.progress_event = None
        self.progress.setRange(0, 1)
        self.progress.setValue(1 if job is not None and job.state == TuneState.DONE else 0)
        self.progress.setFormat(f"tune #{job.id}: {job.state}" if job else "no tune running")
        self.now.setText("")
        self.time_left.setText("")

    # ----------------------------------------------------------------- buttons

    def update_buttons(self) -> None:
        """Enable what can act now; say under the buttons why the others cannot."""
        connected = self.ctx.state.connected
        job, running, profile = self.job, self.running, self.form.selected_profile()
        why_start = why_cancel = why_apply = why_undo = why_report = ""
        if not connected:
            why_start = why_apply = why_undo = why_report = NOT_RUNNING
        elif running is not None:
            who = f"#{running}" + (f" of {job.profile}" if job and job.id == running else "")
            why_start = (
                f"Tune {who} is running (started here or with `traylm tune`): follow it "
                "here, or cancel it."
            )
            why_apply = "Apply: wait until the running tune ends."
            if job is not None and profile == job.profile:
                why_undo = f"Undo: a tune of {profile} is running; cancel it first."
        elif not profile:
            why_start = (
                "Nothing to tune picked: pick a model that can start here, or add a model "
                "folder on the Models page."
            )
        if self.busy:  # one call at a time: a second click would race the first
            wait = f"Wait: {self.busy}…"
            why_start, why_apply, why_undo = why_start or wait, why_apply or wait, why_undo or wait
        if running is None:
            why_cancel = "Cancel: no tune is running."
        elif self.busy == "cancelling":
            why_cancel = "Cancelling: the engines that ran before are being started again."
        why_apply = why_apply or self._why_not_apply()
        if not why_undo and profile not in self.previous:
            why_undo = f"Undo: the tuner has not changed profile {profile or '(none)'}."
        if not why_report and job is None:
            why_report = "HTML report: no tune has run since the daemon started."
        tips = {**TIPS, "undoTune": f"Put back profile {profile} as it was before the tuner"}
        pairs = (
            (self.start_button, why_start),
            (self.cancel_button, why_cancel),
            (self.apply_button, why_apply),
            (self.undo_button, why_undo),
            (self.report_button, why_report),
        )
        for button, why in pairs:
            button.setEnabled(not why)
            button.setToolTip(why or tips[button.objectName()])
        reasons = dict.fromkeys(w for w in (why_start, why_apply, why_undo, why_report) if w)
        self.why.setText("\n".join(reasons))

    def _why_not_apply(self) -> str:
        job = self.job
        if job is None:
            return "Apply: run a tune first; its recommendation can then be written."
        if job.state != TuneState.DONE:
            return f"Apply: tune #{job.id} {job.state}, so there is nothing to apply."
        if not job.recommended:
            return "Apply: the tune recommends keeping your profile as it is."
        if job.applied and job.profile in self.previous:
            return f"Apply: already written into {job.profile}; Undo puts back the previous one."
        return ""

    # ----------------------------------------------------------------- actions

    def on_start_clicked(self) -> None:
        self.form.clear_invalid()
        try:
            config = self.form.config()
        except ValueError as exc:
            self.status.error(str(exc))
            return
        recorded = self.form.workload.currentData() == RECORDED
        folder = self.ctx.bridge.paths.state_dir / "tune"

        async def start(c: DaemonClient) -> TuneJob:
            if recorded:
                path, _count = await export_recorded(c, folder)
                return await c.tune_start(_with_file(config, str(path)))
            return await c.tune_start(config)

        def done(result: CallResult) -> None:
            self.busy = ""
            if result.ok and isinstance(result.value, TuneJob):
                job = result.value
                self.status.neutral(started_words(job))
                self.show_job(job)
            else:
                self.status.error(result.error)
                self.form.mark_invalid(self.form.field_for(result.error))
                if result.error_code == "tune_budget":
                    self._offer_least_budget(config)
                self.update_buttons()

        self.use_budget.hide()
        self.busy = "starting"
        self.status.neutral("Checking the candidates…")
        self.update_buttons()
        self.ctx.bridge.call(start, done)

    def _offer_least_budget(self, config: TuneConfig) -> None:
        """Ask the daemon for the smallest budget that works, and offer it as a button."""

        def done(result: CallResult) -> None:
            if result.ok and isinstance(result.value, TuneBudget):
                minutes = max(1, math.ceil(result.value.least_budget_s / 60))
                self.use_budget.setText(f"Use {minutes} min")
                self.use_budget.setProperty("minutes", minutes)
                self.use_budget.show()

        self.ctx.bridge.call(lambda c: c.tune_least_budget(config.model, config.repeat), done)

    def on_use_budget_clicked(self) -> None:
        self.form.budget.setValue(int(self.use_budget.property("minutes")))
        self.use_budget.hide()
        self.on_start_clicked()

    def on_cancel_clicked(self) -> None:
        def done(result: CallResult) -> None:
            self.busy = ""
            if result.ok and isinstance(result.value, TuneJob):
                job = result.value
                self.status.say(*finished_words(job.id, job.state, job.detail))
            else:
                self.status.error(result.error)
            self.refresh()

        self.busy = "cancelling"
        self.status.neutral("Cancelling: stopping the candidate, starting what ran before…")
        self.update_buttons()
        self.ctx.bridge.call(lambda c: c.tune_cancel(), done)

    def on_apply_clicked(self) -> None:
        def done(result: CallResult) -> None:
            self.busy = ""
            if result.ok and isinstance(result.value, TuneJob):
                job = result.value
                self.outcome.ok(
                    f"Profile {job.profile} now has the recommended settings; they apply the "
                    f"next time it loads. The previous profile is kept: Undo puts it back."
                )
                self.form.model.setCurrentIndex(max(0, self.form.model.findData(job.profile)))
                self.ctx.actions.reload_profiles()
            else:
                self.outcome.error(result.error)
            self.refresh()

        self.busy = "applying"
        self.update_buttons()
        self.ctx.bridge.call(lambda c: c.tune_apply(), done)

    def on_undo_clicked(self) -> None:
        profile = self.form.selected_profile()

        def done(result: CallResult) -> None:
            self.busy = ""
            if result.ok:
                self.outcome.ok(f"{str(result.value)[:1].upper()}{str(result.value)[1:]}.")
                self.ctx.actions.reload_profiles()
            else:
                self.outcome.error(result.error)
            self.refresh()

        self.busy = "undoing"
        self.update_buttons()
        self.ctx.bridge.call(lambda c: c.tune_undo(profile), done)

    def on_report_clicked(self) -> None:
        job = self.job
        if job is None:
            return
        path = self.ctx.bridge.paths.state_dir / "reports" / f"tune-{job.id}.html"

        async def write(c: DaemonClient) -> str:
            text = await c.tune_report_html()
            await asyncio.to_thread(write_bytes_atomic, path, text.encode(), 0o600)
            return str(path)

        def done(result: CallResult) -> None:
            if result.ok and isinstance(result.value, str):
                self.outcome.ok(f"Report written to {result.value}")
                self.open_url(QUrl.fromLocalFile(result.value))
            else:
                self.outcome.error(result.error)

        self.ctx.bridge.call(write, done)


def _with_file(config: TuneConfig, path: str) -> TuneConfig:
    return dataclasses.replace(config, workload=FILE, workload_file=path)


def started_words(job: TuneJob) -> str:
    """What a start says (the counts are the progress bar's and the table's: they change as
    the tuner learns how long a measurement takes)."""
    return f"Tune #{job.id} of {job.profile} started: its rows appear below as they are measured."


def finished_words(job_id: int, state: TuneState, detail: str) -> tuple[str, str]:
    """The status line's state and words for a tune's end."""
    said = f" ({detail})" if detail and detail != "cancelled" else ""
    if state == TuneState.DONE:
        return "ok", f"Tune #{job_id} done: the table and the recommendation are below."
    if state == TuneState.CANCELLED:
        return "warning", (
            f"Tune #{job_id} cancelled: the engines that ran before were started again, and "
            f"your profile is unchanged{said}."
        )
    return "error", (
        f"Tune #{job_id} failed{said}. The engines that ran before were started again, and your "
        "profile is unchanged."
    )
