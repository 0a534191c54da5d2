"""What clients see of models on demand: the servable list (/v1/models, the chat window's
picker, `traylm models ls`) and the loaded models (`traylm ps`, the tray menu)."""

from __future__ import annotations

import collections
import time
from collections.abc import Mapping
from typing import Protocol

from engines.config.profiles import replica_base, replica_index
from engines.events.core import EngineState
from engines.events.models import LoadedModel, ModelStatus, ReplicaInfo, ServableModel
from engines.events.peers import BoxModel
from engines.ondemand.attach import AttachedServers
from engines.ondemand.catalog import Catalog, Entry
from engines.ondemand.lifecycle import Lifecycle
from engines.ondemand.occupancy import HOLDING, hold_of, on_cpu
from engines.ondemand.placing import Placer
from engines.runtime.supervisor import ManagedEngine


class ModelsOnDemand(Protocol):
    """What these views read of the feature (engines/ondemand/service.py)."""

    catalog: Catalog
    lifecycle: Lifecycle
    placer: Placer
    attached: AttachedServers

    @property
    def engines(self) -> Mapping[str, ManagedEngine]: ...

    def activity(self, upstream: str) -> tuple[int, int, float | None]: ...

    def replicas(self, engine_id: str) -> list[ManagedEngine]: ...


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
        if replica_base(engine.engine_id) not in seen and engine.state in HOLDING:
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
        gpus = () if on_cpu(engine) else engine.profile.gpus
    elif entry.profile is not None and feature.placer.applies(entry.profile):
        gpus, planned = feature.placer.preview_gpus(entry), True
    profile = entry.profile or (engine.profile if engine is not None else None)
    replicas = _replicas(feature, entry.engine_id)
    if len(replicas) > 1:
        engine = engine or feature.engines.get(replicas[0].engine_id)
        ready = any(r.state == str(EngineState.READY) for r in replicas)
        status = ModelStatus.LOADED if ready and not loading else status
        state = str(EngineState.READY) if ready else state
        gpus, planned = tuple(g for r in replicas for g in r.gpus), False
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
        replicas=replicas if len(replicas) > 1 else (),
    )


def _replicas(feature: ModelsOnDemand, engine_id: str) -> tuple[ReplicaInfo, ...]:
    """The engines of one model that hold resources, each with its state and GPUs."""
    return tuple(
        ReplicaInfo(
            e.engine_id,
            str(e.state),
            () if on_cpu(e) else e.profile.gpus,
            feature.activity(e.engine_id)[0],
        )
        for e in feature.replicas(engine_id)
        if e.state in HOLDING
    )


def shared(feature: ModelsOnDemand) -> list[BoxModel]:
    """The models ready on this box's own engines (a model's replicas as one, its engines'
    GPUs together): what paired boxes may send here (engines/peers/serving.py). Attached
    servers are not this box's to share."""
    entries = {e.engine_id: e for e in feature.catalog.index.entries}
    draining = feature.lifecycle.draining
    ready: dict[str, list[ManagedEngine]] = {}
    for e in feature.engines.values():
        if e.state == EngineState.READY and e.port and e.engine_id not in draining:
            ready.setdefault(replica_base(e.engine_id), []).append(e)
    out = []
    for base, engines in ready.items():
        entry, first = entries.get(base), engines[0]
        name = entry.name if entry is not None else first.profile.effective_served_name
        listed = entry.listed if entry is not None else ()
        loads = [feature.activity(e.engine_id) for e in engines]
        out.append(
            BoxModel(
                name=name,
                names=tuple(dict.fromkeys((name, *listed, *first.served_names))),
                engine=first.profile.engine,
                gpus=tuple(g for e in engines if not on_cpu(e) for g in e.profile.gpus),
                in_flight=sum(load[0] for load in loads),
                waiting=sum(load[1] for load in loads),
            )
        )
    return out


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
    """`traylm ps`: every engine holding resources (a model's replicas a row each, in order),
    then the attached servers."""
    names = {e.engine_id: e.name for e in feature.catalog.index.entries}
    now = time.monotonic()
    holding = sorted(
        (e for e in feature.engines.values() if e.state in HOLDING),
        key=lambda e: (replica_base(e.engine_id), replica_index(e.engine_id)),
    )
    counts = collections.Counter(replica_base(e.engine_id) for e in holding)
    rows = [_engine_row(feature, e, names, now, counts) for e in holding]
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
    feature: ModelsOnDemand,
    engine: ManagedEngine,
    names: dict[str, str],
    now_s: float,
    counts: Mapping[str, int],
) -> LoadedModel:
    res = feature.lifecycle.residency.get(engine.engine_id)
    in_flight, waiting, _ = feature.activity(engine.engine_id)
    bookings = {k: r.booking for k, r in feature.lifecycle.residency.items()}
    card = 0 if on_cpu(engine) else feature.placer.card_bytes()
    per_gpu = hold_of(engine, bookings, card, card) if engine.profile.gpus and card else 0
    idle = feature.lifecycle.idle_for_s(res, now_s) if res is not None else None
    limit = res.idle_limit_s() if res is not None else None
    counting = limit is not None and idle is not None and engine.state != EngineState.STARTING
    base = replica_base(engine.engine_id)
    of = max(counts.get(base, 1), replica_index(engine.engine_id))
    return LoadedModel(
        name=names.get(base, engine.profile.effective_served_name),
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
        ram_bytes=res.booking.host_bytes if res is not None else 0,
        replica=f"{replica_index(engine.engine_id)}/{of}" if of > 1 else "",
    )
