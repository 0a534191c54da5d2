"""The tray's state icons (SVGs in resources/icons) and the state they stand for."""

from __future__ import annotations

import enum
from functools import cache

from PySide6.QtGui import QIcon

from engines.config.sections import resources_dir


class TrayState(enum.StrEnum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    BUSY = "busy"
    ERROR = "error"
    HOT = "hot"


@cache
def state_icon(state: TrayState) -> QIcon:
    return QIcon(str(resources_dir() / "icons" / f"traylm-{state.value}.svg"))


@cache
def app_icon() -> QIcon:
    return QIcon(str(resources_dir() / "icons" / "traylm.svg"))
