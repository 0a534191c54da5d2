"""The guarded engine upgrade (engines/upgrade/, `traylm engines upgrade ENGINE`,
/api/upgrade): what to upgrade, its progress, and its outcome.

An upgrade installs the new version beside the one in use, held back, measures one profile on
both with the tuner (``tune``: the two-row tune job, its noise bands), and lets profiles that do
not name a version move to it only when no pinned figure got worse by more than the limit.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import ClassVar

from engines.events.codec import Event
from engines.events.tune import TuneJob


class UpgradeState(enum.StrEnum):
    RUNNING = "running"
    SWITCHED = "switched"  # the new version is the default now
    KEPT = "kept"  # the new version was refused (worse, failed to install or to start)
    CURRENT = "current"  # nothing newer to upgrade to
    FAILED = "failed"  # the comparison could not be made (the profile itself failed...)
    CANCELLED = "cancelled"


@dataclasses.dataclass(frozen=True, kw_only=True)
class UpgradeConfig:
    """Which engine to upgrade, to what, and the workload that judges it."""

    engine: str  # vllm | sglang | trtllm
    device: str = "auto"  # cpu | cuda | auto (cuda where an NVIDIA driver is)
    version: str = ""  # the version to try; "": the newest the package index has
    model: str = ""  # the profile measured; "": the one running, else the first using it
    workload: str = ""  # a tuner preset or "file"; "": the last tune's file of it, else chat
    workload_file: str = ""  # file: an export of `traylm requests export`
    budget_s: float = 1200.0  # the measurement (the install is not counted)
    repeat: int = 2  # measurements of each version, interleaved
    requests: int = 0  # measured requests per run; 0: the preset's
    concurrency: int = 0  # most requests in flight; 0: the preset's


@dataclasses.dataclass(frozen=True, kw_only=True)
class UpgradeJob:
    """One guarded upgrade (GET /api/upgrade)."""

    id: int
    config: UpgradeConfig
    state: UpgradeState
    engine: str = ""
    device: str = ""
    old_version: str = ""  # the version in use when it began
    new_version: str = ""
    profile: str = ""  # the profile measured on both
    workload: str = ""  # in words: "preset chat", "FILE (recorded)"
    started_s: float = 0.0
    finished_s: float | None = None
    tune: TuneJob | None = None  # the comparison: rows "default" (old) and the new version
    changes: Mapping[str, float] = dataclasses.field(default_factory=dict)  # new / old
    worse: tuple[str, ...] = ()  # each pinned figure that got worse past the limit, in words
    detail: str = ""  # the outcome in words


@dataclasses.dataclass(frozen=True, kw_only=True)
class UpgradeProgress(Event):
    """A running upgrade at each step (phase: install, measure, decide); the install's own
    lines come as env.install events, the measurement's as tune.progress."""

    kind: ClassVar[str] = "upgrade.progress"
    job_id: int
    phase: str
    detail: str = ""
    elapsed_s: float = 0.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class UpgradeFinished(Event):
    """An upgrade ended; read it with GET /api/upgrade."""

    kind: ClassVar[str] = "upgrade.finished"
    job_id: int
    state: UpgradeState
    detail: str = ""
