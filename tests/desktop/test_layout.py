"""The dashboard's layout: every page, and each tab of a page, fits the default window (1100×760)
and the usable area of a 1366×768 laptop screen (about 1366×700 once the panel and the title bar
are taken) without clipping. The window's minimum size must stay within both sizes, and no scroll
area inside a page may need a horizontal scroll bar."""

from __future__ import annotations

from collections.abc import Iterator

from PySide6.QtWidgets import QApplication, QScrollArea, QTabWidget

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
