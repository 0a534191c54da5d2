"""The app's look: Qt's Fusion style with a designed palette that follows the desktop's light or
dark setting (``QStyleHints.colorScheme``, Qt 6.5+), or the one ``ui.theme`` forces, plus one
spacing scale and one type scale that every window's style sheet uses.

``apply_theme`` is called once by the app (and again when the desktop switches between light
and dark); widgets never pick colours of their own beyond the status colours (green, amber, red),
which read on both themes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication, QLabel, QPushButton

from desktop.look.style import STYLE

log = logging.getLogger(__name__)

# One spacing scale (px) and one type scale (multiples of the desktop's base font size).
SPACE_XS, SPACE_S, SPACE_M, SPACE_L, SPACE_XL = 4, 8, 12, 16, 24
RADIUS_S, RADIUS_M = 6, 10
TYPE_SMALL, TYPE_BODY, TYPE_HEADING, TYPE_TITLE = 0.9, 1.0, 1.2, 1.6
BASE_POINT_SIZE = 10.0  # used when the desktop reports no usable font size


@dataclass(frozen=True)
class Palette:
    """The designed colours of one theme (the roles Qt's palette and the style sheet use)."""

    name: str
    window: str
    surface: str  # inputs, lists, tables, cards
    surface_alt: str  # alternate rows, the page list
    text: str
    muted: str
    border: str
    button: str
    accent: str
    accent_text: str
    accent_soft: str  # selected rows, hovered nav items
    link: str
    tooltip: str
    tooltip_text: str


LIGHT = Palette(
    name="light",
    window="#f5f6f8",
    surface="#ffffff",
    surface_alt="#eef0f3",
    text="#1d2129",
    muted="#5f6773",
    border="#d3d8df",
    button="#ffffff",
    accent="#2563eb",
    accent_text="#ffffff",
    accent_soft="#dce7fd",
    link="#1d4ed8",
    tooltip="#1d2129",
    tooltip_text="#f5f6f8",
)
DARK = Palette(
    name="dark",
    window="#1b1d21",
    surface="#24272c",
    surface_alt="#202328",
    text="#e7e9ed",
    muted="#9aa2ad",
    border="#3a3f47",
    button="#2c3036",
    accent="#4f8cff",
    accent_text="#0b1220",
    accent_soft="#233a66",
    link="#7aa7ff",
    tooltip="#e7e9ed",
    tooltip_text="#1b1d21",
)
THEMES = ("system", "light", "dark")


def desktop_scheme() -> Qt.ColorScheme:
    """What the desktop says now (Unknown when it says nothing, e.g. on a bare X server)."""
    hints = QGuiApplication.styleHints()
    return hints.colorScheme() if hasattr(hints, "colorScheme") else Qt.ColorScheme.Unknown


def pick(theme: str, scheme: Qt.ColorScheme | None = None) -> Palette:
    """The palette for a ``ui.theme`` value: light, dark, or system (the desktop's ``scheme``,
    read now when not given; light when the desktop says nothing)."""
    if theme not in ("light", "dark"):
        theme = "dark" if (scheme or desktop_scheme()) == Qt.ColorScheme.Dark else "light"
    return DARK if theme == "dark" else LIGHT


def qt_palette(p: Palette) -> QPalette:
    pal = QPalette()
    roles = {
        QPalette.ColorRole.Window: p.window,
        QPalette.ColorRole.WindowText: p.text,
        QPalette.ColorRole.Base: p.surface,
        QPalette.ColorRole.AlternateBase: p.surface_alt,
        QPalette.ColorRole.Text: p.text,
        QPalette.ColorRole.Button: p.button,
        QPalette.ColorRole.ButtonText: p.text,
        QPalette.ColorRole.BrightText: "#ffffff",
        QPalette.ColorRole.Highlight: p.accent,
        QPalette.ColorRole.HighlightedText: p.accent_text,
        QPalette.ColorRole.Link: p.link,
        QPalette.ColorRole.LinkVisited: p.link,
        QPalette.ColorRole.ToolTipBase: p.tooltip,
        QPalette.ColorRole.ToolTipText: p.tooltip_text,
        QPalette.ColorRole.PlaceholderText: p.muted,
        QPalette.ColorRole.Mid: p.border,
        QPalette.ColorRole.Midlight: p.surface_alt,
        QPalette.ColorRole.Dark: p.border,
        QPalette.ColorRole.Light: p.surface,
        QPalette.ColorRole.Shadow: "#000000",
    }
    for role, color in roles.items():
        pal.setColor(role, QColor(color))
    disabled = QColor(p.muted)
    for role in (
        QPalette.ColorRole.WindowText,
        QPalette.ColorRole.Text,
        QPalette.ColorRole.ButtonText,
    ):
        pal.setColor(QPalette.ColorGroup.Disabled, role, disabled)
    return pal


def style_sheet(p: Palette, base_pt: float) -> str:
    """The app-wide style sheet: the shared components first, then the windows' own rules."""
    return "".join(
        (_controls(p), _containers(p), _menus(p), _nav_and_roles(p, base_pt), _balloon(), STYLE)
    )


def _controls(p: Palette) -> str:
    """Buttons (the primary one in the accent colour), text inputs."""
    return f"""
QPushButton {{
    background: {p.button}; color: {p.text}; border: 1px solid {p.border};
    border-radius: {RADIUS_S}px; padding: {SPACE_XS + 1}px {SPACE_M}px; min-height: 18px;
}}
QPushButton:hover {{ border-color: {p.accent}; }}
QPushButton:pressed {{ background: {p.accent_soft}; }}
QPushButton:disabled {{ color: {p.muted}; background: {p.surface_alt}; }}
QPushButton[primary="true"] {{
    background: {p.accent}; color: {p.accent_text}; border-color: {p.accent}; font-weight: 600;
}}
QPushButton[primary="true"]:disabled {{ background: {p.border}; border-color: {p.border}; }}
QLineEdit, QPlainTextEdit, QTextEdit {{
    background: {p.surface}; border: 1px solid {p.border}; border-radius: {RADIUS_S}px;
    padding: {SPACE_XS}px; selection-background-color: {p.accent};
    selection-color: {p.accent_text};
}}
QLineEdit:focus, QPlainTextEdit:focus, QTextEdit:focus {{ border-color: {p.accent}; }}
"""


def _containers(p: Palette) -> str:
    """Group boxes, tabs, tables and lists, progress bars."""
    return f"""
QGroupBox {{
    border: 1px solid {p.border}; border-radius: {RADIUS_M}px; margin-top: {SPACE_L}px;
    padding: {SPACE_M}px {SPACE_S}px {SPACE_S}px {SPACE_S}px; background: {p.surface};
}}
QGroupBox[flat="true"] {{
    border: none; margin-top: 0; padding: {SPACE_S}px 0 0 0; background: transparent;
}}
QGroupBox::title {{
    subcontrol-origin: margin; left: {SPACE_XS}px; padding: 0 {SPACE_XS}px; color: {p.text};
    font-weight: 600;
}}
QTabWidget::pane {{ border: 1px solid {p.border}; border-radius: {RADIUS_S}px; top: -1px; }}
QTabBar::tab {{
    padding: {SPACE_XS + 2}px {SPACE_M}px; margin-right: 2px; color: {p.muted};
    border: 1px solid transparent; border-top-left-radius: {RADIUS_S}px;
    border-top-right-radius: {RADIUS_S}px;
}}
QTabBar::tab:selected {{
    color: {p.text}; background: {p.surface}; border-color: {p.border};
    border-bottom-color: {p.surface}; font-weight: 600;
}}
QTabBar::tab:hover:!selected {{ color: {p.text}; }}
QTableView, QListView {{
    background: {p.surface}; border: 1px solid {p.border}; border-radius: {RADIUS_S}px;
    alternate-background-color: {p.surface_alt}; gridline-color: {p.surface_alt};
}}
QListWidget#chatList::item {{
    padding: {SPACE_XS + 2}px {SPACE_S}px; border-radius: {RADIUS_S - 2}px; color: {p.text};
}}
QListWidget#chatList::item:hover {{ background: {p.accent_soft}; }}
QListWidget#chatList::item:selected {{ background: {p.accent}; color: {p.accent_text}; }}
QHeaderView::section {{
    background: {p.surface_alt}; color: {p.muted}; border: none;
    border-bottom: 1px solid {p.border}; padding: {SPACE_XS}px {SPACE_S}px; font-weight: 600;
}}
QProgressBar {{
    border: 1px solid {p.border}; border-radius: {RADIUS_S}px; background: {p.surface_alt};
    text-align: center; min-height: 18px; color: {p.text};
}}
QProgressBar::chunk {{ background: {p.accent}; border-radius: {RADIUS_S - 1}px; }}
QProgressBar[textVisible="true"]::chunk {{ background: {p.accent_soft}; }}
"""


def _menus(p: Palette) -> str:
    return f"""
QMenu {{
    background: {p.surface}; border: 1px solid {p.border}; padding: {SPACE_XS}px;
}}
QMenu::item {{ padding: {SPACE_XS + 1}px {SPACE_L}px; border-radius: {RADIUS_S - 2}px; }}
QMenu::item:selected {{ background: {p.accent}; color: {p.accent_text}; }}
QMenu::item:disabled {{ color: {p.muted}; }}
QMenu::separator {{ height: 1px; background: {p.border}; margin: {SPACE_XS}px {SPACE_S}px; }}
QToolTip {{
    background: {p.tooltip}; color: {p.tooltip_text}; border: none; padding: {SPACE_XS}px;
}}
"""


def _nav_and_roles(p: Palette, base_pt: float) -> str:
    """The dashboard's page list, and the type scale's roles (title, heading, muted, hint)."""
    small, heading, title = (round(base_pt * k, 1) for k in (TYPE_SMALL, TYPE_HEADING, TYPE_TITLE))
    return f"""
QListWidget#pageNav {{
    background: {p.surface_alt}; border: none; border-right: 1px solid {p.border};
    border-radius: 0; padding: {SPACE_S}px; font-size: {heading * 0.92:.1f}pt; outline: 0;
}}
QListWidget#pageNav::item {{
    padding: {SPACE_S}px {SPACE_M}px; margin: 1px 0; border-radius: {RADIUS_S}px;
    color: {p.text};
}}
QListWidget#pageNav::item:hover {{ background: {p.accent_soft}; }}
QListWidget#pageNav::item:selected {{
    background: {p.accent}; color: {p.accent_text}; font-weight: 600;
}}
QLabel[role="title"] {{ font-size: {title}pt; font-weight: 600; }}
QLabel[role="heading"] {{ font-size: {heading}pt; font-weight: 600; }}
QLabel[role="muted"] {{ color: {p.muted}; }}
QLabel[role="hint"] {{ color: {p.muted}; font-size: {small}pt; }}
QFrame[role="card"] {{
    background: {p.surface}; border: 1px solid {p.border}; border-radius: {RADIUS_M}px;
}}
QFrame#noticeBar[level="error"] {{
    background: rgba(214, 40, 40, 0.12); border-bottom: 1px solid #d62828;
}}
QFrame#noticeBar[level="warning"] {{
    background: rgba(242, 183, 5, 0.16); border-bottom: 1px solid #e0a100;
}}
QFrame#noticeBar[level="info"] {{
    background: {p.accent_soft}; border-bottom: 1px solid {p.accent};
}}
"""


def _balloon() -> str:
    """The tray's own notification balloon (Qt draws it where the desktop has no notification
    service) keeps Qt's fixed pale yellow in either theme: its text and close button follow
    that, not the dark palette (light text on pale yellow could not be read)."""
    return f"""
QBalloonTip QLabel {{ color: {LIGHT.text}; background: transparent; }}
QBalloonTip QPushButton {{ background: transparent; border: none; }}
"""


def base_point_size(app: QApplication) -> float:
    size = app.font().pointSizeF()
    return size if size > 0 else BASE_POINT_SIZE


def apply_theme(
    app: QApplication, theme: str = "system", scheme: Qt.ColorScheme | None = None
) -> Palette:
    """Fusion, the palette for ``theme`` (and the desktop's ``scheme``) and the style sheet, on
    the whole app."""
    palette = pick(theme, scheme)
    sheet = style_sheet(palette, base_point_size(app))
    if app.property("traylmTheme") == palette.name and app.styleSheet() == sheet:
        return palette  # unchanged: a new style sheet would re-polish every widget for nothing
    if app.property("traylmStyle") != "Fusion":  # app.style() is the style sheet's proxy
        app.setStyle("Fusion")
        app.setProperty("traylmStyle", "Fusion")
    app.setPalette(qt_palette(palette))
    app.setStyleSheet(sheet)
    app.setProperty("traylmTheme", palette.name)
    log.debug("theme %s (asked: %s)", palette.name, theme)
    return palette


def text_label(name: str, role: str = "") -> QLabel:
    """A wrapped, selectable label (messages people may copy); ``role`` picks its type style
    (hint: the CLI command under a fix button, muted, title, heading)."""
    label = QLabel()
    label.setObjectName(name)
    if role:
        label.setProperty("role", role)
    label.setWordWrap(True)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    return label


def primary(button: QPushButton) -> QPushButton:
    """Mark the main action of a view (drawn in the accent colour)."""
    button.setProperty("primary", True)
    return button
