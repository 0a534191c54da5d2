"""The tuner (engines/tune/, `traylm tune MODEL`, /api/tune): what to tune for, its progress,
and its result, this machine's table of candidates.

Figures are keyed by metric name (``engines.tune.figures.FIGURES``): a figure that could not be
measured (no GPU telemetry on the CPU) is absent, not zero. ``band`` is each figure's noise band
over the repeats, relative to the mean (0.04: ±4 %); a candidate is better or worse than the
default only outside both of their bands.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import ClassVar

from engines.events.codec import Event


class TuneState(enum.StrEnum):
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"  # the daemon was killed mid-tune (said at its next start)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TuneConfig:
    """What to tune, against what traffic, for which goal, within which time."""

    model: str  # a profile name, or a name a profile serves
    workload: str = "chat"  # a preset (chat | rag | agent | batch) or "file"
    workload_file: str = ""  # file: an export of `traylm requests export`
    goal: str = "throughput"  # latency | throughput | efficiency | quiet
    budget_s: float = 1200.0  # the whole run, candidate starts included
    repeat: int = 2  # measurements of each candidate, interleaved (A B A B)
    apply: bool = False  # write the recommended profile at the end (the old one is kept)
    requests: int = 0  # measured requests per run; 0: the preset's
    concurrency: int = 0  # most requests in flight; 0: the preset's
    only: tuple[str, ...] = ()  # candidate keys to try (the default always runs); (): all


@dataclasses.dataclass(frozen=True, kw_only=True)
class TuneMeasure:
    """One measurement of one candidate: its start, then one bench run of the workload."""

    candidate: str
    round: int  # 0-based repetition
    bench_run_id: int | None = None
    cold_start_s: float | None = None
    figures: Mapping[str, float] = dataclasses.field(default_factory=dict)
    error: str = ""  # why it has no figures (a crash, a refused flag)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TuneRow:
    """One candidate over its repeats (means), compared with the default."""

    key: str
    label: str
    changes: tuple[str, ...]  # the profile overrides, as the user would write them
    runs: int
    figures: Mapping[str, float] = dataclasses.field(default_factory=dict)
    band: Mapping[str, float] = dataclasses.field(default_factory=dict)
    spread: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Each figure's measured spread over the runs (half their range, relative to the mean,
    with no floor: what the runs really did); absent after one run. ``band`` is the same with
    the verdict's least assumed noise (2 %)."""
    ratios: Mapping[str, float] = dataclasses.field(default_factory=dict)  # / the default
    verdict: str = ""  # default | better | worse | mixed | within noise | failed
    pareto: bool = False
    cost_per_100m: float | None = None  # electricity, in the settings' currency
    error: str = ""

    def figure_text(self, key: str, digits: int, *, sep: str = " ", missing: str = "-") -> str:
        """ "1234.5 ±3%" (the mean over the runs, ``sep``, their measured spread), "1234.5 one
        run: no spread" after one run, ``missing`` when the figure was not measured: as `traylm
        tune`, its report and the dashboard's Tune page show it."""
        value = self.figures.get(key)
        if value is None:
            return missing
        spread = self.spread.get(key)
        if spread is not None:
            return f"{value:.{digits}f}{sep}±{spread * 100:.0f}%"
        return f"{value:.{digits}f}" + (f"{sep}one run: no spread" if self.runs == 1 else "")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TuneJob:
    """One tuning run (GET /api/tune)."""

    id: int
    config: TuneConfig
    state: TuneState
    profile: str = ""  # the profile being tuned
    started_s: float = 0.0
    finished_s: float | None = None
    concurrency: int = 0
    rows: tuple[TuneRow, ...] = ()
    measures: tuple[TuneMeasure, ...] = ()
    dropped: tuple[str, ...] = ()  # "candidate: why" for each one not measured
    planned: int = 0  # measurements planned now (TuneProgress.steps): the one count said
    recommended: str = ""  # a row key, "" when the default stays best
    recommendation: str = ""  # in words
    applied: bool = False
    currency: str = ""
    simulated: bool = False  # GPU telemetry from simulated GPUs
    detail: str = ""  # the error of a failed run, or what a cancel restored


TUNER_ENGINE_PREFIX = "tune-"
"""The candidates' engine ids: ``tune-<profile>`` (engines/tune/candidates.py engine_id), their
replicas ``tune-<profile>.r2``..."""


def tuner_engine(engine_id: str) -> bool:
    """Whether ``engine_id`` is one the tuner started for a measurement (not the user's: the
    app does not announce it, and it is gone when the tune ends)."""
    return engine_id == "tune" or engine_id.startswith(TUNER_ENGINE_PREFIX)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TuneProgress(Event):
    """A running tune: at each step (a candidate starting, measured, the restore)."""

    kind: ClassVar[str] = "tune.progress"
    job_id: int
    phase: str  # plan | start | measure | measured (a row changed: GET /api/tune) | restore
    candidate: str = ""
    round: int = 0
    step: int = 0  # measurements done
    steps: int = 0  # measurements planned
    elapsed_s: float = 0.0
    budget_s: float = 0.0
    detail: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class TuneFinished(Event):
    """A tune ended (done, failed or cancelled); read it with GET /api/tune."""

    kind: ClassVar[str] = "tune.finished"
    job_id: int
    state: TuneState
    detail: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class TuneTarget:
    """Something `traylm tune NAME` takes (GET /api/tune/targets): a profile, a registered
    model folder or a downloaded model, as the servable list has it."""

    name: str  # what TuneConfig.model takes: the profile's or folder's name, the engine id
    kind: str  # profile | folder | library
    served_name: str  # the name requests send it by
    model: str  # repo id or folder
    loaded: bool = False  # an engine of it is ready now
    blocked: str = ""  # why it cannot start on this computer ("" when it can)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TuneBudget:
    """The least budget a tune of a model needs here (GET /api/tune/budget)."""

    model: str
    repeat: int
    least_budget_s: float
    words: str  # "the smallest budget that fits 2 candidates is 8 min"
