"""Start phases as text for the CLI: "loading weights (12 s)…" while an engine starts, and where
the time went once it is ready."""

from __future__ import annotations

from collections.abc import Callable

from engines.events.core import EngineStartPhase, EngineState, EngineStatus

REPEAT_S = 10.0
"""A long phase (a first compile) gets a fresh line this often, so a wait is never silent."""


def phase_text(status: EngineStatus) -> str:
    """ "loading weights (12 s)…" for a starting engine; "" when there is no phase to show."""
    if status.state != EngineState.STARTING or not status.phase_label or status.phase == "ready":
        return ""  # (ready while starting: the last launch's, during a restart's back-off)
    return f"{status.phase_label} ({status.phase_elapsed_s:.0f} s)…"


def breakdown(status: EngineStatus) -> str:
    """ "17.2 s: import 4.1 s, config 0.1 s, …" for a start that reached ready; "" otherwise."""
    if status.phase != "ready" or not status.phases:
        return ""
    parts = [f"{p.phase} {p.duration_s:.1f} s" for p in status.phases if p.duration_s is not None]
    return f"{status.phases[-1].started_s:.1f} s: " + ", ".join(parts)


class PhasePrinter:
    """Feeds on status snapshots (as `start --wait` polls them) and on ``engine.phase`` events,
    and prints a line when the phase changes, and again every REPEAT_S seconds while it lasts."""

    def __init__(self, write: Callable[[str], None] = print) -> None:
        self._write = write
        self._shown: tuple[str, int] = ("", -1)

    def __call__(self, status: EngineStatus) -> None:
        text = phase_text(status)
        if not text:
            return
        key = (status.phase, int(status.phase_elapsed_s // REPEAT_S))
        if key != self._shown:
            self._shown = key
            self._write(f"  {text}")

    def began(self, event: EngineStartPhase) -> None:
        """A phase began (the event comes at once; a poll may not see a short phase at all)."""
        if event.phase in ("ready", self._shown[0]):  # (a poll may have shown it already)
            return
        self._shown = (event.phase, 0)
        self._write(f"  {event.label} (0 s)…")
