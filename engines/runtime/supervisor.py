"""Supervisor: the set of engines the daemon runs, and the views of it that the gateway and
the features read. Each engine is a ManagedEngine (engines/runtime/engine.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Protocol

from engines.errors import EngineError
from engines.events.core import EngineState
from engines.runtime.engine import DAEMON_STOPPING, ManagedEngine
from engines.runtime.ports import LogSink, Prepare, Publish, Ranks

__all__ = [
    "EngineView",
    "LogSink",
    "ManagedEngine",
    "Prepare",
    "Publish",
    "Ranks",
    "RoutingView",
    "Supervisor",
]


class EngineView(Protocol):
    """The engines the daemon runs, read-only (GPU telemetry, hub, TensorRT-LLM cache)."""

    @property
    def engines(self) -> Mapping[str, ManagedEngine]: ...


class RoutingView(EngineView, Protocol):
    """How the gateway (and a benchmark) finds the engine for a model name. ``Supervisor`` is
    the one implementation today; models on demand will put a catalog in front of it (start the
    engine a request asks for, stop idle ones) behind this same view."""

    def route(self, model: str) -> ManagedEngine | None:
        """The engine serving ``model``: a ready one first, else one starting or stopping;
        None when no engine serves that name."""
        ...

    def served_models(self) -> list[tuple[str, ManagedEngine]]:
        """(served name, engine) for every ready engine (GET /v1/models)."""
        ...


class Supervisor:
    """The engines the daemon runs, keyed by engine id (the profile name). Implements
    RoutingView."""

    def __init__(self) -> None:
        self.engines: dict[str, ManagedEngine] = {}
        self._forgotten_released_s = 0.0

    def add(self, engine: ManagedEngine) -> None:
        current = self.engines.get(engine.engine_id)
        if current is not None and current.state not in (EngineState.STOPPED, EngineState.FAILED):
            raise EngineError(
                f"engine {engine.engine_id!r} is {current.state}; stop it first "
                f"(`traylm stop {engine.engine_id}`)"
            )
        if current is not None:
            self._forget(current)
        self.engines[engine.engine_id] = engine

    def get(self, engine_id: str) -> ManagedEngine | None:
        return self.engines.get(engine_id)

    def remove(self, engine_id: str) -> None:
        """Forget a stopped engine (a failed start the user stopped: nothing left to show)."""
        engine = self.engines.get(engine_id)
        if engine is not None and engine.state == EngineState.STOPPED:
            self._forget(engine)
            del self.engines[engine_id]

    def _forget(self, engine: ManagedEngine) -> None:
        self._forgotten_released_s = max(self._forgotten_released_s, engine.released_at_s)

    def released_at_s(self) -> float:
        """Monotonic time the last engine went down, forgotten ones included (the tuner
        forgets each candidate it stopped): GPU memory may have been freed since then."""
        return max([self._forgotten_released_s, *(e.released_at_s for e in self.engines.values())])

    def route(self, model: str) -> ManagedEngine | None:
        """The engine serving ``model`` (a served name or alias): a ready one first, else one
        that is starting (the gateway answers 503 + Retry-After for those)."""
        matches = [e for e in self.engines.values() if model in e.served_names]
        for state in (EngineState.READY, EngineState.STARTING, EngineState.STOPPING):
            for engine in matches:
                if engine.state == state:
                    return engine
        return matches[0] if matches else None

    def served_models(self) -> list[tuple[str, ManagedEngine]]:
        return [
            (name, e)
            for e in self.engines.values()
            if e.state == EngineState.READY
            for name in e.served_names
        ]

    async def stop_all(self, reason: str = DAEMON_STOPPING) -> None:
        await asyncio.gather(*(e.stop(reason) for e in self.engines.values()))
