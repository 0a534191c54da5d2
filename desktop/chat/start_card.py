"""The chat's "Starting…" card: after its Start button, the error card follows that engine as
the daemon runs it (its stage and the time while it starts) and, as soon as the start fails,
says why with the fix (its log) and Start again, instead of promising a reply that never comes.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from PySide6.QtCore import QObject, QTimer

from desktop.chat.controller import ChatController
from desktop.chat.transcript import ErrorCard
from desktop.daemon.fixes import ENGINE_LOG, Fix, fix_for
from desktop.daemon.messages import CallResult
from desktop.daemon.state import AppState
from desktop.look.formatting import fmt_duration
from engines.events import EngineState

FixButtons = list[tuple[str, str, Callable[[], None]]]


class StartCard(QObject):
    def __init__(
        self,
        card: ErrorCard,
        state: AppState,
        controller: ChatController,
        *,
        start_again: Callable[[str], None],
        run_fix: Callable[[Fix], None],
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.card = card
        self.state = state
        self.controller = controller
        self.start_again = start_again
        self.run_fix = run_fix
        self.profile = ""  # the engine the card waits for
        self._pressed_s = 0.0
        self._ticker = QTimer(self)
        self._ticker.setInterval(1000)  # the elapsed time
        self._ticker.timeout.connect(self.refresh)
        state.engines_changed.connect(self.refresh)

    def follow(self, profile: str) -> None:
        self.profile = profile
        self._pressed_s = time.monotonic()
        self._ticker.start()
        self.refresh()

    def on_start_answered(self, result: CallResult) -> None:
        """The daemon refused the start at once: say so on the card, with the fix."""
        if result.ok or result.cancelled or not self.profile:
            return
        profile = self._stop()
        fix = fix_for(result.error_code, result.error, target=profile)
        self._failed(profile, result.error, fix)

    def refresh(self) -> None:
        profile = self.profile
        if not profile or not self.card.isVisible():
            self._stop()
            return
        engine = self.state.engines.get(profile)
        if engine is not None and engine.state == EngineState.FAILED:
            self._stop()
            text = engine.detail
            if engine.diagnosis is not None:
                text = f"{engine.diagnosis.summary}. {engine.diagnosis.advice}"
            self._failed(
                profile, text, Fix(ENGINE_LOG, "Open its log", profile, f"traylm logs {profile}")
            )
            return
        entry = self.state.profile(profile)
        served = entry.served_names[0] if entry else profile
        stage = engine.stage if engine is not None else ""
        detail = f" ({stage})" if stage else ""
        elapsed = fmt_duration(time.monotonic() - self._pressed_s)
        self.card.message.setText(
            f"Starting {profile}{detail} · {elapsed}… the reply follows as soon as it serves "
            f"{served}."
        )

    def _stop(self) -> str:
        profile, self.profile = self.profile, ""
        self._ticker.stop()
        if profile:
            self.controller.retry_when_served = ""  # no reply is coming from this start
        return profile

    def _failed(self, profile: str, text: str, fix: Fix | None) -> None:
        fixes: FixButtons = []
        if fix is not None and fix.action:
            fixes.append(("startFix", fix.label, lambda: self.run_fix(fix)))
        fixes.append(("startEngine", f"Start {profile} again", lambda: self.start_again(profile)))
        cli = fix.cli if fix is not None else ""
        self.card.show_error(f"{profile} could not start: {text}", fixes, cli=cli)
