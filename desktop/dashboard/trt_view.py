"""TensorRT-LLM on the Engines page: engine builds in progress (``trt.build`` events, step i of n
with the ETA learnt from past builds) and the cache of built engines, with Remove (refused while an
engine serves from it) and Prune (engines built for another TensorRT-LLM or GPU; least recently
used past a size budget)."""

from __future__ import annotations

import html

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QDoubleSpinBox,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from desktop.daemon.messages import CallResult
from desktop.dashboard.page import PageContext
from desktop.look.formatting import fmt_bytes, fmt_duration, fmt_when
from desktop.widgets.result_label import ResultLabel
from desktop.widgets.table import read_only_table
from engines.events import Event, TRTBuildProgress, TRTCacheEntry

COLUMNS = (
    "Model",
    "Quantization",
    "TP × PP",
    "Size",
    "Build took",
    "Last used",
    "In use by",
    "Runs here",
)


class TRTView(QWidget):
    def __init__(self, ctx: PageContext, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.entries: tuple[TRTCacheEntry, ...] = ()
        self.builds: dict[str, TRTBuildProgress] = {}
        layout = QVBoxLayout(self)
        builds = QGroupBox("Builds")
        builds_layout = QVBoxLayout(builds)
        self.builds_box = QVBoxLayout()
        builds_layout.addLayout(self.builds_box)
        self.no_builds = QLabel(
            "No build running. A profile with engine = trtllm and mode = build builds its engine "
            "on first start (minutes); later starts reuse it from the cache below."
        )
        self.no_builds.setObjectName("noBuilds")
        self.no_builds.setWordWrap(True)
        builds_layout.addWidget(self.no_builds)
        self.bars: dict[str, QProgressBar] = {}
        layout.addWidget(builds)
        layout.addWidget(self._cache_group(), 1)
        self._live: frozenset[tuple[str, str]] = frozenset()
        ctx.state.event_received.connect(self.on_event_received)
        ctx.state.engines_changed.connect(self.on_engines_changed)

    def _cache_group(self) -> QGroupBox:
        box = QGroupBox("Engine cache")
        layout = QVBoxLayout(box)
        self.table = read_only_table(
            COLUMNS,
            "trtCache",
            on_select=self.on_selection_changed,
        )
        layout.addWidget(self.table, 1)
        row = QHBoxLayout()
        refresh = QPushButton("Refresh")
        refresh.clicked.connect(self.reload)
        self.remove_button = QPushButton("Remove")
        self.remove_button.setObjectName("removeTrtEngine")
        self.remove_button.clicked.connect(self.on_remove_clicked)
        self.prune_stale = QPushButton("Remove engines that cannot run here")
        self.prune_stale.setObjectName("pruneStale")
        self.prune_stale.setToolTip("Built for another TensorRT-LLM version, GPU or driver")
        self.prune_stale.clicked.connect(lambda: self.prune(stale=True))
        self.budget = QDoubleSpinBox(minimum=0, maximum=100000, decimals=0, suffix=" GiB")
        self.budget.setObjectName("trtBudget")
        self.budget.setValue(200)
        self.prune_budget = QPushButton("Keep within")
        self.prune_budget.setObjectName("pruneBudget")
        self.prune_budget.setToolTip("Remove least recently used engines past this size")
        self.prune_budget.clicked.connect(lambda: self.prune(budget_gib=self.budget.value()))
        for w in (refresh, self.remove_button, self.prune_stale, self.prune_budget, self.budget):
            row.addWidget(w)
        row.addStretch(1)
        layout.addLayout(row)
        self.detail = QLabel("")
        self.detail.setObjectName("trtDetail")
        self.detail.setWordWrap(True)
        self.detail.setTextFormat(Qt.TextFormat.RichText)
        layout.addWidget(self.detail)
        self.result = ResultLabel("trtResult")
        layout.addWidget(self.result)
        return box

    # ----------------------------------------------------------------- daemon → widgets

    def reload(self) -> None:
        settings = self.ctx.state.settings
        if settings is not None and not self.budget.property("set"):
            self.budget.setValue(settings.trt.cache_budget_gib)
            self.budget.setProperty("set", True)
        self.ctx.bridge.call(lambda c: c.trt_cache(), self._on_cache)
        self.ctx.bridge.call(lambda c: c.trt_builds(), self._on_builds)

    def _on_builds(self, result: CallResult) -> None:
        if result.ok and isinstance(result.value, tuple):
            for build in result.value:
                if isinstance(build, TRTBuildProgress):
                    self._show_build(build)

    def _on_cache(self, result: CallResult) -> None:
        if not result.ok or not isinstance(result.value, tuple):
            self.result.error(result.error)
            return
        self.entries = tuple(e for e in result.value if isinstance(e, TRTCacheEntry))
        self.table.setRowCount(len(self.entries))
        for r, e in enumerate(self.entries):
            values = (
                e.model,
                e.quant_recipe or "none",
                f"{e.tensor_parallel_size} × {e.pipeline_parallel_size}",
                fmt_bytes(e.size_bytes),
                fmt_duration(e.build_s),
                fmt_when(e.last_used_s),
                ", ".join(e.in_use_by) or "–",
                "yes" if e.compatible else f"NO: {e.problem}",
            )
            for c, value in enumerate(values):
                item = QTableWidgetItem(value)
                if c == 7 and not e.compatible:
                    item.setForeground(QColor("#d62828"))
                self.table.setItem(r, c, item)
        if self.entries and self.table.currentRow() < 0:
            self.table.selectRow(0)
        if not self.entries:
            self.detail.setText("No TensorRT engine built yet.")
        self.on_selection_changed()

    def on_engines_changed(self) -> None:
        """ "In use by" follows the engines: read the cache again when one changes state."""
        live = frozenset((e.engine_id, str(e.state)) for e in self.ctx.state.engines.values())
        if live != self._live:
            self._live = live
            if self.isVisible():
                self.reload()

    def on_event_received(self, event: Event) -> None:
        if isinstance(event, TRTBuildProgress):
            self._show_build(event)
            if event.state != "running":
                self.reload()

    def _show_build(self, b: TRTBuildProgress) -> None:
        bar = self.bars.get(b.engine_id)
        if bar is None:
            bar = QProgressBar()
            bar.setObjectName(f"build-{b.engine_id}")
            bar.setRange(0, 1000)
            self.bars[b.engine_id] = bar
            self.builds_box.addWidget(bar)
        self.builds[b.engine_id] = b
        if b.state == "done":
            bar.setValue(1000)
        elif b.state == "running" and b.eta_s:  # learnt from past builds: time is the measure
            bar.setValue(round(1000 * b.elapsed_s / (b.elapsed_s + b.eta_s)))
        elif b.state == "running":
            bar.setValue(round(1000 * (b.step_index - 1) / max(b.steps_total, 1)))
        if b.state == "running":
            eta = f", about {fmt_duration(b.eta_s)} left" if b.eta_s else ""
            step = f"step {b.step_index}/{b.steps_total} {b.step}" if b.step else "starting"
            bar.setFormat(f"{b.engine_id}: {step} · {fmt_duration(b.elapsed_s)}{eta}")
        else:
            bar.setFormat(f"{b.engine_id}: build {b.state} after {fmt_duration(b.elapsed_s)}")
        bar.setToolTip(b.detail)
        self.no_builds.setVisible(not any(x.state == "running" for x in self.builds.values()))

    def selected(self) -> TRTCacheEntry | None:
        row = self.table.currentRow()
        return self.entries[row] if 0 <= row < len(self.entries) else None

    def on_selection_changed(self) -> None:
        e = self.selected()
        self.remove_button.setEnabled(e is not None and not e.in_use_by)
        self.remove_button.setToolTip(
            f"in use by {', '.join(e.in_use_by)}: stop it first" if e and e.in_use_by else ""
        )
        if e is None:
            return
        env = ", ".join(f"{k} {v}" for k, v in sorted(e.environment.items()))
        args = ", ".join(f"{k}={v}" for k, v in sorted(e.arguments.items()))
        self.detail.setText(
            f"<b>{html.escape(e.id)}</b> at <code>{html.escape(e.path)}</code><br>"
            f"Built for: {html.escape(env)}<br>Arguments: {html.escape(args)}"
        )

    # ----------------------------------------------------------------- actions

    def on_remove_clicked(self) -> None:
        e = self.selected()
        if e is None:
            return
        entry_id = e.id

        def done(result: CallResult) -> None:
            if result.ok:
                self.result.ok(f"Removed the engine {entry_id}.")
            else:
                self.result.error(result.error)
            self.reload()

        self.ctx.bridge.call(lambda c: c.trt_cache_remove(entry_id), done)

    def prune(self, *, stale: bool = False, budget_gib: float | None = None) -> None:
        def done(result: CallResult) -> None:
            if result.ok and isinstance(result.value, tuple):
                freed = sum(e.size_bytes for e in result.value if isinstance(e, TRTCacheEntry))
                self.result.ok(f"Removed {len(result.value)} engines ({fmt_bytes(freed)}).")
            else:
                self.result.error(result.error)
            self.reload()

        self.ctx.bridge.call(lambda c: c.trt_cache_prune(stale=stale, budget_gib=budget_gib), done)
