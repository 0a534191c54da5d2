"""A fan-curve editor: points (°C → %) on a chart that you drag with the mouse.

Drag a point to move it (it stays between its neighbours' temperatures); double-click an empty
spot to add a point; right-click a point to remove it (two stay at least). Below the first point
the fans go back to the firmware, which the chart shades. The card's fan floor is shaded too, so
a point dragged under it is visibly wrong before the daemon says so. The widget only edits
points; whether the curve is valid is the daemon's call (a dry run), shown beside it.
"""

from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QColor, QMouseEvent, QPainter, QPainterPath, QPaintEvent, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget

T_MIN_C, T_MAX_C = 20.0, 105.0
MAX_POINTS = 16
GRAB_PX = 12.0
Point = tuple[float, float]


class CurveEditor(QWidget):
    curve_edited = Signal(object)  # tuple[Point, ...] after each drag, add or remove

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.points: list[Point] = [(40.0, 30.0), (80.0, 100.0)]
        self.floor_pct: float | None = None
        self.temperature_c: float | None = None  # live marker
        self.duty_pct: float | None = None
        self.dragging: int | None = None
        self.setMinimumSize(420, 240)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        self.setMouseTracking(False)
        self.setToolTip(
            "Drag a point to move it · double-click to add a point · right-click a point to "
            "remove it"
        )

    # ----------------------------------------------------------------- model

    def set_points(self, points: tuple[Point, ...] | list[Point]) -> None:
        self.points = sorted((float(t), float(d)) for t, d in points)
        self.dragging = None
        self.update()

    def curve_points(self) -> tuple[Point, ...]:
        return tuple(self.points)

    def set_live(self, temperature_c: float | None, duty_pct: float | None) -> None:
        if (temperature_c, duty_pct) != (self.temperature_c, self.duty_pct):
            self.temperature_c, self.duty_pct = temperature_c, duty_pct
            self.update()

    # ----------------------------------------------------------------- geometry

    def plot_rect(self) -> QRectF:
        return QRectF(self.rect()).adjusted(46, 26, -16, -34)

    def to_pixel(self, point: Point) -> QPointF:
        r = self.plot_rect()
        t, d = point
        x = r.left() + (t - T_MIN_C) / (T_MAX_C - T_MIN_C) * r.width()
        y = r.bottom() - d / 100 * r.height()
        return QPointF(x, y)

    def to_value(self, pos: QPointF) -> Point:
        r = self.plot_rect()
        t = T_MIN_C + (pos.x() - r.left()) / max(r.width(), 1) * (T_MAX_C - T_MIN_C)
        d = (r.bottom() - pos.y()) / max(r.height(), 1) * 100
        return (round(min(T_MAX_C, max(T_MIN_C, t))), round(min(100.0, max(0.0, d))))

    def point_at(self, pos: QPointF) -> int | None:
        best, best_px = None, GRAB_PX
        for i, point in enumerate(self.points):
            px = self.to_pixel(point)
            dist = ((px.x() - pos.x()) ** 2 + (px.y() - pos.y()) ** 2) ** 0.5
            if dist <= best_px:
                best, best_px = i, dist
        return best

    # ----------------------------------------------------------------- mouse

    def mousePressEvent(self, event: QMouseEvent) -> None:
        index = self.point_at(event.position())
        if event.button() == Qt.MouseButton.LeftButton and index is not None:
            self.dragging = index
        elif (
            event.button() == Qt.MouseButton.RightButton
            and index is not None
            and len(self.points) > 2
        ):
            del self.points[index]
            self.update()
            self.curve_edited.emit(self.curve_points())

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        if self.dragging is None:
            return
        i = self.dragging
        t, d = self.to_value(event.position())
        lo = self.points[i - 1][0] + 1 if i > 0 else T_MIN_C
        hi = self.points[i + 1][0] - 1 if i + 1 < len(self.points) else T_MAX_C
        self.points[i] = (min(hi, max(lo, t)), d)
        self.update()

    def mouseReleaseEvent(self, event: QMouseEvent) -> None:
        if self.dragging is not None:
            self.mouseMoveEvent(event)
            self.dragging = None
            self.curve_edited.emit(self.curve_points())

    def mouseDoubleClickEvent(self, event: QMouseEvent) -> None:
        if self.point_at(event.position()) is not None or len(self.points) >= MAX_POINTS:
            return
        t, d = self.to_value(event.position())
        if any(t == pt for pt, _ in self.points):
            return
        self.points = sorted([*self.points, (t, d)])
        self.update()
        self.curve_edited.emit(self.curve_points())

    # ----------------------------------------------------------------- painting

    def paintEvent(self, event: QPaintEvent) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        pal = self.palette()
        p.fillRect(self.rect(), pal.base())
        r = self.plot_rect()
        self._paint_shading(p, r)
        self._paint_grid(p, r)
        self._paint_curve(p, r)
        self._paint_live(p, r)
        p.end()

    def _paint_shading(self, p: QPainter, r: QRectF) -> None:
        if self.points:
            first = self.to_pixel(self.points[0])
            firmware = QRectF(r.left(), r.top(), max(0.0, first.x() - r.left()), r.height())
            p.fillRect(firmware, QColor(127, 127, 127, 40))
            if firmware.width() > 40:  # the words sit mid-height, clear of the live label
                p.setPen(self.palette().placeholderText().color())
                middle = QRectF(r.left() + 3, r.top() + r.height() * 0.35, 200, 36)
                p.drawText(middle, Qt.AlignmentFlag.AlignLeft, "firmware\ncontrol")
        if self.floor_pct:
            y = self.to_pixel((T_MIN_C, self.floor_pct)).y()
            p.fillRect(QRectF(r.left(), y, r.width(), r.bottom() - y), QColor(214, 40, 40, 28))
            p.setPen(QColor("#d62828"))
            p.drawText(
                QRectF(r.right() - 220, y - 16, 216, 16),
                Qt.AlignmentFlag.AlignRight,
                f"fan floor {self.floor_pct:.0f} %",
            )

    def _paint_grid(self, p: QPainter, r: QRectF) -> None:
        text = self.palette().text().color()
        grid = QPen(self.palette().mid().color(), 1, Qt.PenStyle.DotLine)
        for pct in range(0, 101, 20):
            y = self.to_pixel((T_MIN_C, pct)).y()
            p.setPen(grid)
            p.drawLine(QPointF(r.left(), y), QPointF(r.right(), y))
            p.setPen(text)
            p.drawText(QRectF(0, y - 8, 40, 16), Qt.AlignmentFlag.AlignRight, f"{pct} %")
        for t in range(20, 101, 10):
            x = self.to_pixel((t, 0)).x()
            p.setPen(grid)
            p.drawLine(QPointF(x, r.top()), QPointF(x, r.bottom()))
            p.setPen(text)
            p.drawText(QRectF(x - 20, r.bottom() + 4, 40, 14), Qt.AlignmentFlag.AlignCenter, f"{t}")
        p.drawText(
            QRectF(r.left(), r.bottom() + 17, r.width(), 14),
            Qt.AlignmentFlag.AlignCenter,
            "GPU temperature (°C)",
        )

    def _paint_curve(self, p: QPainter, r: QRectF) -> None:
        if not self.points:
            return
        path = QPainterPath()
        pixels = [self.to_pixel(pt) for pt in self.points]
        path.moveTo(pixels[0])
        for px in pixels[1:]:
            path.lineTo(px)
        path.lineTo(QPointF(r.right(), pixels[-1].y()))  # the last duty holds above it
        p.setPen(QPen(QColor("#1971c2"), 2.5))
        p.drawPath(path)
        for i, (px, (t, d)) in enumerate(zip(pixels, self.points, strict=True)):
            active = i == self.dragging
            p.setPen(QPen(QColor("#0b4f8a"), 2))
            p.setBrush(QColor("#f59f00") if active else QColor("#1971c2"))
            p.drawEllipse(px, 7 if active else 5.5, 7 if active else 5.5)
            p.setBrush(Qt.BrushStyle.NoBrush)
            p.setPen(self.palette().text().color())
            # below-right of the point: the curve rises to the right, so that corner is free
            label = QRectF(min(px.x() + 8, r.right() - 70), px.y() + 4, 70, 14)
            p.drawText(label, Qt.AlignmentFlag.AlignLeft, f"{t:.0f}°→{d:.0f}%")

    def _paint_live(self, p: QPainter, r: QRectF) -> None:
        if self.temperature_c is None:
            return
        x = self.to_pixel((min(T_MAX_C, max(T_MIN_C, self.temperature_c)), 0)).x()
        p.setPen(QPen(QColor("#d9480f"), 1.5, Qt.PenStyle.DashLine))
        p.drawLine(QPointF(x, r.top()), QPointF(x, r.bottom()))
        label = f"now {self.temperature_c:.0f} °C"
        if self.duty_pct is not None:
            y = self.to_pixel((T_MIN_C, self.duty_pct)).y()
            p.setBrush(QColor("#d9480f"))
            p.drawEllipse(QPointF(x, y), 4, 4)
            p.setBrush(Qt.BrushStyle.NoBrush)
            label += f", fans {self.duty_pct:.0f} %"
        p.setPen(QColor("#d9480f"))
        left = min(x - 4, r.right() - 200)  # in the margin above the plot
        p.drawText(QRectF(left, r.top() - 22, 200, 14), Qt.AlignmentFlag.AlignLeft, label)
