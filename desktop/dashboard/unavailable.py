"""The honest placeholder for a page whose daemon API does not exist yet."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QLabel, QVBoxLayout, QWidget

from desktop.dashboard.page import Page, PageContext


class UnavailablePage(Page):
    def __init__(
        self,
        ctx: PageContext,
        *,
        title: str,
        purpose: str,
        waits_for: str,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(ctx, parent)
        self.setObjectName("unavailablePage")
        outer = QVBoxLayout(self)
        outer.setContentsMargins(32, 32, 32, 32)
        card = QFrame()
        card.setObjectName("unavailableCard")
        layout = QVBoxLayout(card)
        layout.setSpacing(12)
        heading = QLabel(f"<h2>{title}</h2>")
        layout.addWidget(heading)
        badge = QLabel("Not available in this daemon yet")
        badge.setObjectName("unavailableBadge")
        layout.addWidget(badge, 0, Qt.AlignmentFlag.AlignLeft)
        body = QLabel(
            f"<p>{purpose}</p>"
            f"<p><b>Waiting for:</b> {waits_for}</p>"
            "<p>This is a placeholder, not a finished page: it shows nothing until the daemon "
            "offers that API and the page is built on it.</p>"
        )
        body.setObjectName("unavailableText")
        body.setWordWrap(True)
        body.setTextFormat(Qt.TextFormat.RichText)
        layout.addWidget(body)
        outer.addWidget(card)
        outer.addStretch(1)
