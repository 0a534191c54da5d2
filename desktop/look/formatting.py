"""How the dashboard writes sizes, rates, durations and counts (one place, the same everywhere)."""

from __future__ import annotations

import time


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "?"
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def fmt_rate(bytes_per_s: float) -> str:
    return f"{fmt_bytes(bytes_per_s)}/s" if bytes_per_s > 0 else "–"


def fmt_duration(seconds: float | None) -> str:
    if seconds is None or seconds < 0:
        return "–"
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def fmt_count(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def fmt_when(ts_s: float | None) -> str:
    if not ts_s:
        return "–"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts_s))


def fmt_ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1000:.1f}"
