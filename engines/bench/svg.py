"""Inline SVG charts for the benchmark report: no script, no web font, no network."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

COLORS = ("#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563")
WIDTH, HEIGHT = 640, 300
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 28, 48


@dataclass(frozen=True)
class Series:
    name: str
    xs: Sequence[float]
    ys: Sequence[float | None]


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high]."""
    if not math.isfinite(low) or not math.isfinite(high):
        return [0.0, 1.0]
    if high <= low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / max(1, count)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    ticks = [round(math.floor(low / step) * step, 10)]
    while ticks[-1] < high:
        ticks.append(round(ticks[-1] + step, 10))
    return ticks


def _fmt(value: float) -> str:
    if value == int(value) and abs(value) < 1e6:
        return f"{int(value):,}"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.0f}"
    if abs(value) >= 1:
        return f"{value:.1f}"
    return f"{value:.3g}"


def _frame(title: str, x_label: str, y_label: str, body: list[str]) -> str:
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{escape(title)}" '
        'font-family="sans-serif" font-size="11">',
        f'<text x="{WIDTH / 2}" y="16" text-anchor="middle" font-size="13" '
        f'font-weight="bold">{escape(title)}</text>',
        *body,
        f'<text x="{LEFT + (WIDTH - LEFT - RIGHT) / 2}" y="{HEIGHT - 8}" '
        f'text-anchor="middle">{escape(x_label)}</text>',
        f'<text x="14" y="{TOP + (HEIGHT - TOP - BOTTOM) / 2}" text-anchor="middle" '
        f'transform="rotate(-90 14 {TOP + (HEIGHT - TOP - BOTTOM) / 2})">{escape(y_label)}</text>',
        "</svg>",
    ]
    return "\n".join(parts)


def _y_axis(ticks: Sequence[float], y_of: Callable[[float], float]) -> list[str]:
    out = []
    for t in ticks:
        y = y_of(t)
        out.append(
            f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" stroke="#e5e7eb"/>'
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt(t)}</text>'
        )
    return out


def _legend(names: Sequence[str]) -> list[str]:
    out = []
    x = LEFT
    for i, name in enumerate(names):
        color = COLORS[i % len(COLORS)]
        out.append(
            f'<rect x="{x}" y="{TOP - 6}" width="10" height="10" fill="{color}"/>'
            f'<text x="{x + 14}" y="{TOP + 3}">{escape(name)}</text>'
        )
        x += 24 + 7 * len(name)
    return out


def line_chart(
    title: str,
    series: Sequence[Series],
    *,
    x_label: str,
    y_label: str,
    x_ticks: Sequence[float] | None = None,
    log_x: bool = False,
) -> str:
    """Lines with point markers; points whose y is None are left out. ``x_ticks``: label these
    x values (default: round numbers); ``log_x``: a logarithmic x axis (x > 0)."""
    points = [(x, y) for s in series for x, y in zip(s.xs, s.ys, strict=False) if y is not None]
    if not points:
        return _frame(title, x_label, y_label, ['<text x="50%" y="50%">no data</text>'])
    xs = [p[0] for p in points]
    y_ticks = nice_ticks(0.0, max(p[1] for p in points))
    log_x = log_x and min(xs) > 0
    scale: Callable[[float], float] = math.log if log_x else float
    x_low, x_high = scale(min(xs)), scale(max(xs))
    if x_high == x_low:
        x_low, x_high = x_low - 1, x_high + 1
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM - 12
    top = TOP + 12

    def x_of(x: float) -> float:
        return LEFT + (scale(x) - x_low) / (x_high - x_low) * plot_w

    def y_of(y: float) -> float:
        return top + plot_h - (y - y_ticks[0]) / (y_ticks[-1] - y_ticks[0]) * plot_h

    body = _y_axis(y_ticks, y_of)
    for x in x_ticks if x_ticks is not None else nice_ticks(min(xs), max(xs)):
        if x_low <= scale(x) <= x_high:
            body.append(
                f'<text x="{x_of(x):.1f}" y="{top + plot_h + 16}" '
                f'text-anchor="middle">{_fmt(x)}</text>'
            )
    for i, s in enumerate(series):
        color = COLORS[i % len(COLORS)]
        pts = [(x_of(x), y_of(y)) for x, y in zip(s.xs, s.ys, strict=False) if y is not None]
        if len(pts) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
            body.append(
                f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>'
            )
        if len(pts) <= 60:
            body.extend(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}"/>' for x, y in pts)
    body.extend(_legend([s.name for s in series]))
    return _frame(title, x_label, y_label, body)


def bar_chart(
    title: str,
    groups: Sequence[str],
    series: Sequence[tuple[str, Sequence[float | None]]],
    *,
    x_label: str,
    y_label: str,
) -> str:
    """Grouped bars: one group per entry of ``groups``, one bar per series in each."""
    values = [v for _, vs in series for v in vs if v is not None]
    if not values or not groups:
        return _frame(title, x_label, y_label, ['<text x="50%" y="50%">no data</text>'])
    y_ticks = nice_ticks(0.0, max(values))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM - 12
    top = TOP + 12

    def y_of(y: float) -> float:
        return top + plot_h - (y - y_ticks[0]) / (y_ticks[-1] - y_ticks[0]) * plot_h

    body = _y_axis(y_ticks, y_of)
    group_w = plot_w / len(groups)
    bar_w = group_w * 0.8 / max(1, len(series))
    for g, group in enumerate(groups):
        gx = LEFT + g * group_w
        body.append(
            f'<text x="{gx + group_w / 2:.1f}" y="{top + plot_h + 16}" '
            f'text-anchor="middle">{escape(group)}</text>'
        )
        for i, (_, vs) in enumerate(series):
            value = vs[g] if g < len(vs) else None
            if value is None:
                continue
            x = gx + group_w * 0.1 + i * bar_w
            y = y_of(value)
            body.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w * 0.9:.1f}" '
                f'height="{top + plot_h - y:.1f}" fill="{COLORS[i % len(COLORS)]}">'
                f"<title>{escape(_fmt(value))}</title></rect>"
            )
    body.extend(_legend([name for name, _ in series]))
    return _frame(title, x_label, y_label, body)
