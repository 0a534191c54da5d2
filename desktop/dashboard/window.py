"""The dashboard: one window, a page list on the left, the page on the right.

Pages are built when first shown. Without a system tray this window is the app's main window:
the tray menu sits in its menu bar and closing it quits.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt
from PySide6.QtGui import QCloseEvent, QFont, QHideEvent, QShowEvent
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QMenu,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from desktop.daemon.actions import Actions
from desktop.daemon.bridge import Bridge
from desktop.daemon.fixes import Fix
from desktop.daemon.notify import Notification, Notifier
from desktop.daemon.state import AppState
from desktop.dashboard.page import Page, PageContext
from desktop.dashboard.pages import PAGES, PageSpec
from desktop.dashboard.unavailable import UnavailablePage
from desktop.widgets.banner import ConnectionBanner
from desktop.widgets.notice_bar import NoticeBar
from desktop.widgets.sizing import resize_within_screen

NAV_WIDTH = 184
KEY_ROLE = Qt.ItemDataRole.UserRole


class DashboardWindow(QMainWindow):
    def __init__(
        self,
        bridge: Bridge,
        state: AppState,
        actions: Actions,
        notifier: Notifier,
        *,
        open_chat: Callable[[str], object],
        open_setup: Callable[[], object] = lambda: None,
        run_fix: Callable[[Fix], None] = lambda _fix: None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setObjectName("dashboardWindow")
        self.setWindowTitle("traylm — Dashboard")
        resize_within_screen(self, 1100, 760)
        self.bridge = bridge
        self.ctx = PageContext(
            bridge, state, actions, notifier, open_chat, self.show_page, open_setup, run_fix
        )
        self.pages: dict[str, Page] = {}
        self._quit: Callable[[], None] | None = None
        self._closing = False
        central = QWidget()
        outer = QVBoxLayout(central)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.setSpacing(0)
        self.fallback_note = QLabel(
            "No system tray on this desktop: traylm runs in this window (its menu is in the menu "
            "bar). Closing the window quits."
        )
        self.fallback_note.setObjectName("fallbackNote")
        self.fallback_note.setWordWrap(True)
        self.fallback_note.setVisible(False)
        outer.addWidget(self.fallback_note)
        outer.addWidget(ConnectionBanner(state, actions))
        self.notice = NoticeBar(run_fix)
        outer.addWidget(self.notice)
        outer.addLayout(self._body(), 1)
        self.setCentralWidget(central)
        notifier.notified.connect(self.on_notified)
        first = next(i for i, spec in enumerate(PAGES) if spec.available)
        self.nav.setCurrentRow(first)
        # until someone picks a page, the window lands on one that has something to show
        self._landing = True
        self.nav.itemClicked.connect(self._stop_landing)
        state.gpu.overview_changed.connect(self.on_gpu_overview_changed)
        self.on_gpu_overview_changed()

    def _stop_landing(self, *_: object) -> None:
        self._landing = False

    def on_gpu_overview_changed(self) -> None:
        """Without any GPU the GPUs page has nothing to show: Engines is the landing page."""
        gpu = self.ctx.state.gpu
        if self._landing and gpu.overview is not None and not gpu.available:
            if self.current_key() == "gpus":
                self.show_page("engines")
            self._landing = False

    def _body(self) -> QHBoxLayout:
        """The page list on the left, the pages on the right."""
        body = QHBoxLayout()
        body.setContentsMargins(0, 0, 0, 0)
        self.nav = QListWidget()
        self.nav.setObjectName("pageNav")
        self.nav.setFixedWidth(NAV_WIDTH)
        self.nav.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.stack = QStackedWidget()
        body.addWidget(self.nav)
        body.addWidget(self.stack, 1)
        for spec in PAGES:
            self.nav.addItem(self._nav_item(spec))
        self.nav.currentRowChanged.connect(self.on_nav_changed)
        return body

    def _nav_item(self, spec: PageSpec) -> QListWidgetItem:
        item = QListWidgetItem(spec.title if spec.available else f"{spec.title}  (not yet)")
        item.setData(KEY_ROLE, spec.key)
        item.setToolTip(spec.purpose)
        if not spec.available:
            font = QFont(item.font())
            font.setItalic(True)
            item.setFont(font)
            item.setForeground(self.palette().placeholderText())
            item.setToolTip(f"Not available in this daemon yet: waits for {spec.waits_for}")
        return item

    # ----------------------------------------------------------------- pages

    def current_key(self) -> str:
        item = self.nav.currentItem()
        return str(item.data(KEY_ROLE)) if item is not None else ""

    def current_page(self) -> Page | None:
        return self.pages.get(self.current_key())

    def show_page(self, key: str) -> None:
        self._landing = False
        for row, spec in enumerate(PAGES):
            if spec.key == key:
                self.nav.setCurrentRow(row)
                return

    def page(self, key: str) -> Page:
        """The page for ``key``, built on first use."""
        page = self.pages.get(key)
        if page is None:
            spec = next(s for s in PAGES if s.key == key)
            if spec.build is not None:
                page = spec.build(self.ctx)
            else:
                page = UnavailablePage(
                    self.ctx, title=spec.title, purpose=spec.purpose, waits_for=spec.waits_for
                )
            page.setObjectName(f"page-{key}")
            self.pages[key] = page
            self.stack.addWidget(page)
        return page

    def on_nav_changed(self, row: int) -> None:
        if row < 0:
            return
        previous = self.stack.currentWidget()
        if isinstance(previous, Page) and self.isVisible():
            previous.page_hidden()
        page = self.page(PAGES[row].key)
        self.stack.setCurrentWidget(page)
        if self.isVisible():
            page.page_shown()

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        page = self.current_page()
        if page is not None:
            page.page_shown()

    def hideEvent(self, event: QHideEvent) -> None:
        super().hideEvent(event)
        page = self.current_page()
        if page is not None:
            page.page_hidden()

    # ----------------------------------------------------------------- notifications

    def on_notified(self, note: Notification) -> None:
        """Errors and warnings stay in the notice bar (wrapped, with their fix) until dismissed
        or replaced; the rest passes through the status bar."""
        if note.level in ("error", "warning"):
            self.notice.show_notice(note)
        else:
            self.statusBar().showMessage(f"{note.title}: {note.message}", 15000)

    # ----------------------------------------------------------------- fallback main window

    def become_main_window(self, menu: QMenu, request_quit: Callable[[], None]) -> None:
        menu.setTitle("traylm")
        self.menuBar().addMenu(menu)
        self.fallback_note.setVisible(True)
        self._quit = request_quit

    def prepare_close(self) -> None:
        self._closing = True
        page = self.current_page()
        if page is not None:
            page.page_hidden()

    def closeEvent(self, event: QCloseEvent) -> None:
        if self._quit is not None and not self._closing:
            event.ignore()  # the quit flow decides (and may ask)
            self._quit()
            return
        event.accept()
