"""What clients see of models on demand: the servable list (/v1/models, the chat window's
picker, `traylm models ls`) and the loaded models (`traylm ps`, the tray menu)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Protocol

from engines.events.core import EngineState
from engines.events.models import LoadedModel, ModelStatus, ServableModel
from engines.ondemand.attach import AttachedServers
from engines.ondemand.catalog import Catalog, Entry
from engines.ondemand.lifecycle import Lifecycle
from engines.ondemand.occupancy import HOLDING, Activity, hold_of
from engines.ondemand.placing import Placer
from engines.supervisor import ManagedEngine


class ModelsOnDemand(Protocol):
    """What these views read of the feature (engines/ondemand/service.py)."""

    catalog: Catalog
    lifecycle: Lifecycle
    placer: Placer
    attached: AttachedServers

    @property
    def engines(self) -> Mapping[str, ManagedEngine]: ...

    @property
    def activity(self) -> Activity: ...


def servable(feature: ModelsOnDemand) -> list[ServableModel]:
    """Every catalog entry with its status, and where it is or would go now; engines started
    ad hoc (`traylm start --model`) are listed too while they run."""
    out = []
    seen: set[str] = set()
    for entry in feature.catalog.index.entries:
        seen.add(entry.engine_id)
        if entry.kind == "attached":
            out.append(_attached(feature, entry))
            continue
        engine = feature.engines.get(entry.engine_id)
        out.append(_model(feature, entry, engine))
    for engine in feature.engines.values():
        if engine.engine_id not in seen and engine.state in HOLDING:
            name = engine.profile.effective_served_name
            entry = Entry(name, "engine", engine.engine_id, (), engine.profile.aliases)
            out.append(_model(feature, entry, engine))
    return out


def _model(feature: ModelsOnDemand, entry: Entry, engine: ManagedEngine | None) -> ServableModel:
    state = str(engine.state) if engine is not None else "stopped"
    loading = entry.engine_id in feature.lifecycle.flights
    if engine is not None and engine.state == EngineState.READY and not loading:
        status = ModelStatus.LOADED
    elif loading or (engine is not None and engine.state == EngineState.STARTING):
        status = ModelStatus.LOADING
    else:
        status = ModelStatus.UNLOADED
    gpus: tuple[int, ...] = ()
    planned = False
    if engine is not None and engine.state in HOLDING:
        gpus = engine.profile.gpus
    elif entry.profile is not None and feature.placer.applies(entry.profile):
        gpus, planned = feature.placer.preview_gpus(entry), True
    profile = entry.profile or (engine.profile if engine is not None else None)
    return ServableModel(
        name=entry.name,
        aliases=entry.listed,
        names=entry.names or (entry.name, *entry.listed),
        kind=entry.kind,
        engine_id=entry.engine_id,
        engine=profile.engine if profile else "",
        model=profile.model if profile else "",
        status=status,
        state=state,
        gpus=gpus,
        gpus_planned=planned,
        detail=engine.detail if engine is not None else "",
    )


def _attached(feature: ModelsOnDemand, entry: Entry) -> ServableModel:
    server = feature.attached.servers.get(entry.engine_id)
    ready = server is not None and server.state == "ready"
    return ServableModel(
        name=entry.name,
        aliases=entry.listed,
        names=entry.names,
        kind="attached",
        engine_id=entry.engine_id,
        engine="external",
        model=entry.url,
        status=ModelStatus.LOADED if ready else ModelStatus.UNLOADED,
        state=server.state if server else "unreachable",
        gpus=(),
        external=True,
        detail=server.detail if server else "",
    )


def loaded(feature: ModelsOnDemand) -> list[LoadedModel]:
    """`traylm ps`: every engine holding resources, then the attached servers."""
    names = {e.engine_id: e.name for e in feature.catalog.index.entries}
    now = time.monotonic()
    rows = [
        _engine_row(feature, e, names, now) for e in feature.engines.values() if e.state in HOLDING
    ]
    for server in feature.attached.servers.values():
        in_flight, waiting, _ = feature.activity(f"attached:{server.name}")
        rows.append(
            LoadedModel(
                name=server.name,
                engine_id=server.name,
                engine="external",
                state=server.state,
                origin="attached",
                gpus=(),
                vram_bytes=0,
                in_flight=in_flight,
                waiting=waiting,
                idle_for_s=None,
                unloads_in_s=None,
                ttl_s=0.0,
                pinned=False,
                external=True,
                url=server.url,
                detail=server.detail or ", ".join(server.models),
            )
        )
    return rows


def _engine_row(
    feature: ModelsOnDemand, engine: ManagedEngine, names: dict[str, str], now_s: float
) -> LoadedModel:
    res = feature.lifecycle.residency.get(engine.engine_id)
    in_flight, waiting, _ = feature.activity(engine.engine_id)
    bookings = {k: r.booking for k, r in feature.lifecycle.residency.items()}
    card = feature.placer.card_bytes()
    per_gpu = hold_of(engine, bookings, card, card) if engine.profile.gpus and card else 0
    idle = feature.lifecycle.idle_for_s(res, now_s) if res is not None else None
    limit = res.idle_limit_s() if res is not None else None
    counting = limit is not None and idle is not None and engine.state != EngineState.STARTING
    return LoadedModel(
        name=names.get(engine.engine_id, engine.profile.effective_served_name),
        engine_id=engine.engine_id,
        engine=engine.profile.engine,
        state=str(engine.state),
        origin=res.origin if res is not None else "start",
        gpus=engine.profile.gpus if card else (),
        vram_bytes=per_gpu * len(engine.profile.gpus),
        in_flight=in_flight,
        waiting=waiting,
        idle_for_s=idle,
        unloads_in_s=max(0.0, (limit or 0.0) - (idle or 0.0)) if counting else None,
        ttl_s=res.ttl_s if res is not None else 0.0,
        pinned=bool(res and res.pinned),
        detail=engine.stage,  # starting: its start phase ("loading weights")
    )
