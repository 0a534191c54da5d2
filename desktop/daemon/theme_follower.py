"""The app's look kept in line with the ``ui.theme`` setting and, for "system", with the
desktop's light/dark setting as it changes."""

from __future__ import annotations

from PySide6.QtCore import QObject, Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QApplication

from desktop.daemon.state import AppState
from desktop.look.theme import apply_theme


class ThemeFollower(QObject):
    """Keeps the app's look in line with ``ui.theme`` and, for "system", with the desktop's
    light/dark setting as it changes."""

    def __init__(self, app: QApplication, state: AppState, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.app = app
        self.state = state
        self.theme = ""
        self.scheme: Qt.ColorScheme | None = None  # as the desktop last reported it
        state.settings_changed.connect(self.on_settings_changed)
        hints = QGuiApplication.styleHints()
        self._following = hasattr(hints, "colorSchemeChanged")
        if self._following:
            hints.colorSchemeChanged.connect(self.on_scheme_changed)

    def apply(self) -> None:
        settings = self.state.settings
        wanted = settings.ui.theme if settings is not None else "system"
        self.theme = wanted
        apply_theme(self.app, wanted, self.scheme)

    def on_settings_changed(self) -> None:
        settings = self.state.settings
        if settings is not None and settings.ui.theme != self.theme:
            self.apply()

    def stop(self) -> None:
        """Stop following (the app is shutting down; the style hints outlive it)."""
        if self._following:
            self._following = False
            QGuiApplication.styleHints().colorSchemeChanged.disconnect(self.on_scheme_changed)

    def on_scheme_changed(self, scheme: Qt.ColorScheme) -> None:
        self.scheme = scheme
        if self.theme in ("", "system"):
            self.apply()
