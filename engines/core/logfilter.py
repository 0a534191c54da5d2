"""Repeated log lines are held back: a flood of one message (a client hammering the gateway, a
failing check every tick) must not rotate the daemon's log away.

``RepeatedLineFilter`` sits on the daemon's log handlers. Per distinct line (logger, level and
text) it lets ``burst`` through in each ``window_s``, then one more that says it is repeating,
and holds back the rest; the first time that line comes after the window it carries the count
held back. Lines are remembered for at most ``max_lines`` distinct texts.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass

_VERDICT = "traylm_repeat_verdict"


@dataclass
class _Seen:
    window_start_s: float
    count: int = 0
    held_back: int = 0


class RepeatedLineFilter(logging.Filter):
    def __init__(self, *, burst: int = 5, window_s: float = 60.0, max_lines: int = 1000) -> None:
        super().__init__()
        self.burst = burst
        self.window_s = window_s
        self.max_lines = max_lines
        self._seen: collections.OrderedDict[tuple[str, int, str], _Seen] = collections.OrderedDict()

    def filter(self, record: logging.LogRecord) -> bool:
        verdict = record.__dict__.get(_VERDICT)
        if verdict is None:  # once per record, however many handlers share this filter
            verdict = record.__dict__[_VERDICT] = self._decide(record)
        return bool(verdict)

    def _decide(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.levelno, record.getMessage())
        now = time.monotonic()
        seen = self._seen.get(key)
        if seen is None or now - seen.window_start_s >= self.window_s:
            held = seen.held_back if seen is not None else 0
            self._remember(key, _Seen(now, 1))
            if held:
                _append(record, f" ({held} identical lines held back before this one)")
            return True
        self._seen.move_to_end(key)
        seen.count += 1
        if seen.count <= self.burst:
            return True
        if seen.count == self.burst + 1:
            _append(record, f" (repeating: identical lines are held back for {self.window_s:g} s)")
            return True
        seen.held_back += 1
        return False

    def _remember(self, key: tuple[str, int, str], seen: _Seen) -> None:
        self._seen[key] = seen
        self._seen.move_to_end(key)
        while len(self._seen) > self.max_lines:
            self._seen.popitem(last=False)


def _append(record: logging.LogRecord, text: str) -> None:
    record.msg = record.getMessage() + text
    record.args = None
