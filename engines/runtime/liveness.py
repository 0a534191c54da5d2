"""Is a ready engine still alive and still making progress? The supervisor's verdict, from
evidence it gathers once a second (engines/runtime/watch.py):

- ``/health``: 200, another answer (vLLM says 503 once its engine core died), or none in time;
- progress: bytes of replies relayed by the gateway (runtime/traffic.py) and the engine's own
  Prometheus token counters (vLLM's prompt, generation and per-step token counts);
- signs of life: CPU time the engine's leader process used since the last look;
- processes of the engine that are stopped (SIGSTOP), which can neither serve nor shut down.

Verdicts: dead when ``/health`` failed twice in a row, where no answer in time counts only
when there is no progress and no sign of life either (a loaded machine answers /health slowly
while the engine produces tokens: that engine is healthy); hung when requests are in flight and
no token came for ``stall_timeout_s``; stopped when one of its processes stayed stopped for
``stopped_grace_s``. Pure logic: no I/O, no clock of its own.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

CPU_SIGN_OF_LIFE_S = 0.005
"""CPU seconds a leader must use between two looks to count as alive."""
TOKEN_COUNTERS: dict[str, tuple[str, ...]] = {
    # vllm/v1/metrics/loggers.py: Counters "vllm:prompt_tokens", "vllm:generation_tokens" and
    # the histogram "vllm:iteration_tokens_total" (prometheus_client appends _total/_count)
    "vllm": (
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:iteration_tokens_total_count",
    ),
    # sglang/srt/metrics/collector.py (TokenizerMetricsCollector), with --enable-metrics
    "sglang": ("sglang:prompt_tokens_total", "sglang:generation_tokens_total"),
    # tensorrt_llm/metrics/collector.py (MetricsCollector, prefix "trtllm_"), served on
    # /prometheus/metrics; its /metrics is a JSON route that drains the iteration stats
    "trtllm": ("trtllm_prompt_tokens_total", "trtllm_generation_tokens_total"),
}
"""Each engine's own Prometheus token counters, by engine name."""
GENERATION_COUNTER = {
    "vllm": "vllm:generation_tokens_total",
    "sglang": "sglang:generation_tokens_total",
    "trtllm": "trtllm_generation_tokens_total",
}
"""Each engine's counter of generated tokens (energy per token divides by it)."""
PROGRESS_COUNTERS = tuple(name for names in TOKEN_COUNTERS.values() for name in names)
"""Every engine's token counters (for a reader that does not know the engine)."""


class Health(enum.Enum):
    OK = "ok"  # 200
    BAD = "bad"  # answered, not 200
    SILENT = "silent"  # no answer in time (or the connection was refused)
    UNKNOWN = "unknown"  # the daemon could not ask (out of descriptors)


def progress_counter(metrics_text: str, engine: str = "") -> float | None:
    """The sum of the engine's token counters in Prometheus text, or None when it has none
    (an engine whose metrics say nothing about tokens). ``engine``: read only that engine's
    names (every engine's when unknown)."""
    names = TOKEN_COUNTERS.get(engine, PROGRESS_COUNTERS)
    total, found = 0.0, False
    for line in metrics_text.splitlines():
        if line.startswith(names):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in names:
                try:
                    total += float(line.rsplit(" ", 1)[1])
                except (ValueError, IndexError):
                    continue
                found = True
    return total if found else None


@dataclass
class Evidence:
    """One look at an engine (see the module docstring)."""

    now_s: float
    health: Health
    in_flight: int = 0
    streams: int = 0
    last_reply_byte_s: float = 0.0
    counters: float | None = None
    leader_cpu_s: float | None = None
    stopped: Iterable[int] = ()


@dataclass(frozen=True)
class Verdict:
    """Why a ready engine is done for: ``crashed`` (it died or /health failed) or ``hung``
    (no progress, or a stopped process)."""

    kind: str
    reason: str

    def __str__(self) -> str:
        return f"{self.kind} ({self.reason})"


@dataclass
class Liveness:
    """The verdict over successive looks at one life of an engine."""

    stall_timeout_s: float
    stopped_grace_s: float = 3.0
    failures: int = 0
    _last_look_s: float | None = None
    _last_cpu_s: float | None = None
    _last_counters: float | None = None
    _counters_seen: bool = False
    _counter_progress_s: float = 0.0
    _stopped_since_s: dict[int, float] = field(default_factory=dict)

    def wants_counters(self, now_s: float, *, in_flight: int, last_reply_byte_s: float) -> bool:
        """Read /metrics only when the relayed bytes do not already show progress."""
        return in_flight > 0 and now_s - last_reply_byte_s >= 1.5

    def look(self, e: Evidence) -> Verdict | None:
        """Why the engine is dead, hung or stopped, or None while it is fine."""
        previous_look = self._last_look_s if self._last_look_s is not None else e.now_s
        self._last_look_s = e.now_s
        stopped = self._stopped(e)
        if stopped:
            return Verdict("hung", stopped)
        progressed = self._counted(e) or e.last_reply_byte_s > previous_look
        alive = self._cpu_used(e)
        if e.health == Health.OK:
            self.failures = 0
        elif e.health == Health.BAD:
            self.failures += 1
        elif e.health == Health.SILENT:
            self.failures = 0 if progressed or alive else self.failures + 1
        if self.failures >= 2:
            if e.health == Health.BAD:
                return Verdict("crashed", "/health stopped answering 200 (engine core died)")
            return Verdict(
                "crashed", "/health did not answer twice, and the engine made no progress meanwhile"
            )
        stall = self._stall(e)
        return Verdict("hung", stall) if stall else None

    def _stopped(self, e: Evidence) -> str | None:
        now_stopped = set(e.stopped)
        for pid in list(self._stopped_since_s):
            if pid not in now_stopped:
                del self._stopped_since_s[pid]
        for pid in sorted(now_stopped):
            since = self._stopped_since_s.setdefault(pid, e.now_s)
            if e.now_s - since >= self.stopped_grace_s:
                return f"process {pid} is stopped (SIGSTOP)"
        return None

    def _counted(self, e: Evidence) -> bool:
        if e.counters is None:
            return False
        first = not self._counters_seen
        self._counters_seen = True
        moved = first or self._last_counters is None or e.counters > self._last_counters
        self._last_counters = e.counters
        if moved:
            self._counter_progress_s = e.now_s
        return moved and not first

    def _cpu_used(self, e: Evidence) -> bool:
        before, self._last_cpu_s = self._last_cpu_s, e.leader_cpu_s
        return (
            before is not None
            and e.leader_cpu_s is not None
            and e.leader_cpu_s - before >= CPU_SIGN_OF_LIFE_S
        )

    def _stall(self, e: Evidence) -> str | None:
        """Hung: requests in flight and no token for stall_timeout_s. Progress is known from
        the relayed bytes of streams, or from the engine's counters when it has them; a
        non-streamed request to an engine without counters cannot be judged."""
        if e.in_flight <= 0 or not (self._counters_seen or e.streams > 0):
            return None
        last = max(e.last_reply_byte_s, self._counter_progress_s if self._counters_seen else 0)
        quiet_s = e.now_s - last
        if quiet_s < self.stall_timeout_s:
            return None
        return (
            f"{e.in_flight} request(s) in flight and no token for {quiet_s:.0f} s "
            "(engines.stall_timeout_s)"
        )
