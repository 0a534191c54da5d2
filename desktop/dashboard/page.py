"""What every dashboard page is and gets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtWidgets import QWidget

from desktop.daemon.actions import Actions
from desktop.daemon.bridge import Bridge
from desktop.daemon.fixes import Fix
from desktop.daemon.notify import Notifier
from desktop.daemon.state import AppState


@dataclass(frozen=True)
class PageContext:
    bridge: Bridge
    state: AppState
    actions: Actions
    notifier: Notifier
    open_chat: Callable[[str], object]
    show_page: Callable[[str], None]
    open_setup: Callable[[], object] = lambda: None
    run_fix: Callable[[Fix], None] = lambda _fix: None


class Page(QWidget):
    """A dashboard page. Pages are built the first time they are shown; ``page_shown`` and
    ``page_hidden`` start and stop anything live (charts, log following)."""

    def __init__(self, ctx: PageContext, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx

    def page_shown(self) -> None:
        return None

    def page_hidden(self) -> None:
        return None

    def show_fix(self, fix: Fix) -> None:
        """Bring up what ``fix`` needs on this page (a tab, a field, a dialog)."""
        return None
