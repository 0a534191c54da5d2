"""How the app says what an engine is doing (one place: the tray, the dashboard, the chat and
the setup window say it the same way)."""

from __future__ import annotations

from engines.events import EngineState, EngineStatus


def engine_stage(engine: EngineStatus) -> str:
    """What a starting engine does now, in words: its start phase ("loading weights"), else
    why it is starting ("launching", "crashed; restart 1/3 in 2 s"); "" in other states."""
    if engine.state != EngineState.STARTING:
        return ""
    if engine.phase_label and engine.phase != "ready":  # (ready: the last launch's)
        return engine.phase_label
    return engine.detail
