"""A client rebuilds each event from its wire name, loading only the module of the kinds it
receives (engines/events/registry.py)."""

from __future__ import annotations

import subprocess
import sys

from engines.events import registry
from engines.events.codec import Event
from engines.events.core import EngineState, EngineStateChanged


def every_event_type() -> dict[str, type[Event]]:
    for name in registry.MODULES:
        registry.feature_module(name)
    found: dict[str, type[Event]] = {}
    pending = list(Event.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.__module__.startswith("engines."):  # not the kinds a test makes up for itself
            found[cls.kind] = cls
    return found


def test_every_wire_name_leads_to_its_type() -> None:
    types = every_event_type()
    assert len(types) > 20  # every feature's events were found
    for kind, cls in types.items():
        word = kind.partition(".")[0]
        assert registry.MODULE_OF.get(word) == cls.__module__.rpartition(".")[2], kind
        assert registry.event_type(kind) is cls


def test_an_event_comes_back_as_it_went() -> None:
    event = EngineStateChanged(
        engine_id="e", state=EngineState.READY, previous=EngineState.STARTING, served_names=("m",)
    )
    assert registry.from_wire(event.to_wire()) == event


LOADED_BY_ONE_EVENT = """
import sys
from engines.events.registry import from_wire
from_wire({"kind": "engine.log", "engine_id": "e", "line": "x"})
print(" ".join(sorted(m for m in sys.modules if m.startswith("engines.events."))))
"""


def test_a_client_loads_only_the_types_it_receives() -> None:
    out = subprocess.run(
        [sys.executable, "-c", LOADED_BY_ONE_EVENT],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert set(out.stdout.split()) == {
        "engines.events.codec",
        "engines.events.core",
        "engines.events.registry",
    }
