"""The download queue on the Models page: each download's state, bytes, rate, ETA and current
file, live from ``download.state``/``download.progress`` events; Pause, Resume and Cancel; and
the daemon's own words about what a pause keeps (measured for the installed huggingface_hub)."""

from __future__ import annotations

import dataclasses
import html

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
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
from desktop.look.formatting import fmt_bytes, fmt_duration, fmt_rate
from desktop.widgets.result_label import ResultLabel
from desktop.widgets.table import read_only_table
from engines.events import (
    DownloadProgress,
    DownloadState,
    DownloadStateChanged,
    DownloadStatus,
    Event,
)

COLUMNS = ("Model", "State", "Progress", "Bytes", "Rate", "ETA", "Current file", "Files")
ACTIVE = (
    DownloadState.QUEUED,
    DownloadState.DOWNLOADING,
    DownloadState.VERIFYING,
    DownloadState.RETRYING,
)
STATE_COLORS = {
    DownloadState.READY: "#2f9e44",
    DownloadState.FAILED: "#d62828",
    DownloadState.PAUSED: "#e67700",
    DownloadState.RETRYING: "#e67700",
    DownloadState.CANCELLED: "#6c737d",
}


class DownloadsView(QWidget):
    def __init__(self, ctx: PageContext, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.downloads: dict[str, DownloadStatus] = {}
        self.rows: list[str] = []  # download ids, newest first
        layout = QVBoxLayout(self)
        self.table = read_only_table(
            COLUMNS,
            "downloadTable",
            stretch_column=2,
            on_select=self.on_selection_changed,
        )
        layout.addWidget(self.table, 1)
        row = QHBoxLayout()
        self.pause_button = QPushButton("Pause")
        self.pause_button.setObjectName("pauseDownload")
        self.resume_button = QPushButton("Resume")
        self.resume_button.setObjectName("resumeDownload")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setObjectName("cancelDownload")
        self.cancel_button.setToolTip("Stop at once and remove what this download added")
        for button, action in (
            (self.pause_button, "pause"),
            (self.resume_button, "resume"),
            (self.cancel_button, "cancel"),
        ):
            button.clicked.connect(lambda _c=False, a=action: self.act(a))
            row.addWidget(button)
        row.addStretch(1)
        layout.addLayout(row)
        self.note = QLabel("")
        self.note.setObjectName("downloadNote")
        self.note.setWordWrap(True)
        self.note.setTextFormat(Qt.TextFormat.RichText)
        layout.addWidget(self.note)
        self.result = ResultLabel("downloadResult")
        layout.addWidget(self.result)
        ctx.state.event_received.connect(self.on_event_received)
        self.on_selection_changed()

    # ----------------------------------------------------------------- daemon → rows

    def reload(self) -> None:
        self.ctx.bridge.call(lambda c: c.downloads(), self._on_downloads)

    def _on_downloads(self, result: CallResult) -> None:
        if not result.ok or not isinstance(result.value, tuple):
            self.result.error(result.error)
            return
        for status in result.value:
            if isinstance(status, DownloadStatus):
                self._keep_newer(status)
        self._rebuild()

    def _keep_newer(self, status: DownloadStatus) -> None:
        """Answers and events may cross: keep the status the daemon changed last."""
        old = self.downloads.get(status.id)
        if old is None or status.updated_s >= old.updated_s:
            self.downloads[status.id] = status

    def on_event_received(self, event: Event) -> None:
        if isinstance(event, DownloadStateChanged):
            known = event.status.id in self.downloads
            self._keep_newer(event.status)
            if known:
                self._show_row(event.status.id)
            else:
                self._rebuild()
            if event.status.id == self.selected_id():
                self.on_selection_changed()
        elif isinstance(event, DownloadProgress) and event.download_id in self.downloads:
            old = self.downloads[event.download_id]
            self.downloads[event.download_id] = dataclasses.replace(
                old,
                done_bytes=event.done_bytes,
                total_bytes=event.total_bytes,
                rate_bytes_per_s=event.rate_bytes_per_s,
                eta_s=event.eta_s,
                current_file=event.current_file,
                files_done=event.files_done,
                files_total=event.files_total,
            )
            self._show_row(event.download_id)

    def _rebuild(self) -> None:
        selected = self.selected_id()
        self.rows = sorted(self.downloads, key=lambda i: -self.downloads[i].created_s)
        self.table.setRowCount(len(self.rows))
        for r, download_id in enumerate(self.rows):
            bar = QProgressBar()
            bar.setObjectName(f"progress-{download_id}")
            bar.setRange(0, 1000)
            bar.setTextVisible(True)
            self.table.setCellWidget(r, 2, bar)
            self._show_row(download_id)
        if selected in self.rows:
            self.table.selectRow(self.rows.index(selected))
        elif self.rows:
            self.table.selectRow(0)
        self.on_selection_changed()

    def _show_row(self, download_id: str) -> None:
        if download_id not in self.rows:
            return
        r, d = self.rows.index(download_id), self.downloads[download_id]
        state = QTableWidgetItem(str(d.state))
        state.setForeground(QColor(STATE_COLORS.get(d.state, "#1971c2")))
        values = {
            0: d.repo_id,
            3: f"{fmt_bytes(d.done_bytes)} of {fmt_bytes(d.total_bytes)}",
            4: fmt_rate(d.rate_bytes_per_s) if d.state == DownloadState.DOWNLOADING else "–",
            5: fmt_duration(d.eta_s) if d.state == DownloadState.DOWNLOADING else "–",
            6: d.current_file or "–",
            7: f"{d.files_done}/{d.files_total}",
        }
        for c, text in values.items():
            self.table.setItem(r, c, QTableWidgetItem(text))
        self.table.setItem(r, 1, state)
        bar = self.table.cellWidget(r, 2)
        if isinstance(bar, QProgressBar):
            bar.setValue(round(1000 * d.done_bytes / d.total_bytes) if d.total_bytes else 0)
            bar.setFormat(f"{100 * d.done_bytes / d.total_bytes:.1f} %" if d.total_bytes else "–")

    # ----------------------------------------------------------------- selection, actions

    def selected_id(self) -> str:
        row = self.table.currentRow()
        return self.rows[row] if 0 <= row < len(self.rows) else ""

    def on_selection_changed(self) -> None:
        d = self.downloads.get(self.selected_id())
        active = d is not None and d.state in ACTIVE
        self.pause_button.setEnabled(active)
        self.resume_button.setEnabled(
            d is not None and d.state in (DownloadState.PAUSED, DownloadState.FAILED)
        )
        self.cancel_button.setEnabled(
            d is not None and d.state not in (DownloadState.READY, DownloadState.CANCELLED)
        )
        if d is None:
            self.note.setText("No downloads yet: search a model and press Download.")
            return
        self.pause_button.setToolTip(d.resume_note)
        text = f"<b>{html.escape(d.repo_id)}</b> at {html.escape(d.commit_sha[:12] or d.revision)}"
        if d.message:
            text += f": {html.escape(d.message)}"
        if (
            d.state in (*ACTIVE, DownloadState.PAUSED)
            and d.resume_note
            and d.message != d.resume_note
        ):
            text += f"<br><i>About pausing: {html.escape(d.resume_note)}</i>"
        if d.snapshot_path and d.state == DownloadState.READY:
            text += f"<br>In the cache at <code>{html.escape(d.snapshot_path)}</code>"
        self.note.setText(text)

    def act(self, action: str) -> None:
        download_id = self.selected_id()
        if not download_id:
            return

        def done(result: CallResult) -> None:
            if result.ok and isinstance(result.value, DownloadStatus):
                self._keep_newer(result.value)
                self._show_row(download_id)
                self.on_selection_changed()
                self.result.ok(f"{action}: {result.value.repo_id} is {result.value.state}")
            else:
                self.result.error(result.error)

        self.ctx.bridge.call(lambda c: c.download_action(download_id, action), done)
