"""A strip at the top of each window that says when the daemon is not (fully) there, with the
button that fixes it. Hidden while everything is fine."""

from __future__ import annotations

from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QWidget

from desktop.daemon.actions import Actions
from desktop.daemon.messages import ConnectionChanged, LinkState
from desktop.daemon.state import AppState


class ConnectionBanner(QFrame):
    def __init__(self, state: AppState, actions: Actions, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("connectionBanner")
        self.app_actions = actions
        layout = QHBoxLayout(self)
        layout.setContentsMargins(10, 6, 10, 6)
        self.label = QLabel()
        self.label.setObjectName("bannerText")
        self.label.setWordWrap(True)
        layout.addWidget(self.label, 1)
        self.button = QPushButton()
        self.button.setObjectName("bannerFix")
        self.button.clicked.connect(self.on_fix_clicked)
        layout.addWidget(self.button)
        state.connection_changed.connect(self.on_connection_changed)
        self.on_connection_changed(state.connection)

    def on_connection_changed(self, conn: ConnectionChanged) -> None:
        self.setProperty("level", "error" if conn.state in _TROUBLE else "info")
        self.style().unpolish(self)
        self.style().polish(self)
        self.setVisible(conn.state != LinkState.CONNECTED)
        self.label.setText(conn.message)
        fix = {
            LinkState.UNREACHABLE: "Start the daemon",
            LinkState.VERSION_MISMATCH: "Restart the daemon",
        }.get(conn.state, "")
        self.button.setText(fix)
        self.button.setVisible(bool(fix))
        self._state = conn.state

    def on_fix_clicked(self) -> None:
        if self._state == LinkState.UNREACHABLE:
            self.app_actions.start_daemon()
        elif self._state == LinkState.VERSION_MISMATCH:
            self.app_actions.restart_daemon()


_TROUBLE = (LinkState.UNREACHABLE, LinkState.VERSION_MISMATCH)
