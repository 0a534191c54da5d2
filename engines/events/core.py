"""Engine lifecycle, notices, the daemon stopping and engine-env installs: the events every
client reads (the tray, `traylm status`) and every part of the daemon may publish."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import ClassVar

from engines.events.codec import Event


class EngineState(enum.StrEnum):
    """Lifecycle of one engine process. Transitions: stopped → starting → ready → stopping →
    stopped; any state → failed; failed → starting on a (re)start."""

    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    FAILED = "failed"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Diagnosis:
    """A known failure recognised in an engine's log, with advice a person can act on."""

    code: str
    summary: str
    advice: str
    severity: str = "error"  # "error" (the engine will not run) | "warning" | "info" (benign)
    line: str = ""
    suggested: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class EngineStatus:
    """A snapshot of one managed engine, for the control API."""

    engine_id: str
    engine: str
    state: EngineState
    served_names: tuple[str, ...]
    port: int | None
    pid: int | None
    restarts: int
    detail: str
    diagnosis: Diagnosis | None
    started_at_s: float | None
    ready_at_s: float | None
    profile: str
    device: str
    version: str
    supervision: str = ""
    """What keeps the supervisor from watching the engine fully right now (it retries), or
    "" when nothing does."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineStateChanged(Event):
    kind: ClassVar[str] = "engine.state"
    engine_id: str
    state: EngineState
    previous: EngineState
    engine: str = ""
    served_names: tuple[str, ...] = ()
    port: int | None = None
    pid: int | None = None
    detail: str = ""
    restarts: int = 0
    diagnosis: Diagnosis | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineLogLine(Event):
    kind: ClassVar[str] = "engine.log"
    engine_id: str
    line: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineDiagnosed(Event):
    kind: ClassVar[str] = "engine.diagnosis"
    engine_id: str
    diagnosis: Diagnosis


@dataclasses.dataclass(frozen=True, kw_only=True)
class Notice(Event):
    """Something a person should see (a tray notification, a banner in the dashboard)."""

    kind: ClassVar[str] = "notice"
    level: str  # "info" | "warning" | "error"
    title: str
    message: str
    source: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class DaemonStopping(Event):
    kind: ClassVar[str] = "daemon.stopping"
    reason: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvInstallProgress(Event):
    """Progress of `traylm engines install` run by the daemon (phase: create, install, fix,
    probe, done, failed)."""

    kind: ClassVar[str] = "env.install"
    engine: str
    device: str
    phase: str
    line: str
    elapsed_s: float = 0.0
