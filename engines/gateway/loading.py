"""What a route learns while the model a request names is loading (models on demand).

``GatewayContext.resolve(model, progress=...)`` calls ``progress`` with a ``LoadProgress`` when a
cold start begins and then every few seconds until the model is ready or its load failed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class LoadProgress:
    """Where a load stands: ``phase`` is a short word (queued, placing, evicting, waking,
    starting, or a start phase the engine reports) and ``detail`` a line for people."""

    model: str
    phase: str
    elapsed_s: float
    detail: str = ""


Progress = Callable[[LoadProgress], Awaitable[None]]
"""A route's hook for load progress (a streaming route writes an SSE comment)."""
