"""Installed engine environments (one venv per engine and version) and their doctor checks."""

from __future__ import annotations

import html
from collections.abc import Mapping

from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from desktop.dashboard.page import PageContext
from desktop.messages import CallResult

COLUMNS = ("name", "engine", "version", "device", "complete", "path")


class EnvsView(QWidget):
    def __init__(self, ctx: PageContext, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.envs: tuple[Mapping[str, object], ...] = ()
        layout = QVBoxLayout(self)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setObjectName("envTable")
        self.table.setHorizontalHeaderLabels([c.capitalize() for c in COLUMNS])
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        layout.addWidget(self.table, 1)
        row = QHBoxLayout()
        refresh = QPushButton("Refresh")
        refresh.clicked.connect(self.reload)
        self.doctor_button = QPushButton("Run doctor")
        self.doctor_button.setObjectName("runDoctor")
        self.doctor_button.clicked.connect(self.on_doctor_clicked)
        row.addWidget(refresh)
        row.addWidget(self.doctor_button)
        row.addStretch(1)
        layout.addLayout(row)
        self.report = QLabel(
            "Install engines with <code>traylm engines install vllm</code> "
            "(<code>--cpu</code> without an NVIDIA GPU). Installing from here, with progress, "
            "needs an install API in the daemon."
        )
        self.report.setObjectName("doctorReport")
        self.report.setWordWrap(True)
        layout.addWidget(self.report)

    def reload(self) -> None:
        self.ctx.bridge.call(lambda c: c.envs(), self._on_envs)

    def _on_envs(self, result: CallResult) -> None:
        if not result.ok or not isinstance(result.value, tuple):
            self.report.setText(f"cannot list engine environments: {result.error}")
            return
        self.envs = tuple(e for e in result.value if isinstance(e, Mapping))
        self.table.setRowCount(len(self.envs))
        for r, env in enumerate(self.envs):
            for c, key in enumerate(COLUMNS):
                value = env.get(key, "")
                text = (
                    ("yes" if value else "NO (install did not finish)")
                    if key == "complete"
                    else str(value)
                )
                self.table.setItem(r, c, QTableWidgetItem(text))
        if self.envs and self.table.currentRow() < 0:
            self.table.selectRow(0)
        if not self.envs:
            self.report.setText(
                "No engine installed. Install one with <code>traylm engines install vllm</code>."
            )

    def on_doctor_clicked(self) -> None:
        row = self.table.currentRow()
        if not 0 <= row < len(self.envs):
            return
        name = str(self.envs[row].get("name", ""))
        self.report.setText(f"checking {html.escape(name)}…")
        self.ctx.bridge.call(lambda c: c.env_doctor(name), self._on_doctor)

    def _on_doctor(self, result: CallResult) -> None:
        if not result.ok or not isinstance(result.value, Mapping):
            self.report.setText(f"doctor failed: {html.escape(result.error)}")
            return
        lines = []
        checks = result.value.get("checks", ())
        assert isinstance(checks, tuple)
        for check in checks:
            assert isinstance(check, Mapping)
            ok = bool(check.get("ok"))
            mark = (
                "<span style='color:#2f9e44'>ok</span>"
                if ok
                else "<b style='color:#d62828'>FAIL</b>"
            )
            name, detail = (
                html.escape(str(check.get("name"))),
                html.escape(str(check.get("detail"))),
            )
            line = f"[{mark}] {name}: {detail}"
            if not ok and check.get("fix"):
                line += f"<br>&nbsp;&nbsp;fix: <code>{html.escape(str(check['fix']))}</code>"
            lines.append(line)
        self.report.setText("<br>".join(lines) or "no checks ran")
