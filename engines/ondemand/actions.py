"""`traylm load` and `traylm unload` (and the same control API routes): explicit loads with a
GPU choice, a TTL and a pin; unloads that wait for running requests instead of cutting them."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engines.errors import EngineError, ModelUnavailable
from engines.events.core import EngineState
from engines.events.models import LoadedModel
from engines.ondemand.catalog import Entry
from engines.ondemand.lifecycle import replica_ids

if TYPE_CHECKING:
    from engines.ondemand.service import ModelsOnDemand


@dataclass(frozen=True)
class UnloadResult:
    name: str
    engine_id: str
    unloaded: bool
    deferred: bool
    message: str


async def load_model(
    feature: ModelsOnDemand,
    name: str,
    *,
    gpus: tuple[int, ...] | None = None,
    ttl_s: float | None = None,
    pin: bool = False,
    replicas: int | None = None,
) -> LoadedModel:
    """Place and start ``name`` (returns once its engine is starting; watch ``model.state``
    events or `traylm ps` for ready). ``ttl_s``: idle TTL (0: never; default: the profile's,
    else never); ``pin``: never unloaded or evicted until `traylm unload`; ``replicas``: that
    many engines behind its name (default: the profile's ``replicas``). Raises
    ModelUnavailable (unknown, ambiguous, no room with the reason) or EngineError."""
    entry = await _entry(feature, name)
    engine = feature.engines.get(entry.engine_id)
    moving = engine is not None and engine.state not in _DOWN and engine.profile.gpus != gpus
    if gpus is not None and engine is not None and moving:
        raise EngineError(
            f"{entry.name} is {engine.state} on GPU {_list(engine.profile.gpus)}; unload it "
            f"first (`traylm unload {entry.name}`) to load it on GPU {_list(gpus)}"
        )
    entry = await feature.fresh(entry)
    if replicas is not None and entry.profile is not None:
        entry = dataclasses.replace(
            entry, profile=dataclasses.replace(entry.profile, replicas=replicas)
        )
    flight = feature.lifecycle.flight(entry, "load", gpus)
    await asyncio.shield(flight.begun)
    for engine_id in replica_ids(flight.entry):
        res = feature.lifecycle.residency.get(engine_id)
        started = feature.engines.get(engine_id)
        if res is None and started is not None:
            res = feature.lifecycle.adopt(started)
        if res is not None:
            profile_ttl = entry.profile.idle_ttl_s if entry.profile else None
            res.origin = "load"
            res.ttl_s = ttl_s if ttl_s is not None else (profile_ttl or 0.0)
            res.pinned = pin
            res.keep_alive_s = None
            res.unload_when_idle = False
    return next(r for r in feature.ps() if r.engine_id == entry.engine_id)


async def unload_model(feature: ModelsOnDemand, name: str) -> UnloadResult:
    """Stop ``name`` (every replica of it) now, or, with requests running or queued, as soon
    as the last one ends (``deferred``); new requests until then are still served."""
    entry = await feature.find(name)
    engine_id = entry.engine_id if entry is not None else name
    if entry is not None and entry.kind == "attached":
        raise EngineError(
            f"{entry.name} is an attached server: traylm never stops it; "
            f"`traylm detach {entry.name}` stops routing to it"
        )
    engines = [e for e in feature.replicas(engine_id) if e.state not in _DOWN]
    if not engines and entry is None and feature.engines.get(engine_id) is None:
        raise feature.unknown(name)
    if not engines:
        raise EngineError(f"{name} is not loaded (`traylm ps` lists what is)")
    if engine_id in feature.lifecycle.flights or any(
        e.state == EngineState.STARTING for e in engines
    ):
        starting = next((e for e in engines if e.state == EngineState.STARTING), engines[0])
        raise EngineError(
            f"{name} is loading; unload it once it is ready, or stop the start with "
            f"`traylm stop {starting.engine_id}`"
        )
    label = entry.name if entry is not None else name
    deferred = [e for e in engines if not await feature.lifecycle.unload(e, "asked")]
    if not deferred:
        return UnloadResult(label, engine_id, True, False, f"{label} unloaded")
    in_flight = waiting = 0
    for e in deferred:
        running, queued, _ = feature.activity(e.engine_id)
        in_flight, waiting = in_flight + running, waiting + queued
    return UnloadResult(
        label,
        engine_id,
        False,
        True,
        f"{label} has {in_flight} request(s) running and {waiting} queued; it unloads as "
        "soon as the last one ends",
    )


async def _entry(feature: ModelsOnDemand, name: str) -> Entry:
    entry = await feature.find(name)
    if entry is None:
        raise feature.unknown(name)
    if entry.kind == "attached":
        raise ModelUnavailable(
            f"{entry.name} is an attached server: traylm routes to it but never loads it",
            code="attached_server",
            http_status=409,
        )
    return entry


_DOWN = (EngineState.STOPPED, EngineState.FAILED)


def _list(gpus: tuple[int, ...]) -> str:
    return ",".join(str(g) for g in gpus)
