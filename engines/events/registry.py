"""Every event type by its wire name, and ``from_wire`` to rebuild an event a client received.

This module loads every feature's event module; the daemon's parts import only the module of
their own feature (the root helper, traylm-gpud, never loads the bench or chat types).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engines.events import bench, chat, core, gpu, hub, models, remote, trt
from engines.events.codec import Event, from_plain

MODULES = (core, gpu, hub, trt, remote, chat, bench, models)
"""The feature modules, in the order ``engines.events`` looks names up in them."""


def _all_event_types() -> dict[str, type[Event]]:
    found: dict[str, type[Event]] = {}
    pending: list[type[Event]] = [Event]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls is not Event:
            found[cls.kind] = cls
    return found


EVENT_TYPES: dict[str, type[Event]] = _all_event_types()
"""Every Event subclass of the modules above, by wire name (computed once, at import)."""


def from_wire(data: Mapping[str, Any]) -> Event:
    """Rebuild an event from its wire form. Unknown kinds raise KeyError; extra keys are ignored
    so that an older client can read a newer daemon's events."""
    cls = EVENT_TYPES[str(data["kind"])]
    return from_plain(cls, data)
