"""Async client for the daemon's control API, used by the CLI and the desktop app.

``DaemonClient.connect()`` finds the running daemon through ``daemon.json`` in the state dir and
checks that it answers. Every method raises ``DaemonUnavailable`` when the daemon cannot be
reached and ``ControlAPIError`` (with the daemon's message, which says what to do) otherwise.

Its calls go through aiohttp (the desktop app), or with ``plain_calls=True`` through the
standard library (engines/client/plain_calls.py: a CLI command that only calls does not import
aiohttp); the event stream and the long calls always use aiohttp, imported when first needed.

This package loads only what its user takes: ``engines.client.oneshot`` (a one-shot command)
does not bring the async client, nor ``DaemonClient`` every feature's event types until it is
asked for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engines.client.base import (
        JSON,
        ClientBase,
        DaemonInfo,
        api_path,
        find_daemon,
        named_path,
        pid_alive,
    )
    from engines.client.daemon_client import DaemonClient

__all__ = [
    "JSON",
    "ClientBase",
    "DaemonClient",
    "DaemonInfo",
    "api_path",
    "find_daemon",
    "named_path",
    "pid_alive",
]

_HOME = dict.fromkeys(__all__, "engines.client.base") | {
    "DaemonClient": "engines.client.daemon_client"
}


def __getattr__(name: str) -> Any:
    """Each name of ``__all__``, its module imported on first use."""
    if name not in _HOME:
        raise AttributeError(f"module 'engines.client' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value
    return value
