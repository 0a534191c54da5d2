"""A read-only log pane: monospace, long lines wrapped (at spaces, or anywhere inside a long
path or URL), the oldest lines dropped past a limit. Engine logs, installer output, the setup."""

from __future__ import annotations

from PySide6.QtGui import QFontDatabase, QTextOption
from PySide6.QtWidgets import QPlainTextEdit, QWidget


def log_view(name: str, max_lines: int, parent: QWidget | None = None) -> QPlainTextEdit:
    view = QPlainTextEdit(parent)
    view.setObjectName(name)
    view.setReadOnly(True)
    view.setMaximumBlockCount(max_lines)
    view.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
    view.setWordWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
    view.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
    return view
