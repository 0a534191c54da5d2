"""Times the phases of one engine start from its log lines (the supervisor publishes them).

The adapter's phase rules say which line begins which phase; this keeps the clock: when each
phase began, counted from the spawn, how long the finished ones took, and what a status
snapshot shows now ("loading weights" for 12 s).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from engines.events.core import EngineStartPhase, PhaseTime
from engines.runtime.adapters.phases import READY, PhaseRule, next_phase


class PhaseTracker:
    """The phases of one launch. Without rules (an engine whose log traylm cannot read), only
    ``ready`` is recorded."""

    def __init__(
        self,
        engine_id: str,
        rules: Sequence[PhaseRule] = (),
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine_id = engine_id
        self._rules = tuple(r for r in rules if r.phase != READY.phase)
        self._clock = clock
        self._spawned_s: float | None = None
        self._index = -1
        self._times: list[PhaseTime] = []

    def begin(self) -> EngineStartPhase | None:
        """The process was spawned: the first phase starts now."""
        self._spawned_s = self._clock()
        self._index = -1
        self._times = []
        if not self._rules:
            return None
        return self._enter(0, self._rules[0], "")

    def feed(self, line: str) -> EngineStartPhase | None:
        """A log line; returns the event when it begins a later phase."""
        if self._spawned_s is None or self._index < 0 or self.finished:
            return None
        index = next_phase(self._rules, line, self._index)
        if index is None:
            return None
        return self._enter(index, self._rules[index], line.strip()[:300])

    def ready(self) -> EngineStartPhase | None:
        """The readiness probe passed: close the last phase."""
        if self._spawned_s is None or self.finished:
            return None
        return self._enter(len(self._rules), READY, "")

    @property
    def finished(self) -> bool:
        return bool(self._times) and self._times[-1].phase == READY.phase

    def current(self) -> tuple[str, str, float]:
        """(phase, label, seconds in it so far); ("", "", 0) before a spawn. Once ready, the
        seconds are the whole start."""
        if not self._times or self._spawned_s is None:
            return "", "", 0.0
        last = self._times[-1]
        if last.phase == READY.phase:
            return last.phase, last.label, last.started_s
        return last.phase, last.label, max(0.0, self._elapsed() - last.started_s)

    def times(self) -> tuple[PhaseTime, ...]:
        return tuple(self._times)

    def _elapsed(self) -> float:
        assert self._spawned_s is not None
        return self._clock() - self._spawned_s

    def _enter(self, index: int, rule: PhaseRule, line: str) -> EngineStartPhase:
        now = round(self._elapsed(), 3)
        previous, previous_s = "", 0.0
        if self._times:
            last = self._times[-1]
            previous, previous_s = last.phase, round(now - last.started_s, 3)
            self._times[-1] = PhaseTime(
                phase=last.phase, label=last.label, started_s=last.started_s, duration_s=previous_s
            )
        self._times.append(PhaseTime(phase=rule.phase, label=rule.label, started_s=now))
        self._index = index
        return EngineStartPhase(
            engine_id=self.engine_id,
            phase=rule.phase,
            label=rule.label,
            elapsed_s=now,
            previous=previous,
            previous_s=previous_s,
            line=line,
        )
