"""The gateway's live figures (engines/gateway/throughput.py): generated tokens per second and
requests in flight, published about once a second while requests run, and once with zeros when
they stop. An idle gateway publishes nothing."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from engines.events.codec import Event

CLIENTS = ("local", "lan", "box", "tuner", "bench", "ollama")
"""Who sent a recorded request: this computer, another one on the LAN, a paired box (one the
box served for it; engines/gateway/exchange.py), the daemon's own measurements (the tuner's
and the guarded upgrade's, with its internal credential), a benchmark run of this computer
(``peer`` is "run #ID"; a tuner's measurement stays "tuner" with its run there too), or an app
through Ollama's API (engines/ollama/, on its own port)."""


@dataclasses.dataclass(frozen=True)
class ModelRate:
    """Tokens per second one model generated over the last few seconds."""

    model: str
    tokens_per_s: float


@dataclasses.dataclass(frozen=True)
class EngineLoad:
    """Requests one upstream (an engine id, or ``remote:NAME``) serves and queues now."""

    engine_id: str
    in_flight: int
    queued: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class GatewayThroughput(Event):
    """A snapshot of the gateway's traffic: the tokens generated per second over the last few
    seconds (all models, and per model), and the requests in flight (all, and per upstream).
    Tokens are counted when a request ends (its usage, else its streamed chunks), as
    ``traylm_generation_tokens_total`` counts them."""

    kind: ClassVar[str] = "gateway.throughput"
    tokens_per_s: float
    in_flight: int
    models: tuple[ModelRate, ...] = ()
    engines: tuple[EngineLoad, ...] = ()
