"""The local library on the Models page: every model revision in the shared Hugging Face cache,
whether its files match the Hub's hashes, who serves it, Verify and Delete (refused by the daemon,
and greyed out here, while an engine serves it), and the per-model consent to run its code."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QCheckBox,
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QPushButton,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from desktop.daemon.messages import CallResult
from desktop.dashboard.page import PageContext
from desktop.look.formatting import fmt_bytes
from desktop.widgets.result_label import ResultLabel
from desktop.widgets.table import read_only_table
from engines.events import Event, LibraryChanged, LocalModel

COLUMNS = (
    "Model",
    "Revision",
    "Size",
    "Files",
    "Checked",
    "Served by",
    "Profiles",
    "Engines",
    "Own code",
)
VERIFIED_COLORS = {"verified": "#2f9e44", "corrupt": "#d62828", "incomplete": "#e67700"}
Confirm = Callable[[str], bool]


def ask(text: str) -> bool:
    answer = QMessageBox.question(None, "traylm", text)
    return answer == QMessageBox.StandardButton.Yes


class LibraryView(QWidget):
    def __init__(
        self,
        ctx: PageContext,
        on_trust: Callable[[str, bool], None],
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.on_trust = on_trust
        self.confirm: Confirm = ask  # tests answer for the user
        self.models: tuple[LocalModel, ...] = ()
        layout = QVBoxLayout(self)
        self.table = read_only_table(
            COLUMNS,
            "libraryTable",
            on_select=self.on_selection_changed,
        )
        layout.addWidget(self.table, 1)
        row = QHBoxLayout()
        refresh = QPushButton("Refresh")
        refresh.clicked.connect(self.reload)
        self.verify_button = QPushButton("Verify against the Hub")
        self.verify_button.setObjectName("verifyModel")
        self.verify_button.clicked.connect(self.on_verify_clicked)
        self.delete_button = QPushButton("Delete…")
        self.delete_button.setObjectName("deleteModel")
        self.delete_button.clicked.connect(self.on_delete_clicked)
        self.trust = QCheckBox("Allow its own Python code (trust_remote_code)")
        self.trust.setObjectName("trustLibraryModel")
        self.trust.toggled.connect(self.on_trust_toggled)
        for w in (refresh, self.verify_button, self.delete_button, self.trust):
            row.addWidget(w)
        row.addStretch(1)
        layout.addLayout(row)
        self.summary = QLabel("")
        self.summary.setObjectName("librarySummary")
        layout.addWidget(self.summary)
        self.result = ResultLabel("libraryResult")
        layout.addWidget(self.result)
        self._live: frozenset[tuple[str, str]] = frozenset()
        ctx.state.event_received.connect(self.on_event_received)
        ctx.state.engines_changed.connect(self.on_engines_changed)
        self.on_selection_changed()

    def reload(self) -> None:
        self.ctx.bridge.call(lambda c: c.local_models(), self._on_models)

    def trusted(self, repo_id: str) -> bool:
        return any(m.trust_remote_code for m in self.models if m.repo_id == repo_id)

    def on_engines_changed(self) -> None:
        """ "Served by" follows the engines: read the library again when one changes state."""
        live = frozenset((e.engine_id, str(e.state)) for e in self.ctx.state.engines.values())
        if live != self._live:
            self._live = live
            if self.isVisible():
                self.reload()

    def on_event_received(self, event: Event) -> None:
        if isinstance(event, LibraryChanged):
            self.reload()

    def _on_models(self, result: CallResult) -> None:
        if not result.ok or not isinstance(result.value, tuple):
            self.result.error(result.error)
            return
        selected = self.selected()
        self.models = tuple(m for m in result.value if isinstance(m, LocalModel))
        self.table.setRowCount(len(self.models))
        for r, m in enumerate(self.models):
            values = (
                m.repo_id,
                m.commit_sha[:12] + (f" ({', '.join(m.refs)})" if m.refs else ""),
                fmt_bytes(m.size_bytes),
                str(m.files),
                m.verified + (f": {m.problems[0]}" if m.problems else ""),
                ", ".join(m.served_by) or "–",
                ", ".join(m.profiles) or "–",
                ", ".join(m.engines) or "none",
                ("allowed" if m.trust_remote_code else "not allowed")
                if m.needs_remote_code
                else "–",
            )
            for c, value in enumerate(values):
                item = QTableWidgetItem(value)
                if c == 4:
                    item.setForeground(QColor(VERIFIED_COLORS.get(m.verified, "#6c737d")))
                self.table.setItem(r, c, item)
        total = sum(m.size_bytes for m in self.models)
        self.summary.setText(
            f"{len(self.models)} model revision{'' if len(self.models) == 1 else 's'}, "
            f"{fmt_bytes(total)} in the shared Hugging Face "
            "cache (other tools that use it see the same files)."
        )
        keys = [(m.repo_id, m.commit_sha) for m in self.models]
        if selected is not None and (selected.repo_id, selected.commit_sha) in keys:
            self.table.selectRow(keys.index((selected.repo_id, selected.commit_sha)))
        elif self.models:
            self.table.selectRow(0)
        self.on_selection_changed()

    def selected(self) -> LocalModel | None:
        row = self.table.currentRow()
        return self.models[row] if 0 <= row < len(self.models) else None

    def on_selection_changed(self) -> None:
        m = self.selected()
        self.verify_button.setEnabled(m is not None)
        served = bool(m and m.served_by)
        self.delete_button.setEnabled(m is not None and not served)
        self.delete_button.setToolTip(
            f"served by {', '.join(m.served_by)}: stop that engine first" if m and served else ""
        )
        self.trust.setVisible(bool(m and m.needs_remote_code))
        self.trust.blockSignals(True)
        self.trust.setChecked(bool(m and m.trust_remote_code))
        self.trust.blockSignals(False)

    def on_verify_clicked(self) -> None:
        m = self.selected()
        if m is None:
            return
        repo, sha = m.repo_id, m.commit_sha
        self.result.neutral(f"Hashing every file of {repo} against the Hub…")

        def done(result: CallResult) -> None:
            if not result.ok or not isinstance(result.value, tuple):
                self.result.error(result.error)
                return
            states = {x.verified for x in result.value if isinstance(x, LocalModel)}
            if states == {"verified"}:
                self.result.ok(f"{repo}: every file matches the Hub's hash.")
            else:
                self.result.error(f"{repo}: {', '.join(sorted(states))}; download it again.")
            self.reload()

        self.ctx.bridge.call(lambda c: c.verify_model(repo, sha), done)

    def on_delete_clicked(self) -> None:
        m = self.selected()
        if m is None:
            return
        question = (
            f"Delete {m.repo_id} ({fmt_bytes(m.size_bytes)}) from the Hugging Face cache? Other "
            "programs that use this cache lose it too."
        )
        if not self.confirm(question):
            return
        repo, sha = m.repo_id, m.commit_sha

        def done(result: CallResult) -> None:
            if result.ok:
                self.result.ok(f"Deleted {repo}.")
            else:
                self.result.error(result.error)
            self.reload()

        self.ctx.bridge.call(lambda c: c.delete_model(repo, sha), done)

    def on_trust_toggled(self, on: bool) -> None:
        m = self.selected()
        if m is not None:
            self.on_trust(m.repo_id, on)
