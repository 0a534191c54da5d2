"""Desktop notifications: engine ready, engine failed (with the diagnosis and its advice),
notices from the daemon, and errors of actions. The tray shows them as balloons (when
``ui.notifications`` is on); without a tray the fallback window shows them in its banner.
Download-finished and thermal warnings arrive here too once the daemon publishes them (issues 3
and 4), as ``Notice`` events or their own kinds.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, Signal

from desktop.state import AppState
from engines.events import EngineState, EngineStateChanged, Event, Notice


@dataclass(frozen=True)
class Notification:
    level: str  # info | warning | error
    title: str
    message: str
    popup: bool = True  # False: only kept in the history (e.g. "endpoint copied")
    ts_s: float = field(default_factory=time.time)


class Notifier(QObject):
    notified = Signal(object)  # Notification

    def __init__(self, state: AppState, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self.history: collections.deque[Notification] = collections.deque(maxlen=200)
        state.event_received.connect(self.on_event_received)

    @property
    def popups_enabled(self) -> bool:
        settings = self.state.settings
        return settings.ui.notifications if settings is not None else True

    def notify(self, level: str, title: str, message: str, *, popup: bool = True) -> None:
        note = Notification(level, title, message, popup and self.popups_enabled)
        self.history.append(note)
        self.notified.emit(note)

    def on_event_received(self, event: Event) -> None:
        if isinstance(event, EngineStateChanged):
            self._on_engine(event)
        elif isinstance(event, Notice):
            self.notify(event.level, event.title, event.message)

    def _on_engine(self, ev: EngineStateChanged) -> None:
        names = ", ".join(ev.served_names) or ev.engine_id
        if ev.state == EngineState.READY and ev.previous == EngineState.STARTING:
            url = self.state.endpoint_url
            where = f" at {url}" if url else ""
            self.notify("info", f"{ev.engine_id} is ready", f"serving {names}{where}")
        elif ev.state == EngineState.FAILED:
            if ev.diagnosis is not None:
                text = f"{ev.diagnosis.summary}. {ev.diagnosis.advice}"
            else:
                text = ev.detail or "see the engine log in the dashboard"
            self.notify("error", f"{ev.engine_id} failed", text)
