"""A label that shows the outcome of an action or a validation: green, amber or red, with the
daemon's own words (which say what to do). ``state`` is "ok", "warning", "error" or "" (neutral),
so tests and style sheets can read it."""

from __future__ import annotations

import html

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QWidget

from desktop.daemon.fixes import in_words

COLORS = {"ok": "#2f9e44", "warning": "#b7791f", "error": "#d62828", "": ""}


class ResultLabel(QLabel):
    def __init__(self, name: str, parent: QWidget | None = None) -> None:
        super().__init__("", parent)
        self.setObjectName(name)
        self.setWordWrap(True)
        self.setTextFormat(Qt.TextFormat.RichText)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.state = ""
        self.message = ""  # the text as given (no markup)

    def say(self, state: str, text: str, *, rich: bool = False) -> None:
        text = text if rich else in_words(text)  # the daemon's commands said as clicks
        self.state, self.message = state, text
        self.setProperty("state", state)
        body = text if rich else html.escape(text)
        color = COLORS.get(state, "")
        self.setText(f"<span style='color:{color}'>{body}</span>" if color else body)

    def ok(self, text: str) -> None:
        self.say("ok", text)

    def warning(self, text: str) -> None:
        self.say("warning", text)

    def error(self, text: str) -> None:
        self.say("error", text)

    def neutral(self, text: str) -> None:
        self.say("", text)
