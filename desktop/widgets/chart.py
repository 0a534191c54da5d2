"""A small live line chart painted with QPainter (QtCharts is not part of PySide6-Essentials).

It keeps a fixed number of points per series and repaints only when a point arrives, so a
hidden chart costs nothing. The Engines page charts throughput; the GPU page temperatures, power
against its limit (a dashed series), fans, utilization, VRAM and clocks.
"""

from __future__ import annotations

import collections
import math

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QPainter, QPainterPath, QPaintEvent, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget


class LiveChart(QWidget):
    def __init__(
        self,
        title: str,
        unit: str,
        *,
        capacity: int = 120,
        minimum_max: float = 1.0,
        fixed_max: float | None = None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.title = title
        self.unit = unit
        self.capacity = capacity
        self.minimum_max = minimum_max
        self.fixed_max = fixed_max  # e.g. 100 for percentages: the scale never moves
        self.series: dict[str, collections.deque[float]] = {}
        self.colors: dict[str, QColor] = {}
        self.dashed: set[str] = set()
        self.setMinimumHeight(120)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)

    def add_series(self, name: str, color: str, *, dashed: bool = False) -> None:
        self.series[name] = collections.deque(maxlen=self.capacity)
        self.colors[name] = QColor(color)
        if dashed:
            self.dashed.add(name)

    def append(self, name: str, value: float) -> None:
        self.series[name].append(value)
        if self.isVisible():
            self.update()

    def set_values(self, name: str, values: list[float]) -> None:
        """Replace a series (history loaded when a page opens)."""
        self.series[name].clear()
        self.series[name].extend(values[-self.capacity :])
        if self.isVisible():
            self.update()

    def latest(self, name: str) -> float | None:
        values = self.series.get(name)
        return values[-1] if values else None

    def paintEvent(self, event: QPaintEvent) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        palette = self.palette()
        p.fillRect(self.rect(), palette.base())
        text_color = palette.text().color()
        area = QRectF(self.rect()).adjusted(44, 22, -10, -18)
        if self.fixed_max is not None:
            top = self.fixed_max
        else:
            top = max([self.minimum_max, *(max(s, default=0.0) for s in self.series.values())])
            top = _nice_ceiling(top)
        grid = QPen(palette.mid().color(), 1, Qt.PenStyle.DotLine)
        p.setPen(grid)
        for i in range(5):
            y = area.top() + area.height() * i / 4
            p.drawLine(QPointF(area.left(), y), QPointF(area.right(), y))
            p.setPen(text_color)
            p.drawText(
                QRectF(0, y - 8, 40, 16), Qt.AlignmentFlag.AlignRight, _fmt(top * (1 - i / 4))
            )
            p.setPen(grid)
        p.setPen(text_color)
        p.drawText(QRectF(6, 2, self.width() - 12, 18), Qt.AlignmentFlag.AlignLeft, self.title)
        right = self.width() - 6.0
        for name in reversed(self.series):  # the legend, right-aligned, each in its colour
            values = self.series[name]
            entry = f"{name}: {_fmt(values[-1]) if values else '–'} {self.unit}".rstrip()
            width = p.fontMetrics().horizontalAdvance(entry)
            p.setPen(self.colors[name] if len(self.series) > 1 else text_color)
            p.drawText(QRectF(right - width, 2, width + 1, 18), Qt.AlignmentFlag.AlignLeft, entry)
            right -= width + 14
        step = area.width() / max(self.capacity - 1, 1)
        for name, values in self.series.items():
            if len(values) < 2:
                continue
            path = QPainterPath()
            offset = self.capacity - len(values)
            for i, value in enumerate(values):
                point = QPointF(
                    area.left() + (offset + i) * step,
                    area.bottom() - area.height() * min(value / top, 1.0),
                )
                if i == 0:
                    path.moveTo(point)
                else:
                    path.lineTo(point)
            style = Qt.PenStyle.DashLine if name in self.dashed else Qt.PenStyle.SolidLine
            p.setPen(QPen(self.colors[name], 2, style))
            p.drawPath(path)
        p.end()


def _nice_ceiling(value: float) -> float:
    if value <= 0:
        return 1.0
    exponent = math.floor(math.log10(value))
    base = 10**exponent
    for step in (1, 2, 4, 8, 10):  # quarters of these read as round numbers
        if value <= step * base:
            return float(step * base)
    return float(10 * base)


def _fmt(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 10 or value == 0 else f"{value:.1f}"
