"""An engine's live log, with the lines the daemon diagnosed highlighted and, beside it, what
each diagnosis means and what to do (with a button that puts a suggested value in the profile
editor)."""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QSyntaxHighlighter, QTextCharFormat, QTextDocument
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from desktop.daemon.messages import CallResult
from desktop.dashboard.page import PageContext
from desktop.widgets.log_view import log_view
from engines.events import Diagnosis, EngineDiagnosed, EngineLogLine, Event

LOG_LINES = 5000
SEVERITY_COLORS = {"error": "#f8d7da", "warning": "#fff3cd", "info": "#d1ecf1"}
Suggest = Callable[[str, Mapping[str, str]], None]


class DiagnosisHighlighter(QSyntaxHighlighter):
    def __init__(self, document: QTextDocument) -> None:
        super().__init__(document)
        self.lines: dict[str, str] = {}  # exact log line → severity

    def highlightBlock(self, text: str) -> None:
        severity = self.lines.get(text.strip())
        if severity is None:
            return
        fmt = QTextCharFormat()
        fmt.setBackground(QColor(SEVERITY_COLORS.get(severity, SEVERITY_COLORS["error"])))
        fmt.setForeground(QColor("#1a1a1a"))
        self.setFormat(0, len(text), fmt)


class LogsView(QWidget):
    def __init__(self, ctx: PageContext, suggest: Suggest, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.suggest = suggest
        self.engine_id = ""
        self.diagnoses: list[Diagnosis] = []
        layout = QVBoxLayout(self)
        top = QHBoxLayout()
        top.addWidget(QLabel("Engine"))
        self.picker = QComboBox()
        self.picker.setObjectName("logEngine")
        self.picker.setMinimumWidth(200)
        self.picker.currentTextChanged.connect(self.on_engine_picked)
        top.addWidget(self.picker)
        top.addStretch(1)
        layout.addLayout(top)
        splitter = QSplitter(Qt.Orientation.Horizontal)
        self.log = log_view("engineLog", LOG_LINES)
        self.highlighter = DiagnosisHighlighter(self.log.document())
        splitter.addWidget(self.log)
        splitter.addWidget(self._side_panel())
        splitter.setSizes([700, 300])
        layout.addWidget(splitter, 1)
        ctx.state.engines_changed.connect(self.on_engines_changed)
        ctx.state.event_received.connect(self.on_event_received)
        self.on_engines_changed()

    def _side_panel(self) -> QWidget:
        side = QWidget()
        side_layout = QVBoxLayout(side)
        side_layout.setContentsMargins(0, 0, 0, 0)
        side_layout.addWidget(QLabel("<b>Diagnoses</b>"))
        self.diagnosis_list = QListWidget()
        self.diagnosis_list.setObjectName("diagnoses")
        self.diagnosis_list.setWordWrap(True)
        self.diagnosis_list.currentRowChanged.connect(self.on_diagnosis_selected)
        side_layout.addWidget(self.diagnosis_list, 1)
        self.advice = QLabel("Diagnosed log lines are highlighted; select one to see advice.")
        self.advice.setObjectName("diagnosisAdvice")
        self.advice.setWordWrap(True)
        side_layout.addWidget(self.advice)
        self.apply_button = QPushButton("Apply suggestion to the profile")
        self.apply_button.setObjectName("applySuggestion")
        self.apply_button.setVisible(False)
        self.apply_button.clicked.connect(self.on_apply_clicked)
        side_layout.addWidget(self.apply_button)
        return side

    def on_engines_changed(self) -> None:
        names = sorted(self.ctx.state.engines)
        current = self.picker.currentText()
        if names == [self.picker.itemText(i) for i in range(self.picker.count())]:
            return
        self.picker.blockSignals(True)
        self.picker.clear()
        self.picker.addItems(names)
        self.picker.blockSignals(False)
        if current in names:
            self.picker.setCurrentText(current)
        elif names:
            self.picker.setCurrentIndex(0)
            self.on_engine_picked(names[0])

    def on_engine_picked(self, engine_id: str) -> None:
        if not engine_id or engine_id == self.engine_id:
            return
        self.engine_id = engine_id
        self.log.clear()
        self.diagnoses = []
        self.diagnosis_list.clear()
        self.highlighter.lines.clear()
        status = self.ctx.state.engines.get(engine_id)
        if status is not None and status.diagnosis is not None:
            self._add_diagnosis(status.diagnosis)
        self.ctx.bridge.call(lambda c: c.logs(engine_id, LOG_LINES), self._on_logs)

    def _on_logs(self, result: CallResult) -> None:
        if result.ok and isinstance(result.value, tuple):
            self.log.setPlainText("\n".join(str(line) for line in result.value))
            self.log.verticalScrollBar().setValue(self.log.verticalScrollBar().maximum())
        elif not result.ok:
            self.log.setPlainText(f"(cannot read the log: {result.error})")

    def on_event_received(self, event: Event) -> None:
        if isinstance(event, EngineLogLine) and event.engine_id == self.engine_id:
            self.log.appendPlainText(event.line)
        elif isinstance(event, EngineDiagnosed) and event.engine_id == self.engine_id:
            self._add_diagnosis(event.diagnosis)

    def _add_diagnosis(self, d: Diagnosis) -> None:
        if any(x.code == d.code and x.line == d.line for x in self.diagnoses):
            return
        self.diagnoses.append(d)
        item = QListWidgetItem(f"[{d.severity}] {d.summary}")
        item.setToolTip(d.line)
        item.setBackground(QColor(SEVERITY_COLORS.get(d.severity, SEVERITY_COLORS["error"])))
        item.setForeground(QColor("#1a1a1a"))
        self.diagnosis_list.addItem(item)
        if d.line:
            self.highlighter.lines[d.line.strip()] = d.severity
            self.highlighter.rehighlight()
        if self.diagnosis_list.currentRow() < 0:
            self.diagnosis_list.setCurrentRow(0)

    def on_diagnosis_selected(self, row: int) -> None:
        if not 0 <= row < len(self.diagnoses):
            return
        d = self.diagnoses[row]
        suggestion = html.escape(", ".join(f"{k} = {v}" for k, v in d.suggested.items()))
        self.advice.setText(
            f"<b>{html.escape(d.summary)}</b><br>{html.escape(d.advice)}"
            + (f"<br><i>Suggested:</i> {suggestion}" if suggestion else "")
        )
        self.apply_button.setVisible(bool(d.suggested))

    def on_apply_clicked(self) -> None:
        row = self.diagnosis_list.currentRow()
        if 0 <= row < len(self.diagnoses) and self.engine_id:
            status = self.ctx.state.engines.get(self.engine_id)
            profile = status.profile if status is not None else self.engine_id
            self.suggest(profile, self.diagnoses[row].suggested)
