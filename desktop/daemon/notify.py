"""Desktop notifications: engine ready, engine failed (with the diagnosis and its advice; not
for the engines the tuner starts to measure, whose outcome the Tune page shows),
download finished or failed, notices from the daemon (the thermal guard's warnings and the PSU
headroom arrive as ``Notice`` events with source ``gpu.guard``/``gpu.psu``), and errors of
actions. The tray shows them as balloons (when ``ui.notifications`` is on); without a tray the
fallback window shows them in its status bar.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, Signal

from desktop.daemon.fixes import Fix, fix_for, in_words
from desktop.daemon.state import AppState
from desktop.look.formatting import fmt_bytes
from engines.events import (
    DownloadState,
    DownloadStateChanged,
    EngineState,
    EngineStateChanged,
    Event,
    Notice,
    tuner_engine,
)

REPEAT_WINDOW_S = 10.0  # the same message again within this time is not shown twice


@dataclass(frozen=True)
class Notification:
    level: str  # info | warning | error
    title: str
    message: str
    popup: bool = True  # False: only kept in the history (e.g. "endpoint copied")
    fix: Fix | None = None  # the button that fixes it, and the CLI command
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

    def notify(
        self, level: str, title: str, message: str, *, popup: bool = True, fix: Fix | None = None
    ) -> None:
        """Tell the user. A failed call and the daemon's own notice often say the same thing
        at once (a refused start): the second one is not shown again."""
        message = in_words(message)
        now = time.time()
        for old in reversed(self.history):
            if now - old.ts_s > REPEAT_WINDOW_S:
                break
            if old.level == level and old.message == message:
                return
        note = Notification(level, title, message, popup and self.popups_enabled, fix, now)
        self.history.append(note)
        self.notified.emit(note)

    def on_event_received(self, event: Event) -> None:
        if isinstance(event, EngineStateChanged):
            self._on_engine(event)
        elif isinstance(event, Notice):
            fix = fix_for(event.source, event.message, target=_subject(event.title))
            self.notify(event.level, event.title, event.message, fix=fix)
        elif isinstance(event, DownloadStateChanged):
            self._on_download(event)

    def _on_download(self, ev: DownloadStateChanged) -> None:
        d = ev.status
        if d.state == ev.previous:
            return
        if d.state == DownloadState.READY:
            size = fmt_bytes(d.total_bytes) if d.total_bytes else "nothing new"
            self.notify("info", "Download finished", f"{d.repo_id} is ready ({size}, verified)")
        elif d.state == DownloadState.FAILED:
            fix = fix_for(d.error_code, d.message, target=d.repo_id)
            self.notify("error", f"Download of {d.repo_id} failed", d.message, fix=fix)

    def _on_engine(self, ev: EngineStateChanged) -> None:
        names = ", ".join(ev.served_names) or ev.engine_id
        if tuner_engine(ev.engine_id):  # a measurement's own: the Tune page follows the tune
            return
        if ev.state == EngineState.READY and ev.previous == EngineState.STARTING:
            url = self.state.endpoint_url
            where = f" at {url}" if url else ""
            self.notify("info", f"{ev.engine_id} is ready", f"serving {names}{where}")
        elif ev.state == EngineState.FAILED:
            if ev.diagnosis is not None:
                text = f"{ev.diagnosis.summary}. {ev.diagnosis.advice}"
            else:
                text = ev.detail or "see the engine log in the dashboard"
            fix = fix_for("engine_failed", text, target=ev.engine_id)
            self.notify("error", f"{ev.engine_id} failed", text, fix=fix)


def _subject(title: str) -> str:
    """The engine or profile a daemon notice is about ("cannot start NAME" → NAME)."""
    return title.removeprefix("cannot start ").strip() if title.startswith("cannot start ") else ""
