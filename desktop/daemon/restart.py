"""What restarting the daemon does, said before it does it (Settings and the tray ask the same
way): the models it stops and loads again, a port that moves, and the `traylm serve` flags it
is started with again."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from engines.config.sections import Settings

RESTART, CONFIRM_RESTART = "Restart the daemon", "Restart now"


def restart_plan(
    loaded: tuple[str, ...],
    settings: Settings | None,
    status: Mapping[str, object],
    serve_args: Sequence[str] = (),
) -> str:
    """What a restart will do, said before it does it."""
    stops = (
        f"Restarting stops {', '.join(loaded)} (replies being written are cut off) and loads "
        "it again once the daemon is back"
        if loaded
        else "Restarting stops the daemon for a few seconds (no model is loaded)"
    )
    bound = status.get("bound")
    where = ", ".join(map(str, bound)) if isinstance(bound, list | tuple) else ""
    if settings is not None and where and port_of(where) != settings.gateway.port:
        stops += f"; the endpoint moves to port {settings.gateway.port}"
    if serve_args:
        stops += f"; it starts again as `traylm serve {shlex.join(serve_args)}`, as it ran"
    return f"{stops}. Click “{CONFIRM_RESTART}” to go ahead."


def port_of(address: str) -> int:
    """The port of "127.0.0.1:8000" (the first address of a list)."""
    tail = address.split(",")[0].rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else 0
