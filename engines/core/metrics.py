"""Prometheus text exposition without a dependency: counters, gauges and histograms.

Other parts of the daemon (GPU sampler, hub) add their own metrics with ``registry.collector``:
a callable that returns exposition lines at scrape time.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Sequence

Labels = tuple[tuple[str, str], ...]


def fmt_labels(labels: Labels) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def fmt_number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class Counter:
    def __init__(self, name: str, help_text: str) -> None:
        self.name, self.help = name, help_text
        self.values: dict[Labels, float] = {}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        self.values[key] = self.values.get(key, 0.0) + amount

    def expose(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} counter"
        for labels, value in sorted(self.values.items()):
            yield f"{self.name}{fmt_labels(labels)} {fmt_number(value)}"


class Gauge:
    def __init__(self, name: str, help_text: str, fn: Callable[[], dict[Labels, float]]) -> None:
        self.name, self.help, self.fn = name, help_text, fn

    def expose(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} gauge"
        for labels, value in sorted(self.fn().items()):
            yield f"{self.name}{fmt_labels(labels)} {fmt_number(value)}"


class Histogram:
    def __init__(self, name: str, help_text: str, buckets: Sequence[float]) -> None:
        self.name, self.help = name, help_text
        self.buckets = tuple(sorted(buckets))
        self.series: dict[Labels, list[float]] = {}  # bucket counts..., sum, count

    def observe(self, value: float, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        row = self.series.get(key)
        if row is None:
            row = self.series[key] = [0.0] * (len(self.buckets) + 2)
        index = bisect.bisect_left(self.buckets, value)
        if index < len(self.buckets):  # above the last bound only +Inf (the count) holds it
            row[index] += 1
        row[-2] += value
        row[-1] += 1

    def expose(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} histogram"
        for labels, row in sorted(self.series.items()):
            cumulative = 0.0
            for bound, count in zip(self.buckets, row, strict=False):
                cumulative += count
                lab = fmt_labels((*labels, ("le", fmt_number(bound))))
                yield f"{self.name}_bucket{lab} {fmt_number(cumulative)}"
            yield f"{self.name}_bucket{fmt_labels((*labels, ('le', '+Inf')))} {fmt_number(row[-1])}"
            yield f"{self.name}_sum{fmt_labels(labels)} {fmt_number(row[-2])}"
            yield f"{self.name}_count{fmt_labels(labels)} {fmt_number(row[-1])}"


LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class MetricsRegistry:
    def __init__(self) -> None:
        self._metrics: list[Counter | Gauge | Histogram] = []
        self._collectors: list[Callable[[], Iterable[str]]] = []

    def counter(self, name: str, help_text: str) -> Counter:
        metric = Counter(name, help_text)
        self._metrics.append(metric)
        return metric

    def gauge(self, name: str, help_text: str, fn: Callable[[], dict[Labels, float]]) -> Gauge:
        metric = Gauge(name, help_text, fn)
        self._metrics.append(metric)
        return metric

    def histogram(
        self, name: str, help_text: str, buckets: Sequence[float] = LATENCY_BUCKETS_S
    ) -> Histogram:
        metric = Histogram(name, help_text, buckets)
        self._metrics.append(metric)
        return metric

    def collector(self, fn: Callable[[], Iterable[str]]) -> None:
        self._collectors.append(fn)

    def render(self) -> str:
        lines: list[str] = []
        for metric in self._metrics:
            lines.extend(metric.expose())
        for fn in self._collectors:
            lines.extend(fn())
        return "\n".join(lines) + "\n"
