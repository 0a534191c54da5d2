"""Which icon the tray shows and what its tooltip says: pure functions of the app state."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from desktop.daemon.messages import LinkState
from desktop.tray.icons import TrayState
from engines.events import EngineState, EngineStatus, RemoteStatus


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
    if states & {EngineState.READY, EngineState.SLEEPING}:  # asleep: it wakes on a request
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
    gpu_lines: Sequence[str] = (),
    remote: str = "",
    disk: str = "",
    batches: str = "",
) -> str:
    """Endpoint, a full disk, models and their state, tokens/s, the batches running, one line
    per GPU (temperature and power against its limit) and the remote fallback when it is on."""
    if not link.usable:
        return f"traylm — {link_message}"
    lines = [f"traylm — {endpoint or 'endpoint unknown'}" + (" (LAN)" if lan_sharing else "")]
    if disk:
        lines.append(disk)
    shown = [e for e in engines if e.state != EngineState.STOPPED]
    for e in shown:
        names = ", ".join(e.served_names) or e.engine_id
        stage = f" ({e.stage})" if e.stage else ""
        lines.append(f"{names}: {e.state}{stage}")
    if not shown:
        lines.append("no engine running")
    if tokens_per_s is not None and any(e.state == EngineState.READY for e in shown):
        lines.append(f"{tokens_per_s:.1f} tokens/s")
    if batches:
        lines.append(batches)
    lines.extend(gpu_lines)
    if remote:
        lines.append(remote)
    if link == LinkState.VERSION_MISMATCH:
        lines.append(link_message)
    return "\n".join(lines)


def disk_text(status: Mapping[str, object]) -> str:
    """One line while the disk of the daemon's data folder is full (/api/status ``disk``),
    else ""."""
    disk = status.get("disk")
    if not isinstance(disk, Mapping) or not disk.get("full"):
        return ""
    return f"DISK FULL: free space on the disk of {disk.get('folder')} (chats wait in memory)"


def remote_text(remote: RemoteStatus | None) -> str:
    """One line about the remote fallback, or "" while it is off (or the daemon has none)."""
    if remote is None or not remote.enabled:
        return ""
    aliases = f" for {', '.join(remote.aliases)}" if remote.aliases else ""
    text = f"Remote fallback: ON → {remote.base_url}{aliases}"
    if not remote.ready:
        text += f" (not ready: {remote.detail})"
    elif remote.routed_requests:
        text += f", {remote.routed_requests} requests sent there"
    return text
