"""Every event type by its wire name, and ``from_wire`` to rebuild an event a client received.

A feature's event module is loaded when the first event of its kinds arrives (``MODULE_OF``: the
wire name's first word names the module), so a client loads only the types it receives: a
command that follows an engine's start loads ``core`` alone. The daemon's parts import only
the module of their own feature (the root helper, traylm-gpud, never loads the bench or chat
types).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from engines.events.codec import Event, from_plain

MODULE_OF = {
    "attached": "models",
    "batch": "batch",
    "bench": "bench",
    "boxes": "peers",
    "chat": "chat",
    "daemon": "core",
    "download": "hub",
    "engine": "core",
    "env": "core",
    "gateway": "gateway",
    "gpu": "gpu",
    "library": "hub",
    "model": "models",
    "notice": "core",
    "remote": "remote",
    "trt": "trt",
    "tune": "tune",
    "upgrade": "upgrade",
}
"""The first word of each wire name (``engine`` of ``engine.state``) → the module of its types
(tests/engines/events/test_event_registry.py checks it against every Event subclass)."""

MODULES = (
    "core",
    "gpu",
    "hub",
    "trt",
    "remote",
    "chat",
    "bench",
    "models",
    "gateway",
    "tune",
    "upgrade",
    "peers",
    "batch",
)
"""The feature modules, in the order ``engines.events`` looks names up in them."""

_loaded: dict[str, type[Event]] = {}


def feature_module(name: str) -> ModuleType:
    """The feature module ``engines.events.NAME``, imported on first use."""
    return importlib.import_module(f"engines.events.{name}")


def _event_types(of: ModuleType) -> dict[str, type[Event]]:
    """The Event subclasses a module defines, by wire name."""
    return {
        cls.kind: cls
        for cls in vars(of).values()
        if isinstance(cls, type)
        and issubclass(cls, Event)
        and cls is not Event
        and cls.__module__ == of.__name__
    }


def event_type(kind: str) -> type[Event]:
    """The event class of a wire name, its module loaded on first use. An unknown kind raises
    KeyError."""
    cls = _loaded.get(kind)
    if cls is None:
        _loaded.update(_event_types(feature_module(MODULE_OF[kind.partition(".")[0]])))
        cls = _loaded[kind]
    return cls


def from_wire(data: Mapping[str, Any]) -> Event:
    """Rebuild an event from its wire form. Unknown kinds raise KeyError; extra keys are ignored
    so that an older client can read a newer daemon's events."""
    return from_plain(event_type(str(data["kind"])), data)
