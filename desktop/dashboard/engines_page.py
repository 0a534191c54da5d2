"""The Engines page: live throughput, the engines with start/stop/restart, the profile editor,
the logs with diagnoses, and the engine environments. The Start picker offers the profiles and
the registered model folders; one the daemon says cannot start here is greyed with its reason."""

from __future__ import annotations

import html

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QStandardItemModel
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from desktop.daemon.batches import batch_text
from desktop.daemon.boxes import BoxReplica
from desktop.daemon.fixes import ENGINE_LOG, PROFILES, Fix
from desktop.daemon.state import LIVE_STATES
from desktop.dashboard.envs_view import EnvsView
from desktop.dashboard.logs_view import LogsView
from desktop.dashboard.page import Page, PageContext
from desktop.dashboard.profile_editor import ProfileEditor
from desktop.dashboard.trt_view import TRTView
from desktop.look.theme import primary
from desktop.widgets.chart import LiveChart
from desktop.widgets.table import read_only_table
from engines.events import EngineState, GatewayThroughput

COLUMNS = ("Engine", "State", "Serves", "Port", "PID", "Restarts", "Detail")
STATE_COLORS = {
    EngineState.READY: "#2f9e44",
    EngineState.STARTING: "#e67700",
    EngineState.STOPPING: "#e67700",
    EngineState.FAILED: "#d62828",
    EngineState.STOPPED: "#6c737d",
}
BOX_STATES = {"ready": EngineState.READY, "away": EngineState.FAILED}
"""A paired box's replica takes its colour from the engine state it is like."""


class EnginesPage(Page):
    def __init__(self, ctx: PageContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        self.tabs = QTabWidget()
        self.tabs.setObjectName("engineTabs")
        self.tabs.addTab(self._overview(), "Engines")
        self.profiles = ProfileEditor(ctx)
        self.tabs.addTab(self.profiles, "Profiles")
        self.logs = LogsView(ctx, self.on_suggestion)
        self.tabs.addTab(self.logs, "Logs")
        self.envs = EnvsView(ctx)
        self.tabs.addTab(self.envs, "Environments")
        self.trt = TRTView(ctx)
        self.tabs.addTab(self.trt, "TensorRT-LLM")
        self.tabs.currentChanged.connect(self.on_tab_changed)
        layout.addWidget(self.tabs)
        ctx.state.engines_changed.connect(self.on_engines_changed)
        ctx.state.profiles_changed.connect(self.on_profiles_changed)
        ctx.state.library_changed.connect(self.on_profiles_changed)
        ctx.state.servable_changed.connect(self.on_profiles_changed)
        ctx.state.throughput_sampled.connect(self.on_throughput_sampled)
        ctx.state.connection_changed.connect(self.on_selection_changed)
        ctx.state.connection_changed.connect(self.on_status_changed)
        ctx.state.status_changed.connect(self.on_status_changed)
        ctx.state.status_changed.connect(self.on_engines_changed)  # the paired boxes' replicas
        self.on_profiles_changed()
        self.on_status_changed()
        self.on_engines_changed()

    def _overview(self) -> QWidget:
        page = QWidget()
        layout = QVBoxLayout(page)
        charts = QHBoxLayout()
        self.tokens_chart = LiveChart("Generated tokens/s (gateway)", "tok/s", minimum_max=10)
        self.tokens_chart.setObjectName("tokensChart")
        self.tokens_chart.add_series("all models", "#1971c2")
        self.inflight_chart = LiveChart("Requests in flight", "", minimum_max=4)
        self.inflight_chart.setObjectName("inflightChart")
        self.inflight_chart.add_series("requests", "#2f9e44")
        charts.addWidget(self.tokens_chart, 2)
        charts.addWidget(self.inflight_chart, 1)
        layout.addLayout(charts)
        self.table = read_only_table(
            COLUMNS,
            "engineTable",
            on_select=self.on_selection_changed,
        )
        layout.addWidget(self.table, 1)
        layout.addLayout(self._controls_row())
        self.detail = QLabel("")
        self.detail.setObjectName("engineDetail")
        self.detail.setWordWrap(True)
        layout.addWidget(self.detail)
        self.remote = QLabel("")
        self.remote.setObjectName("remoteStatus")
        self.remote.setWordWrap(True)
        layout.addWidget(self.remote)
        self.batches = QLabel("")
        self.batches.setObjectName("batchStatus")
        layout.addWidget(self.batches)
        return page

    def _controls_row(self) -> QHBoxLayout:
        row = QHBoxLayout()
        row.addWidget(QLabel("Profile"))
        self.profile_picker = QComboBox()
        self.profile_picker.setObjectName("startProfilePicker")
        self.profile_picker.setMinimumWidth(220)
        self.profile_picker.currentIndexChanged.connect(self.on_selection_changed)
        row.addWidget(self.profile_picker)
        self.start_button = primary(QPushButton("Start"))
        self.start_button.setObjectName("startEngine")
        self.start_button.clicked.connect(self.on_start_clicked)
        row.addWidget(self.start_button)
        row.addSpacing(24)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setObjectName("stopEngine")
        self.stop_button.clicked.connect(self.on_stop_clicked)
        self.restart_button = QPushButton("Restart")
        self.restart_button.setObjectName("restartEngine")
        self.restart_button.clicked.connect(self.on_restart_clicked)
        self.chat_button = QPushButton("Open chat")
        self.chat_button.setObjectName("chatWithEngine")
        self.chat_button.clicked.connect(self.on_chat_clicked)
        for b in (self.stop_button, self.restart_button, self.chat_button):
            row.addWidget(b)
        row.addStretch(1)
        return row

    # ----------------------------------------------------------------- state → widgets

    def on_profiles_changed(self) -> None:
        """The profiles, then the registered model folders; each the daemon says cannot start
        here is greyed, its reason beside it and as its tooltip."""
        state = self.ctx.state
        current = self.picked() or state.current_profile()
        picker = self.profile_picker
        picker.blockSignals(True)
        picker.clear()
        names = [p.name for p in state.profiles]
        names += [f.name for f in state.folders if f.name not in names and not f.problems]
        model = picker.model()
        assert isinstance(model, QStandardItemModel)  # QComboBox's own
        for name in names:
            why = state.why_blocked(name)
            picker.addItem(f"{name}  ({why})" if why else name, name)
            item = model.item(picker.count() - 1)
            item.setEnabled(not why)
            item.setToolTip(why)
        index = picker.findData(current)
        if index < 0 or state.why_blocked(current):
            index = next((i for i in range(picker.count()) if model.item(i).isEnabled()), index)
        picker.setCurrentIndex(max(index, 0) if picker.count() else -1)
        picker.blockSignals(False)
        self.on_selection_changed()

    def picked(self) -> str:
        """The profile or model folder the Start button would start."""
        name = self.profile_picker.currentData(Qt.ItemDataRole.UserRole)
        return name if isinstance(name, str) else ""

    def on_engines_changed(self) -> None:
        """This box's engines, then the paired boxes' replicas (read-only rows: their engines
        are that box's)."""
        selected = self.selected_engine()
        engines = sorted(self.ctx.state.engines.values(), key=lambda e: e.engine_id)
        boxes = self.ctx.state.box_replicas
        self.table.setRowCount(len(engines) + len(boxes))
        for r, e in enumerate(engines):
            values = (
                e.engine_id,
                str(e.state),
                ", ".join(e.served_names)
                + (f" ({text})" if (text := self.ctx.state.replica_text(e)) else ""),
                str(e.port or "–"),
                str(e.pid or "–"),
                str(e.restarts),
                e.stage or e.detail,
            )
            for c, value in enumerate(values):
                item = QTableWidgetItem(value)
                if c == 1:
                    item.setForeground(QColor(STATE_COLORS.get(e.state, "#6c737d")))
                self.table.setItem(r, c, item)
            if e.engine_id == selected:
                self.table.selectRow(r)
        for r, b in enumerate(boxes, start=len(engines)):
            state = "away" if b.away else "ready"
            values = (f"{b.name}@{b.box}", state, f"{b.name} ({b.label})", "–", "–", "–", b.detail)
            for c, value in enumerate(values):
                item = QTableWidgetItem(value)
                if c == 1:
                    item.setForeground(QColor(STATE_COLORS[BOX_STATES[state]]))
                self.table.setItem(r, c, item)
            if values[0] == selected:
                self.table.selectRow(r)
        if self.table.currentRow() < 0 and self.table.rowCount():
            self.table.selectRow(0)
        self.on_selection_changed()

    def _is(self, replica: BoxReplica) -> bool:
        return self.selected_engine() == f"{replica.name}@{replica.box}"

    def selected_engine(self) -> str:
        row = self.table.currentRow()
        item = self.table.item(row, 0) if row >= 0 else None
        return item.text() if item is not None else ""

    def on_selection_changed(self, *_: object) -> None:
        engine = self.ctx.state.engines.get(self.selected_engine())
        live = engine is not None and engine.state in LIVE_STATES
        self.stop_button.setEnabled(live)
        self.restart_button.setEnabled(engine is not None)
        self.chat_button.setEnabled(engine is not None and engine.state == EngineState.READY)
        blocked = self.ctx.state.why_blocked(self.picked())
        self.start_button.setEnabled(
            self.ctx.state.connected and bool(self.picked()) and not blocked
        )
        self.start_button.setToolTip(blocked)
        if not self.ctx.state.connected:
            self.detail.setText(
                "Not connected to the daemon: engines are unknown until it is back."
            )
            return
        box = next((b for b in self.ctx.state.box_replicas if self._is(b)), None)
        if box is not None:
            self.detail.setText(
                f"<b>{html.escape(box.name)}</b> is served by the paired box "
                f"<b>{html.escape(box.box)}</b> from its own engines (start and stop them "
                f"there): {html.escape(box.detail)}"
            )
            return
        if engine is None:
            self.detail.setText("No engine yet: pick a profile and press Start.")
            return
        text = f"<b>{html.escape(engine.engine_id)}</b> ({engine.engine} {engine.version}, "
        text += f"{engine.device or '?'}): {html.escape(engine.detail)}"
        if engine.diagnosis is not None:
            d = engine.diagnosis
            text += (
                f"<br><span style='color:#d62828'><b>{html.escape(d.summary)}</b></span> "
                f"{html.escape(d.advice)}"
            )
        self.detail.setText(text)

    def on_status_changed(self, *_: object) -> None:
        connected = self.ctx.state.connected
        self.batches.setText(batch_text(self.ctx.state.status) if connected else "")
        remote = self.ctx.state.remote
        if remote is None or not self.ctx.state.connected:
            self.remote.setText("")
        elif not remote.enabled:
            self.remote.setText(
                "Remote fallback: off. With remote.enabled, requests for a model no local engine "
                "serves go to an OpenAI-compatible API (its key: Settings ▸ Remote fallback)."
            )
        else:
            aliases = ", ".join(remote.aliases) or "every model"
            state = "ready" if remote.ready else f"NOT READY: {remote.detail}"
            self.remote.setText(
                f"<b>Remote fallback: ON</b> → {html.escape(remote.base_url)} for "
                f"{html.escape(aliases)} (key from {remote.key_source}; {html.escape(state)}); "
                f"{remote.routed_requests} requests sent there so far."
            )

    def on_throughput_sampled(self, sample: GatewayThroughput) -> None:
        self.tokens_chart.append("all models", sample.tokens_per_s)
        self.inflight_chart.append("requests", float(sample.in_flight))

    # ----------------------------------------------------------------- actions

    def on_start_clicked(self) -> None:
        name = self.picked()
        if name:
            self.ctx.actions.start_profile(name)

    def on_stop_clicked(self) -> None:
        engine_id = self.selected_engine()
        if engine_id:
            self.ctx.actions.stop_engine(engine_id)

    def on_restart_clicked(self) -> None:
        engine_id = self.selected_engine()
        if engine_id:
            self.ctx.actions.restart_engine(engine_id)

    def on_chat_clicked(self) -> None:
        engine = self.ctx.state.engines.get(self.selected_engine())
        if engine is not None and engine.served_names:
            self.ctx.open_chat(engine.served_names[0])

    def on_suggestion(self, profile: str, suggested: object) -> None:
        self.tabs.setCurrentWidget(self.profiles)
        self.profiles.apply_suggestion(profile, suggested)  # type: ignore[arg-type]

    def show_fix(self, fix: Fix) -> None:
        if fix.action == ENGINE_LOG:
            self.tabs.setCurrentWidget(self.logs)
            self.logs.picker.setCurrentText(fix.target)
        elif fix.action == PROFILES:
            self.tabs.setCurrentWidget(self.profiles)
            if fix.target:
                self.profiles.load_profile(fix.target)

    def on_tab_changed(self, index: int) -> None:
        if self.tabs.widget(index) is self.envs:
            self.envs.reload()
        elif self.tabs.widget(index) is self.trt:
            self.trt.reload()

    def page_shown(self) -> None:
        self.on_tab_changed(self.tabs.currentIndex())
