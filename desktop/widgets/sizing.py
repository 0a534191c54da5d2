"""A window's first size: what it was designed for, or less on a smaller screen (a 1366×768
laptop has about 700 px of height once the panel and the title bar are taken)."""

from __future__ import annotations

from PySide6.QtWidgets import QWidget

FRAME_ALLOWANCE_PX = 40  # title bar and borders the window manager adds around the window


def resize_within_screen(window: QWidget, width: int, height: int) -> None:
    screen = window.screen()
    if screen is not None:
        area = screen.availableGeometry()
        width = min(width, area.width())
        height = min(height, area.height() - FRAME_ALLOWANCE_PX)
    window.resize(width, height)
