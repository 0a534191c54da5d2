"""Tokens per second and requests in flight from the gateway's Prometheus text.

The gateway counts generated tokens per model (``traylm_generation_tokens_total``) when a
request ends; the rate is the counter's growth over a short window of samples.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Mapping
from types import MappingProxyType

from desktop.messages import ThroughputSampled

_SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

TOKENS = "traylm_generation_tokens_total"
IN_FLIGHT = "traylm_requests_in_flight"


def parse_samples(text: str, names: frozenset[str]) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of each sample line whose metric is in ``names``."""
    out: list[tuple[str, dict[str, str], float]] = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE_RE.match(line)
        if m is None or m.group(1) not in names:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = dict(_LABEL_RE.findall(m.group(2) or ""))
        out.append((m.group(1), labels, value))
    return out


class ThroughputMeter:
    """Keeps the last ``window_s`` seconds of token counters and turns them into rates."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._samples: collections.deque[tuple[float, Mapping[str, float]]] = collections.deque()

    def add(self, text: str, now_s: float) -> ThroughputSampled:
        totals: dict[str, float] = {}
        in_flight = 0.0
        for name, labels, value in parse_samples(text, frozenset({TOKENS, IN_FLIGHT})):
            if name == TOKENS:
                model = labels.get("model", "")
                totals[model] = totals.get(model, 0.0) + value
            else:
                in_flight += value
        self._samples.append((now_s, totals))
        while len(self._samples) > 2 and now_s - self._samples[1][0] >= self.window_s:
            self._samples.popleft()
        first_s, first = self._samples[0]
        elapsed_s = now_s - first_s
        per_model: dict[str, float] = {}
        if elapsed_s > 0:
            for model, total in totals.items():
                grown = total - first.get(model, 0.0)
                if grown > 0:
                    per_model[model] = grown / elapsed_s
        return ThroughputSampled(
            tokens_per_s=sum(per_model.values()),
            per_model=MappingProxyType(per_model),
            in_flight=int(in_flight),
            ts_s=now_s,
        )

    def reset(self) -> None:
        self._samples.clear()
