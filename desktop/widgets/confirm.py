"""Two-click confirmation for a destructive button: the first click asks, the second (within a
few seconds) acts. Lighter than a dialog for deleting a chat or a profile. While it asks, the
button counts the seconds left, so it never goes back to its label unannounced."""

from __future__ import annotations

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QPushButton

CONFIRM_WINDOW_S = 10
CONFIRM = "Confirm delete"


def second_click(button: QPushButton, label: str = "Delete") -> bool:
    """True on the confirming click. On the first one the button asks "Confirm delete (10 s)",
    counts down, and goes back to ``label`` when the time is up."""
    if not button.text().startswith(CONFIRM):
        _ask(button, label, CONFIRM_WINDOW_S)
        return False
    button.setText(label)
    return True


def _ask(button: QPushButton, label: str, left_s: int) -> None:
    if left_s <= 0:
        button.setText(label)
        return
    button.setText(f"{CONFIRM} ({left_s} s)")
    asked = button.text()

    def tick() -> None:
        if button.text() == asked:  # still asking (not clicked, not relabelled meanwhile)
            _ask(button, label, left_s - 1)

    QTimer.singleShot(1000, button, tick)
