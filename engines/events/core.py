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
    stopped; any state → failed; failed → starting on a (re)start; ready ⇄ sleeping (vLLM sleep
    mode: the process lives, its GPU memory is freed, nothing is routed to it)."""

    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    SLEEPING = "sleeping"
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class PhaseTime:
    """One phase of an engine start: when it began, counted from the spawn, and how long it
    took (None while it is still running)."""

    phase: str
    label: str
    started_s: float
    duration_s: float | None = None


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
    phase: str = ""
    """The start phase (import, config, engine, weights, compile, kv_cache, warmup, graphs,
    server, ready) of the last launch; "" before the first spawn and for engines without phase
    rules."""
    phase_label: str = ""
    """The phase in words, for a progress line: "loading weights"."""
    phase_elapsed_s: float = 0.0
    """How long the current phase has run at this snapshot (its final length once ready)."""
    phases: tuple[PhaseTime, ...] = ()
    """Every phase of the last launch so far, in order."""
    gpus: tuple[int, ...] = ()
    """The CUDA GPUs it runs on (empty on the CPU)."""

    @property
    def stage(self) -> str:
        """What a starting engine does now, in words: its start phase ("loading weights"),
        else why it is starting ("launching", "crashed; restart 1/3 in 2 s"); "" in other
        states. The one wording of the tray, the dashboard, the chat and `traylm load`."""
        if self.state != EngineState.STARTING:
            return ""
        if self.phase_label and self.phase != "ready":  # (ready: the last launch's)
            return self.phase_label
        return self.detail


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
class EngineStartPhase(Event):
    """An engine start moved to its next phase (recognised in the engine's log by the adapter's
    phase rules; ``ready`` comes from the readiness probe). Times count from the spawn."""

    kind: ClassVar[str] = "engine.phase"
    engine_id: str
    phase: str
    label: str
    elapsed_s: float
    """Seconds from the spawn to the start of this phase."""
    previous: str = ""
    previous_s: float = 0.0
    """How long the previous phase took."""
    line: str = ""
    """The log line that marked the change ("" for the first phase and for ready)."""


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
    close_apps: bool = False
    """The person stopped traylm as a whole (`traylm shutdown`): window apps close too."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvInstallProgress(Event):
    """Progress of `traylm engines install` run by the daemon (phase: create, install, fix,
    probe, done, failed, cancelled). While pip runs, ``step`` says what it does (resolving,
    downloading, installing) and the byte counts how far the downloads are
    (engines/envs/pip_progress.py); ``line`` is then "" for a progress-only update."""

    kind: ClassVar[str] = "env.install"
    engine: str
    device: str
    phase: str
    line: str
    elapsed_s: float = 0.0
    step: str = ""
    package: str = ""  # the file pip fetches (or the package it resolves) now
    done_bytes: int = 0  # downloaded so far, every file together
    file_done_bytes: int = 0
    file_total_bytes: int = 0  # the current file's size (0: not known)
