"""Model folders on this computer, in the Library tab: Add a folder… (the daemon checks config,
weights and tokenizer, then serves it by name like a download), Start, and Remove from the
library (the files stay). A folder deleted after it was added shows what is missing."""

from __future__ import annotations

from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPushButton,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from desktop.daemon.library import LibraryStart, library_starts
from desktop.daemon.messages import CallResult
from desktop.dashboard.page import PageContext
from desktop.look.formatting import fmt_bytes
from desktop.look.theme import primary
from desktop.widgets.folder import ChooseFolder, ask_for_folder, start_dir
from desktop.widgets.result_label import ResultLabel
from desktop.widgets.table import read_only_table
from engines.events import LocalFolder

COLUMNS = ("Name", "Folder", "Weights", "Family", "State", "Served by")


class FoldersView(QWidget):
    def __init__(self, ctx: PageContext, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.choose_folder: ChooseFolder = ask_for_folder  # tests answer for the user
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        heading = QLabel("Model folders on this computer")
        heading.setProperty("role", "heading")
        layout.addWidget(heading)
        self.table = read_only_table(COLUMNS, "folderTable", on_select=self.on_selection_changed)
        layout.addWidget(self.table, 1)
        row = QHBoxLayout()
        self.add_button = primary(QPushButton("Add a folder…"))
        self.add_button.setObjectName("addFolder")
        self.add_button.setToolTip("A folder with config.json, the weights and the tokenizer")
        self.add_button.clicked.connect(self.on_add_clicked)
        self.start_button = QPushButton("Start")
        self.start_button.setObjectName("startFolder")
        self.start_button.clicked.connect(self.on_start_clicked)
        self.remove_button = QPushButton("Remove from the library")
        self.remove_button.setObjectName("removeFolder")
        self.remove_button.setToolTip("traylm forgets the folder; its files stay where they are")
        self.remove_button.clicked.connect(self.on_remove_clicked)
        for b in (self.add_button, self.start_button, self.remove_button):
            row.addWidget(b)
        row.addStretch(1)
        layout.addLayout(row)
        self.result = ResultLabel("folderResult")
        layout.addWidget(self.result)
        ctx.state.library_changed.connect(self.on_library_changed)
        ctx.state.engines_changed.connect(self.on_library_changed)
        ctx.state.envs_changed.connect(self.on_selection_changed)
        ctx.state.servable_changed.connect(self.on_library_changed)
        self.on_library_changed()

    @property
    def folders(self) -> tuple[LocalFolder, ...]:
        return self.ctx.state.folders

    def on_library_changed(self) -> None:
        selected = self.selected()
        served = {n: e.engine_id for e in self.ctx.state.engines.values() for n in e.served_names}
        self.table.setRowCount(len(self.folders))
        for r, f in enumerate(self.folders):
            state = "ready to serve" if not f.problems else f.problems[0]
            values = (
                f.name,
                f.path,
                fmt_bytes(f.size_bytes),
                f.family or f.architecture,
                state,
                served.get(f.served_name, "–"),
            )
            for c, value in enumerate(values):
                item = QTableWidgetItem(value)
                if c == 4:
                    item.setForeground(QColor("#d62828" if f.problems else "#2f9e44"))
                self.table.setItem(r, c, item)
        names = [f.name for f in self.folders]
        if selected is not None and selected.name in names:
            self.table.selectRow(names.index(selected.name))
        self.on_selection_changed()

    def selected(self) -> LocalFolder | None:
        row = self.table.currentRow()
        return self.folders[row] if 0 <= row < len(self.folders) else None

    def _start_of(self, folder: LocalFolder) -> LibraryStart | None:
        starts = library_starts(self.ctx.state)
        return next((s for s in starts if s.kind == "folder" and s.name == folder.name), None)

    def on_selection_changed(self) -> None:
        f = self.selected()
        start = self._start_of(f) if f is not None else None
        self.start_button.setEnabled(start is not None and not start.blocker)
        self.start_button.setToolTip(start.blocker if start is not None else "")
        self.remove_button.setEnabled(f is not None)

    def add_folder(self, path: str) -> None:
        self.result.neutral(f"Checking {path}…")

        def done(result: CallResult) -> None:
            if result.ok and isinstance(result.value, LocalFolder):
                f = result.value
                self.result.ok(
                    f"Added {f.name}: start it here, from the tray, or with "
                    f"`traylm start {f.name}`."
                )
            else:
                self.result.error(result.error)

        self.ctx.bridge.call(lambda c: c.add_local_folder(path), done)

    def on_add_clicked(self) -> None:
        path = self.choose_folder(self, start_dir(self.ctx.state.folders))
        if path:
            self.add_folder(path)

    def on_start_clicked(self) -> None:
        f = self.selected()
        start = self._start_of(f) if f is not None else None
        if start is not None:
            self.ctx.actions.start_library(start)
            self.result.neutral(f"Starting {start.name}… (Engines shows its progress)")

    def on_remove_clicked(self) -> None:
        f = self.selected()
        if f is None:
            return
        name = f.name

        def done(result: CallResult) -> None:
            if result.ok:
                self.result.ok(f"{name} is no longer in the library; its files stay in {f.path}.")
            else:
                self.result.error(result.error)

        self.ctx.bridge.call(lambda c: c.remove_local_folder(name), done)
