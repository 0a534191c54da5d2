"""Which icon the tray shows and what its tooltip says: pure functions of the app state."""

from __future__ import annotations

from collections.abc import Iterable

from desktop.icons import TrayState
from desktop.messages import LinkState
from engines.events import EngineState, EngineStatus


def tray_state(
    link: LinkState, engines: Iterable[EngineStatus], *, busy: bool, hot: bool = False
) -> TrayState:
    """Hot wins (GPU safety), then trouble (daemon unreachable, other version, a failed
    engine), then starting, then busy/ready, else stopped."""
    if hot:
        return TrayState.HOT
    if link in (LinkState.UNREACHABLE, LinkState.VERSION_MISMATCH):
        return TrayState.ERROR
    if link in (LinkState.CONNECTING, LinkState.STARTING_DAEMON):
        return TrayState.STARTING
    states = {e.state for e in engines}
    if EngineState.FAILED in states:
        return TrayState.ERROR
    if states & {EngineState.STARTING, EngineState.STOPPING}:
        return TrayState.STARTING
    if EngineState.READY in states:
        return TrayState.BUSY if busy else TrayState.READY
    return TrayState.STOPPED


def tooltip_text(
    *,
    link: LinkState,
    link_message: str,
    endpoint: str,
    engines: Iterable[EngineStatus],
    tokens_per_s: float | None,
    lan_sharing: bool,
) -> str:
    """Endpoint, models and their state, tokens/s. GPU temperatures and power join this when the
    daemon offers GPU telemetry (issue 3)."""
    if not link.usable:
        return f"traylm — {link_message}"
    lines = [f"traylm — {endpoint or 'endpoint unknown'}" + (" (LAN)" if lan_sharing else "")]
    shown = [e for e in engines if e.state != EngineState.STOPPED]
    for e in shown:
        names = ", ".join(e.served_names) or e.engine_id
        lines.append(f"{names}: {e.state}")
    if not shown:
        lines.append("no engine running")
    if tokens_per_s is not None and any(e.state == EngineState.READY for e in shown):
        lines.append(f"{tokens_per_s:.1f} tokens/s")
    if link == LinkState.VERSION_MISMATCH:
        lines.append(link_message)
    return "\n".join(lines)
