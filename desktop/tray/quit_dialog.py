"""Quit: stop the engines (and the daemon), or leave the daemon serving for other apps."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtWidgets import QCheckBox, QMessageBox, QWidget

from desktop.daemon.state import AppState

Choice = Callable[[str, bool], None]  # (action "stop"|"leave"|"cancel", remember)


class QuitDialog(QMessageBox):
    def __init__(self, state: AppState, on_chosen: Choice, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("quitDialog")
        self.setWindowTitle("Quit traylm")
        self.setIcon(QMessageBox.Icon.Question)
        live = state.live_engines()
        endpoint = state.endpoint_url or "the endpoint"
        if live:
            names = ", ".join(e.engine_id for e in live)
            running = f"{len(live)} engine{'s' if len(live) > 1 else ''} running ({names})."
        else:
            running = "No engine is running."
        self.setText("Quit the traylm tray app?")
        self.setInformativeText(
            f"{running}\n\nStop the engines and the daemon, or leave the daemon serving "
            f"{endpoint} for other apps?"
        )
        self.stop_button = self.addButton(
            "Stop engines and quit", QMessageBox.ButtonRole.AcceptRole
        )
        self.leave_button = self.addButton(
            "Leave serving and quit", QMessageBox.ButtonRole.AcceptRole
        )
        self.cancel_button = self.addButton(QMessageBox.StandardButton.Cancel)
        self.setDefaultButton(self.leave_button)
        self.remember = QCheckBox("Remember my choice (Settings → Quit action changes it)")
        self.setCheckBox(self.remember)
        self._on_chosen = on_chosen
        self.buttonClicked.connect(self.on_button_clicked)

    def on_button_clicked(self, button: object) -> None:
        if button is self.stop_button:
            self._on_chosen("stop", self.remember.isChecked())
        elif button is self.leave_button:
            self._on_chosen("leave", self.remember.isChecked())
        else:
            self._on_chosen("cancel", False)
