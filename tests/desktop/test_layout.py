"""The dashboard's layout: every page, and each tab of a page, fits the default window (1100×760)
and the usable area of a 1366×768 laptop screen (about 1366×700 once the panel and the title bar
are taken) without clipping. The window's minimum size must stay within both sizes, and no scroll
area inside a page may need a horizontal scroll bar."""

from __future__ import annotations

import re
from collections.abc import Iterator

from PySide6.QtWidgets import (
    QAbstractButton,
    QApplication,
    QGroupBox,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QScrollArea,
    QTabWidget,
    QWidget,
)

from desktop.app import DesktopApp
from desktop.dashboard.pages import PAGES
from desktop.dashboard.window import DashboardWindow

SIZES = ((1100, 760), (1366, 700))


def _settle() -> None:
    """Run the pending layout requests (a scroll area's range follows its content's layout)."""
    for _ in range(3):
        QApplication.processEvents()


def _each_view(dash: DashboardWindow) -> Iterator[str]:
    for spec in PAGES:
        dash.show_page(spec.key)
        page = dash.page(spec.key)
        tab_widgets = page.findChildren(QTabWidget)
        if not tab_widgets:
            yield spec.key
            continue
        tabs = tab_widgets[0]
        for index in range(tabs.count()):
            tabs.setCurrentIndex(index)
            yield f"{spec.key} › {tabs.tabText(index)}"
        tabs.setCurrentIndex(0)


def test_every_page_fits_the_default_window_and_a_laptop_screen(qtbot, sim_app: DesktopApp):
    dash = sim_app.open_dashboard("")
    problems = []
    for width, height in SIZES:
        dash.resize(width, height)
        for view in _each_view(dash):
            _settle()
            hint = dash.minimumSizeHint()
            if hint.width() > width or hint.height() > height:
                problems.append(f"{view}: needs {hint.width()}×{hint.height()} at {width}×{height}")
            for area in dash.current_page().findChildren(QScrollArea):
                if area.isVisible() and area.horizontalScrollBar().maximum() > 0:
                    problems.append(f"{view}: scrolls sideways at {width}×{height}")
    assert problems == []


def test_the_first_size_fits_the_screen(qtbot, sim_app: DesktopApp) -> None:
    dash = sim_app.open_dashboard("")
    area = dash.screen().availableGeometry()
    assert dash.width() == min(1100, area.width())
    assert dash.height() <= area.height()


# a setting's key ("ui.theme = 'dark'"), an HTTP path ("GET /v1/models") or a command line
# ("traylm serve --simulate-gpus N") is for the CLI and the code; what the app shows says it in
# words
KEY_OR_PATH = re.compile(
    r"\b(gateway|ui|hub|energy|gpu|engines|guard|ondemand)\.[a-z_]+\b|"
    r"\b(GET|POST|PATCH|PUT|DELETE) /|/api/|/v1/|"
    r"\btraylm (serve|start|stop|models|engines|remote|config|gpus|power|tune|bench|load)\b|"
    r"(?<![\w-])--[a-z][a-z-]+"
)


def _what_the_user_reads(root: QWidget) -> Iterator[tuple[str, str]]:
    for widget in (root, *root.findChildren(QWidget)):
        name = widget.objectName() or type(widget).__name__
        yield name, widget.toolTip()
        if isinstance(widget, (QLabel, QAbstractButton, QLineEdit)):
            yield name, widget.text()
        if isinstance(widget, QGroupBox):
            yield name, widget.title()
        if isinstance(widget, (QLineEdit, QPlainTextEdit)):
            yield name, widget.placeholderText()


def test_no_setting_keys_or_http_paths_in_what_the_user_reads(qtbot, sim_app: DesktopApp) -> None:
    dash = sim_app.open_dashboard("")
    windows: list[QWidget] = [sim_app.open_chat("")]
    for spec in PAGES:
        dash.show_page(spec.key)
        windows.append(dash.page(spec.key))
    found = {
        f"{name}: {text!r}"
        for window in windows
        for name, text in _what_the_user_reads(window)
        # the profile form edits a profile's TOML fields by name: its tooltips are the daemon's
        # docs of those fields, which may name the setting that gives the default
        if KEY_OR_PATH.search(text) and not name.startswith("field-")
    }
    assert sorted(found) == []
