"""The look (desktop/look/theme.py): Fusion with the designed palette, light or dark as the desktop
says (Qt's colour scheme, followed live) unless ``ui.theme`` forces one; re-applying the same
theme is free (a new style sheet would re-polish every widget)."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication

from desktop.app import DesktopApp
from desktop.look.theme import DARK, LIGHT, apply_theme


class _PolishProbe(QObject):
    def __init__(self, seen: list[object]) -> None:
        super().__init__()
        self.seen = seen

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() in (QEvent.Type.StyleChange, QEvent.Type.ApplicationPaletteChange):
            self.seen.append(watched)
        return False


def _window_color() -> str:
    return QApplication.palette().color(QPalette.ColorRole.Window).name()


def _desktop_switches_to(scheme: Qt.ColorScheme) -> None:
    """As the desktop does when the user flips light/dark (the platform plugins here cannot be
    switched, so the signal Qt sends then is sent by hand)."""
    QGuiApplication.styleHints().colorSchemeChanged.emit(scheme)


def test_follows_the_desktops_light_or_dark_setting_live(qtbot, app: DesktopApp) -> None:
    assert QApplication.instance().property("traylmStyle") == "Fusion"
    _desktop_switches_to(Qt.ColorScheme.Dark)
    qtbot.waitUntil(lambda: _window_color() == DARK.window, timeout=5000)
    assert QApplication.palette().color(QPalette.ColorRole.Text) == QColor(DARK.text)
    assert f"background: {DARK.accent}" in QApplication.instance().styleSheet()
    _desktop_switches_to(Qt.ColorScheme.Light)
    qtbot.waitUntil(lambda: _window_color() == LIGHT.window, timeout=5000)


def test_ui_theme_forces_one_and_the_desktop_no_longer_decides(qtbot, app: DesktopApp) -> None:
    app.actions.update_settings({"ui.theme": "dark"})
    qtbot.waitUntil(lambda: _window_color() == DARK.window, timeout=5000)
    _desktop_switches_to(Qt.ColorScheme.Light)
    assert _window_color() == DARK.window  # the switch would have happened in the signal
    app.actions.update_settings({"ui.theme": "system"})
    qtbot.waitUntil(lambda: _window_color() == LIGHT.window, timeout=5000)


def test_applying_the_same_theme_again_keeps_the_style_sheet(qapp: QApplication) -> None:
    apply_theme(qapp, "dark")
    sheet = qapp.styleSheet()
    polished: list[object] = []
    qapp.installEventFilter(probe := _PolishProbe(polished))
    apply_theme(qapp, "dark")
    qapp.removeEventFilter(probe)
    assert qapp.styleSheet() == sheet and polished == []
    apply_theme(qapp, "light")
    assert qapp.styleSheet() != sheet
