"""Start phases: which engine log line means that a start moved on to its next phase.

Pure data and matching, like the diagnosis rules: an adapter lists its phases in the order an
engine goes through them; the supervisor feeds log lines and times the phases.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PhaseRule:
    """One phase of a start and the log line that begins it."""

    phase: str
    """Stable code: import, config, engine, weights, compile, kv_cache, warmup, graphs, server."""
    label: str
    """The phase in words, for a progress line ("loading weights")."""
    pattern: re.Pattern[str] | None
    """A line matching this begins the phase; None for the phase a launch begins in."""
    after: str = ""
    """A phase the start must have reached before this one's line counts: an engine prints
    some lines early too (vLLM's memory profile captures CUDA graphs before the KV cache)."""


READY = PhaseRule("ready", "ready", None)
"""The last phase of every start; the readiness probe (not a log line) enters it."""


def next_phase(rules: Sequence[PhaseRule], line: str, current: int) -> int | None:
    """Index of the phase ``line`` begins, when that phase comes after ``current``.

    Phases only move forward: an engine repeats some lines in later phases (compile lines
    while warming up other batch sizes), which must not send a progress bar back. A rule with
    ``after`` counts only once the start has reached that phase."""
    reached = {rule.phase for rule in rules[: current + 1]}
    for index in range(len(rules) - 1, current, -1):
        rule = rules[index]
        if rule.after and rule.after not in reached:
            continue
        if rule.pattern is not None and rule.pattern.search(line):
            return index
    return None
