"""Two-click confirmation for a destructive button: the first click asks, the second (within a
few seconds) acts. Lighter than a dialog for deleting a chat or a profile."""

from __future__ import annotations

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QPushButton

CONFIRM_WINDOW_MS = 3000


def second_click(button: QPushButton, label: str = "Delete") -> bool:
    """True on the confirming click. On the first one the button asks "Confirm delete" and goes
    back to ``label`` after a few seconds."""
    if button.text() != "Confirm delete":
        button.setText("Confirm delete")
        QTimer.singleShot(CONFIRM_WINDOW_MS, button, lambda: button.setText(label))
        return False
    button.setText(label)
    return True
