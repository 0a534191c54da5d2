"""What the gateway is relaying to each engine right now, as the supervisor needs to know it:
how many requests are in flight (and whether any streams), when the engine last sent a byte of
a reply, and a way to end those requests at once, with the reason, when the engine is declared
dead, hung or stopped (their clients get an error event instead of waiting for the clean-up).

The gateway opens a ``RelayedRequest`` per relayed request and, for each piece of the reply,
stores the time in it and in its engine's record (one clock read: it is on the relay's path); the
supervisor reads ``in_flight`` and ``last_progress_s`` and calls ``end_all``; the gateway's own
sweep ends the requests whose client stopped reading (``stalled_writers``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

ENGINE_ERROR = "engine_error"
TRAYLM_STOPPING = "traylm_stopping"
"""The error type of a reply cut off because traylm itself stops (the chat window keeps it as
interrupted and offers Retry once the daemon is back, as for a lost connection)."""
End = Callable[[], None]
"""Ends one request at once (the gateway cancels its relay, which tells the client ``why``)."""


@dataclass(eq=False)
class RelayedRequest:
    """One request the gateway relays to an engine."""

    engine: EngineFlows
    streaming: bool
    end: End
    why: str = ""
    """Why the request was ended from outside its relay, in words for its client ("" while it
    runs on its own)."""
    writing_since_s: float = 0.0
    """When a write to the client started that has not finished (0: none): a client that does
    not read leaves it pending."""
    client: asyncio.Transport | None = None
    """The client's connection (closed by the sweep when the client stopped reading)."""
    why_type: str = ENGINE_ERROR
    """The error type its client is told (``TRAYLM_STOPPING``: not the engine's fault)."""

    def stop(self, why: str, type_: str = ENGINE_ERROR) -> None:
        if not self.why:
            self.why, self.why_type = why, type_
            self.end()

    def close(self) -> None:
        self.engine.flows.discard(self)
        if self.streaming:
            self.engine.streams -= 1


@dataclass
class EngineFlows:
    flows: set[RelayedRequest] = field(default_factory=set)
    streams: int = 0
    busy_since_s: float = 0.0
    last_byte_s: float = 0.0
    ended_why: str = ""


class EngineTraffic:
    """Requests in flight per engine (see the module docstring). No I/O."""

    def __init__(self) -> None:
        self._engines: dict[str, EngineFlows] = {}

    def _of(self, engine_id: str) -> EngineFlows:
        flows = self._engines.get(engine_id)
        if flows is None:
            flows = self._engines[engine_id] = EngineFlows()
        return flows

    def open(self, engine_id: str, *, streaming: bool, end: End) -> RelayedRequest:
        engine = self._of(engine_id)
        if not engine.flows:
            engine.busy_since_s = time.monotonic()
            engine.ended_why = ""
        flow = RelayedRequest(engine, streaming, end)
        engine.flows.add(flow)
        if streaming:
            engine.streams += 1
        return flow

    def any_in_flight(self) -> bool:
        """Whether any engine has a request in flight."""
        return any(engine.flows for engine in self._engines.values())

    def in_flight(self, engine_id: str) -> int:
        engine = self._engines.get(engine_id)
        return len(engine.flows) if engine is not None else 0

    def streams(self, engine_id: str) -> int:
        engine = self._engines.get(engine_id)
        return engine.streams if engine is not None else 0

    def last_reply_byte_s(self, engine_id: str) -> float:
        """Monotonic time of the engine's last reply byte relayed; 0 when none yet."""
        engine = self._engines.get(engine_id)
        return engine.last_byte_s if engine is not None else 0.0

    def last_progress_s(self, engine_id: str) -> float:
        """Monotonic time of the engine's last reply byte, or of the moment it got busy
        (its first request in flight after none) when that is later; 0 when never busy."""
        engine = self._engines.get(engine_id)
        return max(engine.last_byte_s, engine.busy_since_s) if engine is not None else 0.0

    def end_all(self, engine_id: str, why: str, type_: str = ENGINE_ERROR) -> int:
        """End every request in flight to the engine, telling each client ``why``. Returns how
        many were ended."""
        engine = self._engines.get(engine_id)
        if engine is None or not engine.flows:
            return 0
        engine.ended_why = why
        flows = list(engine.flows)
        for flow in flows:
            try:
                flow.stop(why, type_)
            except Exception:  # boundary: one request failing to end must not keep the others
                log.exception("ending a request to engine %s failed", engine_id)
        return len(flows)

    def stalled_writers(self, now_s: float, limit_s: float) -> list[RelayedRequest]:
        """Requests whose client has not taken a write for ``limit_s`` (it does not read)."""
        return [
            flow
            for engine in self._engines.values()
            for flow in engine.flows
            if flow.writing_since_s and now_s - flow.writing_since_s >= limit_s
        ]

    def ended_why(self, engine_id: str) -> str:
        """Why the engine's requests were last ended (until it gets busy again), or ""."""
        engine = self._engines.get(engine_id)
        return engine.ended_why if engine is not None else ""
