"""A strip under a window's connection banner for the last error or warning: what happened (in
the daemon's words, wrapped), the button that fixes it here, and the CLI command as a secondary
hint. Closed with ×, replaced by the next notice."""

from __future__ import annotations

import html
from collections.abc import Callable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QPushButton, QVBoxLayout, QWidget

from desktop.daemon.fixes import Fix
from desktop.daemon.notify import Notification
from desktop.look.theme import SPACE_M, SPACE_S, primary, text_label

RunFix = Callable[[Fix], None]


class NoticeBar(QFrame):
    def __init__(self, run_fix: RunFix, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("noticeBar")
        self.run_fix = run_fix
        self.note: Notification | None = None
        layout = QHBoxLayout(self)
        layout.setContentsMargins(SPACE_M, SPACE_S, SPACE_M, SPACE_S)
        text = QVBoxLayout()
        self.label = text_label("noticeText")
        self.hint = text_label("noticeHint", "hint")
        text.addWidget(self.label)
        text.addWidget(self.hint)
        layout.addLayout(text, 1)
        self.fix_button = primary(QPushButton())
        self.fix_button.setObjectName("noticeFix")
        self.fix_button.clicked.connect(self.on_fix_clicked)
        layout.addWidget(self.fix_button, 0, Qt.AlignmentFlag.AlignTop)
        close = QPushButton("×")
        close.setObjectName("noticeClose")
        close.setToolTip("Dismiss")
        close.setFixedWidth(32)
        close.clicked.connect(self.dismiss)
        layout.addWidget(close, 0, Qt.AlignmentFlag.AlignTop)
        self.setVisible(False)

    def show_notice(self, note: Notification) -> None:
        self.note = note
        self.setProperty("level", note.level)
        self.style().unpolish(self)
        self.style().polish(self)
        self.label.setText(f"<b>{html.escape(note.title)}:</b> {html.escape(note.message)}")
        fix = note.fix
        self.fix_button.setVisible(bool(fix and fix.action))
        self.fix_button.setText(fix.label if fix else "")
        self.hint.setVisible(bool(fix and fix.cli))
        self.hint.setText(f"or in a terminal: {fix.cli}" if fix and fix.cli else "")
        self.setVisible(True)

    def dismiss(self) -> None:
        self.note = None
        self.setVisible(False)

    def on_fix_clicked(self) -> None:
        note = self.note
        if note is not None and note.fix is not None and note.fix.action:
            self.dismiss()
            self.run_fix(note.fix)
