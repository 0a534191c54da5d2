"""What the app knows about the daemon, on the GUI thread. Widgets read it and listen to its
signals; only ``AppState.on_message_received`` (fed by the bridge) changes it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from types import MappingProxyType

from PySide6.QtCore import QObject, Signal

from desktop.daemon.boxes import Box, BoxReplica, box_replicas_of, boxes_of
from desktop.daemon.fixes import in_words
from desktop.daemon.gpu_state import GPUWatch
from desktop.daemon.install_text import InstallPace, install_words
from desktop.daemon.messages import (
    ConnectionChanged,
    EfficiencyLoaded,
    EnginesLoaded,
    EnvEntry,
    EnvsLoaded,
    GPUsLoaded,
    LibraryLoaded,
    LinkState,
    ProfileEntry,
    ProfilesLoaded,
    ServableLoaded,
    SettingsLoaded,
    StatusLoaded,
)
from engines.config.profiles import replica_base, replica_index
from engines.config.sections import Settings
from engines.events import (
    EngineStartPhase,
    EngineState,
    EngineStateChanged,
    EngineStatus,
    EnvInstallProgress,
    Event,
    GatewayThroughput,
    GPUEnergyUpdated,
    GPUGuardAction,
    GPUHelperChanged,
    GPUSampled,
    GPUStateChanged,
    LocalFolder,
    LocalModel,
    PhaseTime,
    RemoteStatus,
    ServableModel,
    from_plain,
    tuner_engine,
)

LIVE_STATES = (
    EngineState.STARTING,
    EngineState.READY,
    EngineState.SLEEPING,  # loaded, weights in host RAM: a request wakes it
    EngineState.STOPPING,
)
LOADED_STATES = (EngineState.READY, EngineState.SLEEPING)
"""Serving models: a request is answered (a sleeping engine wakes first)."""
_GPU_EVENTS = (GPUSampled, GPUGuardAction, GPUHelperChanged, GPUEnergyUpdated, GPUStateChanged)


class AppState(QObject):
    connection_changed = Signal(object)  # ConnectionChanged
    engines_changed = Signal()
    profiles_changed = Signal()
    settings_changed = Signal()
    status_changed = Signal()
    throughput_sampled = Signal(object)  # GatewayThroughput
    envs_changed = Signal()
    library_changed = Signal()
    servable_changed = Signal()  # the daemon's answer to why each model cannot start here
    event_received = Signal(object)  # every engines.events.Event, after state was updated

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.connection = ConnectionChanged(LinkState.CONNECTING, "connecting to the daemon…")
        self.engines: dict[str, EngineStatus] = {}
        self.profiles: tuple[ProfileEntry, ...] = ()
        self.broken_profiles: tuple[str, ...] = ()
        self.settings: Settings | None = None
        self.docs: Mapping[str, str] = MappingProxyType({})
        self.status: Mapping[str, object] = MappingProxyType({})
        self.throughput: GatewayThroughput | None = None
        self.local_streams = 0  # chat replies streaming from this app right now
        self.gpu = GPUWatch(self)
        self.envs: tuple[EnvEntry, ...] | None = None  # None until the daemon listed them
        self.install: EnvInstallProgress | None = None  # the engine install running now
        self.install_seen_s = 0.0  # when its last event came (monotonic)
        self.install_pace = InstallPace()  # its download rate
        self.cached_models: tuple[LocalModel, ...] = ()
        self.folders: tuple[LocalFolder, ...] = ()
        self.servable: Mapping[str, ServableModel] = MappingProxyType({})
        """The daemon's servable models by engine id and by every name that routes to them."""
        self.servable_listed = False  # the daemon listed them at least once
        self._remote: RemoteStatus | None = None
        self.boxes: tuple[Box, ...] = ()  # the paired boxes (their GPUs), from the status
        self.box_replicas: tuple[BoxReplica, ...] = ()  # the models they serve as replicas here

    # ----------------------------------------------------------------- derived facts

    @property
    def connected(self) -> bool:
        return self.connection.state.usable

    @property
    def endpoint_url(self) -> str:
        return f"{self.connection.url}/v1" if self.connection.url else ""

    @property
    def busy(self) -> bool:
        in_flight = self.throughput.in_flight if self.throughput else 0
        return in_flight > 0 or self.local_streams > 0

    @property
    def remote(self) -> RemoteStatus | None:
        """The remote fallback as /api/status reports it (None: this daemon has none)."""
        return self._remote

    def live_engines(self) -> list[EngineStatus]:
        return [e for e in self.engines.values() if e.state in LIVE_STATES]

    def served_models(self) -> list[str]:
        """The names the loaded engines serve, each once (replicas share theirs)."""
        loaded = self.loaded_engines()
        return list(dict.fromkeys(name for e in loaded for name in e.served_names))

    def loaded_engines(self) -> list[EngineStatus]:
        """Engines holding a model now (ready or asleep): what the tray offers to unload."""
        return [e for e in self.engines.values() if e.state in LOADED_STATES]

    def replicas_of(self, engine: EngineStatus) -> list[EngineStatus]:
        """The engines serving ``engine``'s model as its replicas (``NAME``, ``NAME.r2``...),
        in order; just ``engine`` for a model served by one."""
        base = replica_base(engine.engine_id)
        same = [e for e in self.engines.values() if replica_base(e.engine_id) == base]
        return sorted(same, key=lambda e: replica_index(e.engine_id))

    def replica_text(self, engine: EngineStatus) -> str:
        """ "replica 2/2 on GPU 1" for one of several engines serving one model; "" else."""
        count = len(self.replicas_of(engine))
        if count < 2:
            return ""
        where = f"GPU {','.join(str(g) for g in engine.gpus)}" if engine.gpus else engine.device
        return f"replica {replica_index(engine.engine_id)}/{count} on {where}"

    def box_only_models(self) -> list[BoxReplica]:
        """The paired boxes' models no engine of this box serves, each once (its first box):
        a chat through :8000 reaches them there."""
        local = set(self.served_models())
        away_last = sorted(self.box_replicas, key=lambda r: not r.away)  # one that answers wins
        by_name = {r.name: r for r in away_last if r.name not in local}
        return sorted(by_name.values(), key=lambda r: r.name)

    def install_text(self) -> str:
        """The running install in words, with its download rate and a clock that ticks between
        its events ("" when none runs)."""
        if self.install is None:
            return ""
        waited_s = time.monotonic() - self.install_seen_s
        rate = self.install_pace.bytes_per_s()
        return install_words(self.install, bytes_per_s=rate, waited_s=waited_s)

    def profile(self, name: str) -> ProfileEntry | None:
        return next((p for p in self.profiles if p.name == name), None)

    def profile_serving(self, model: str) -> ProfileEntry | None:
        return next((p for p in self.profiles if model in p.served_names), None)

    @property
    def real_gpus(self) -> int:
        """NVIDIA GPUs engines can use here (simulated ones show telemetry, run nothing)."""
        overview = self.gpu.overview
        if overview is None or overview.simulated:
            return 0
        return len(overview.gpus)

    def blocker(self, entry: ProfileEntry) -> str:
        """Why this profile cannot start here ("" when it can)."""
        return self.why_blocked(entry.name)

    def why_blocked(self, name: str) -> str:
        """Why the model or profile ``name`` cannot start here, as the daemon says (its servable
        model's ``blocked``; a start is refused with the same words); "" when it can, or when
        the daemon has not listed it."""
        model = self.servable.get(name)
        return in_words(model.blocked) if model is not None else ""

    def blocked_code(self, name: str) -> str:
        """The error code of ``why_blocked`` (gpu_not_found, engine_env, hub_unavailable, ...)."""
        model = self.servable.get(name)
        return model.blocked_code if model is not None else ""

    def current_profile(self) -> str:
        """The profile or model folder the tray's Start acts on: the one last started or
        chatted with, else a live engine (not the tuner's), else the first profile, then
        folder, that can start here; "" when none can (the tray offers the setup)."""
        wanted = self.settings.ui.last_profile if self.settings else ""
        if wanted and self.startable(wanted):
            return wanted
        live = [e for e in self.live_engines() if not tuner_engine(e.engine_id)]
        if live:  # (a tuner's measurement is gone when the tune ends: never the default)
            return live[0].engine_id
        profile = next((p.name for p in self.profiles if not self.blocker(p)), "")
        if profile:
            return profile
        folders = (m for m in self.servable.values() if m.kind == "folder" and not m.blocked)
        return next((m.engine_id for m in folders), "")

    def startable(self, name: str) -> bool:
        """Whether ``name`` is a profile or a registered model folder that can start here (what
        ``traylm start NAME`` takes)."""
        model = self.servable.get(name)
        known = self.profile(name) is not None or (
            model is not None and model.kind in ("profile", "folder") and model.engine_id == name
        )
        return known and not self.why_blocked(name)

    # ----------------------------------------------------------------- updates

    def on_message_received(self, message: object) -> None:
        if isinstance(message, ConnectionChanged):
            self._on_connection(message)
        elif isinstance(message, EnginesLoaded):
            self.engines = {e.engine_id: e for e in message.engines}
            self.engines_changed.emit()
        elif isinstance(message, ProfilesLoaded):
            self.profiles, self.broken_profiles = message.profiles, message.broken
            self.profiles_changed.emit()
        elif isinstance(message, SettingsLoaded):
            self.settings, self.docs = message.settings, message.docs
            self.settings_changed.emit()
        elif isinstance(message, StatusLoaded):
            self.status = message.status
            remote = message.status.get("remote")
            self._remote = from_plain(RemoteStatus, remote) if isinstance(remote, Mapping) else None
            self.boxes = boxes_of(message.status)
            self.box_replicas = box_replicas_of(message.status)
            self.status_changed.emit()
        elif isinstance(message, GatewayThroughput):
            self.throughput = message
            self.throughput_sampled.emit(message)
        elif isinstance(message, GPUsLoaded | EfficiencyLoaded):
            self.gpu.apply(message)
        elif isinstance(message, EnvsLoaded):
            self.envs = message.envs
            self.envs_changed.emit()
        elif isinstance(message, LibraryLoaded):
            self.cached_models, self.folders = message.cached, message.folders
            self.library_changed.emit()
        elif isinstance(message, ServableLoaded):
            by_name: dict[str, ServableModel] = {}
            for model in message.models:
                for name in (*model.names, model.name):
                    by_name.setdefault(name, model)
                by_name[model.engine_id] = model  # a profile's name is its engine id
            self.servable = MappingProxyType(by_name)
            self.servable_listed = True
            self.servable_changed.emit()
        elif isinstance(message, Event):
            install_changed = False
            if isinstance(message, EngineStateChanged):
                self._apply_engine_event(message)
            elif isinstance(message, EngineStartPhase):
                self._apply_phase_event(message)
            elif isinstance(message, _GPU_EVENTS):
                self.gpu.apply(message)
            elif isinstance(message, EnvInstallProgress):
                was_running = self.install is not None
                ended = message.phase in ("done", "failed", "cancelled")
                self.install = None if ended else message
                self.install_seen_s = time.monotonic()
                self.install_pace.feed(message)
                install_changed = was_running != (self.install is not None)
            self.event_received.emit(message)
            if install_changed:  # an install began or ended (not every line); after the event,
                self.envs_changed.emit()  # so that listeners know how it ended

    def _on_connection(self, message: ConnectionChanged) -> None:
        self.connection = message
        if not message.state.usable:
            self.throughput = None
            if self.engines:  # the daemon is gone: what it ran is unknown until it is back
                self.engines = {}
                self.engines_changed.emit()
            if self.gpu.overview is not None:
                self.gpu.clear("not connected to the daemon")
        self.connection_changed.emit(message)

    def _apply_engine_event(self, ev: EngineStateChanged) -> None:
        old = self.engines.get(ev.engine_id)
        if old is None:
            old = EngineStatus(
                ev.engine_id,
                ev.engine,
                ev.state,
                ev.served_names,
                ev.port,
                ev.pid,
                0,
                "",
                None,
                None,
                None,
                ev.engine_id,
                "",
                "",
            )
        self.engines[ev.engine_id] = dataclasses.replace(
            old,
            state=ev.state,
            served_names=ev.served_names or old.served_names,
            port=ev.port,
            pid=ev.pid,
            restarts=ev.restarts,
            detail=ev.detail,
            diagnosis=ev.diagnosis if ev.state == EngineState.FAILED else old.diagnosis,
        )
        self.engines_changed.emit()

    def _apply_phase_event(self, ev: EngineStartPhase) -> None:
        """A start moved to its next phase: the status's phase fields, as the daemon's own
        snapshot has them (the first phase begins a new launch's list)."""
        old = self.engines.get(ev.engine_id)
        if old is None:  # its state event comes next and reads the engine in (link.py)
            return
        done = old.phases if ev.previous else ()
        if done and done[-1].phase == ev.previous:
            last = done[-1]
            done = (*done[:-1], dataclasses.replace(last, duration_s=ev.previous_s))
        began = PhaseTime(phase=ev.phase, label=ev.label, started_s=ev.elapsed_s)
        self.engines[ev.engine_id] = dataclasses.replace(
            old,
            phase=ev.phase,
            phase_label=ev.label,
            phase_elapsed_s=ev.elapsed_s if ev.phase == "ready" else 0.0,
            phases=(*done, began),
        )
        self.engines_changed.emit()

    def set_local_streams(self, count: int) -> None:
        self.local_streams = count
        self.engines_changed.emit()  # the tray's busy state follows
