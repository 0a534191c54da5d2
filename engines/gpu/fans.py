"""Fan-curve maths: validation, interpolation, presets, and the per-fan controller.

A curve is points (°C → %) with linear interpolation, clamped to the first and last point's duty.
``FanController`` turns temperatures into commands for one fan:

- rising temperature: react at once;
- falling: keep the duty until the temperature is ``hysteresis_c`` below the temperature that set
  it, then wait ``spin_down_delay_s`` before lowering;
- changes smaller than ``min_step_pct`` are skipped (no hunting);
- below the first point (minus hysteresis): hand the fan back to the firmware, which keeps its
  0 RPM idle behaviour, rather than run it under the card's minimum;
- a missing temperature reads as hot: the curve's top duty, never cold;
- duties are clamped to the card's reported fan min/max.
"""

from __future__ import annotations

import itertools
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engines.config.sections import resources_dir
from engines.errors import ConfigError, TraylmError
from engines.events.gpu import FanCurve, GPUInfo

MAX_POINTS = 16
MAX_TEMPERATURE_C = 105.0
CURVE_KEYS = ("points", "hysteresis_c", "min_step_pct", "spin_down_delay_s", "name")


class FanCurveError(ConfigError):
    code = "fan_curve_invalid"


# --------------------------------------------------------------------------- parsing, validation


def curve_from_mapping(data: Mapping[str, Any], *, name: str = "") -> FanCurve:
    """Build a curve from TOML/JSON data: ``{"points": [[40, 30], [70, 60]], ...}``."""
    problems: list[str] = []
    unknown = sorted(set(data) - set(CURVE_KEYS))
    if unknown:
        problems.append(f"unknown keys {', '.join(unknown)} (allowed: {', '.join(CURVE_KEYS)})")
    raw_points = data.get("points")
    points: list[tuple[float, float]] = []
    if not isinstance(raw_points, list | tuple) or not raw_points:
        problems.append("points must be a list of [temperature °C, fan %] pairs")
    else:
        for i, point in enumerate(raw_points):
            if (
                not isinstance(point, list | tuple)
                or len(point) != 2
                or not all(_is_number(v) for v in point)
            ):
                problems.append(f"point {i + 1} ({point!r}) must be [temperature °C, fan %]")
                continue
            points.append((float(point[0]), float(point[1])))
    numbers: dict[str, float] = {}
    for key, default in (("hysteresis_c", 2.0), ("min_step_pct", 0.0), ("spin_down_delay_s", 0.0)):
        value = data.get(key, default)
        if not _is_number(value):
            problems.append(f"{key} must be a number, not {value!r}")
            value = default
        numbers[key] = float(value)
    label = data.get("name", name)
    if problems:
        raise FanCurveError(_message(problems))
    return FanCurve(points=tuple(points), name=str(label), **numbers)


def validate_curve(
    curve: FanCurve, *, min_pct: int | None = None, max_pct: int | None = None
) -> tuple[str, ...]:
    """Raise FanCurveError listing every problem; return warnings (valid but worth a look).
    ``min_pct``/``max_pct``: the card's fan range (a duty under the floor is refused)."""
    problems: list[str] = []
    pts = curve.points
    if not 2 <= len(pts) <= MAX_POINTS:
        problems.append(f"a curve needs 2 to {MAX_POINTS} points, this one has {len(pts)}")
    for t, d in pts:
        if not (math.isfinite(t) and 0 <= t <= MAX_TEMPERATURE_C):
            problems.append(f"{_pt(t, d)}: temperature must be 0-{MAX_TEMPERATURE_C:.0f} °C")
        if not (math.isfinite(d) and 0 <= d <= 100):
            problems.append(f"{_pt(t, d)}: fan speed must be 0-100 %")
        elif min_pct is not None and d < min_pct:
            problems.append(
                f"{_pt(t, d)} is below this card's fan floor of {min_pct} %: the fans cannot run "
                f"that slowly. Raise it to {min_pct} % or drop the point (below the first point "
                "the fans go back to the firmware, which may stop them)"
            )
        elif max_pct is not None and d > max_pct:
            problems.append(f"{_pt(t, d)} is above this card's maximum of {max_pct} %")
    for (t0, d0), (t1, d1) in itertools.pairwise(pts):
        if t1 <= t0:
            problems.append(
                f"temperatures must rise from point to point: {_pt(t1, d1)} follows {_pt(t0, d0)}"
            )
        if d1 < d0:
            problems.append(
                f"fan speed must not fall as the temperature rises: {_pt(t1, d1)} "
                f"follows {_pt(t0, d0)}"
            )
    if not 0 <= curve.hysteresis_c <= 15:
        problems.append(f"hysteresis_c = {curve.hysteresis_c} must be 0-15 °C")
    if not 0 <= curve.min_step_pct <= 20:
        problems.append(f"min_step_pct = {curve.min_step_pct} must be 0-20 %")
    if not 0 <= curve.spin_down_delay_s <= 300:
        problems.append(f"spin_down_delay_s = {curve.spin_down_delay_s} must be 0-300 s")
    if problems:
        raise FanCurveError(_message(problems))
    warnings = []
    if pts[-1][1] < 60:
        warnings.append(
            f"the curve never runs the fans above {pts[-1][1]:.0f} %; a hot GPU will slow down"
        )
    if pts[0][0] > 60:
        warnings.append(f"the fans stay under firmware control up to {pts[0][0]:.0f} °C")
    return tuple(warnings)


def duty_at(curve: FanCurve, temperature_c: float) -> float:
    """Linear interpolation, clamped to the first and last point."""
    pts = curve.points
    if temperature_c <= pts[0][0]:
        return pts[0][1]
    for (t0, d0), (t1, d1) in itertools.pairwise(pts):
        if temperature_c <= t1:
            return d0 + (d1 - d0) * (temperature_c - t0) / (t1 - t0)
    return pts[-1][1]


def preview(curve: FanCurve, step_c: float = 5.0) -> tuple[tuple[float, float], ...]:
    """(°C, %) every ``step_c`` from 30 to 100 °C; 0 % means "firmware control"."""
    out = []
    t = 30.0
    while t <= 100.0:
        out.append((t, 0.0 if t < curve.points[0][0] else round(duty_at(curve, t), 1)))
        t += step_c
    return tuple(out)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _pt(t: float, d: float) -> str:
    return f"{t:g} °C → {d:g} %"


def _message(problems: list[str]) -> str:
    if len(problems) == 1:
        return f"fan curve refused: {problems[0]}"
    return "fan curve refused:\n" + "\n".join(f"  - {p}" for p in problems)


# --------------------------------------------------------------------------- presets


def presets_dir() -> Path:
    return resources_dir() / "fans"


def load_presets(folder: Path | None = None) -> dict[str, FanCurve]:
    """The shipped presets (quiet, balanced, performance, full), validated."""
    out: dict[str, FanCurve] = {}
    for path in sorted((folder or presets_dir()).glob("*.toml")):
        with path.open("rb") as fh:
            curve = curve_from_mapping(tomllib.load(fh), name=path.stem)
        validate_curve(curve)
        out[path.stem] = curve
    return out


def preset(name: str) -> FanCurve:
    presets = load_presets()
    if name not in presets:
        raise FanCurveError(f"no fan preset {name!r}; presets: {', '.join(presets)}")
    return presets[name]


# --------------------------------------------------------------------------- control


@dataclass(frozen=True)
class FanCommand:
    """What to do with a fan now: ``duty_pct`` None means hand back to the firmware."""

    duty_pct: int | None
    reason: str


class FanController:
    """Turns temperatures into fan commands for one fan (see the module docstring)."""

    def __init__(
        self, curve: FanCurve, *, min_pct: int | None = None, max_pct: int | None = None
    ) -> None:
        self.curve = curve
        self.min_pct = min_pct if min_pct is not None else 0
        self.max_pct = max_pct if max_pct is not None else 100
        self.duty_pct: int | None = None  # None: firmware in control
        self._anchor_c: float | None = None  # temperature that set the current duty
        self._down_since_s: float | None = None

    def reset(self) -> None:
        """Forget the current duty (after a resume, a read failure or a restore)."""
        self.duty_pct = None
        self._anchor_c = None
        self._down_since_s = None

    def update(self, temperature_c: float | None, now_s: float) -> FanCommand | None:
        """The command to send now, or None to leave the fan as it is."""
        c = self.curve
        if temperature_c is None:
            top = self._clamp(c.points[-1][1])
            self._down_since_s = None
            if self.duty_pct == top:
                return None
            return self._set(top, None, "temperature unreadable: fans up")
        first_c = c.points[0][0]
        if self.duty_pct is None:
            if temperature_c < first_c:
                return None
            return self._set(self._target(temperature_c), temperature_c, "curve")
        if self._anchor_c is None:  # the duty was set without a reading (fans up)
            self._anchor_c = temperature_c
        anchor = self._anchor_c
        if temperature_c < first_c - c.hysteresis_c:
            if self._delay_passed(now_s):
                self.reset()
                return FanCommand(None, f"below {first_c:g} °C: back to firmware control")
            return None
        target = self._target(max(temperature_c, first_c))
        if target > self.duty_pct:
            self._down_since_s = None
            if target - self.duty_pct >= c.min_step_pct or target == self._clamp(c.points[-1][1]):
                return self._set(target, temperature_c, "rising")
            return None
        if target < self.duty_pct and temperature_c <= anchor - c.hysteresis_c:
            if not self._delay_passed(now_s):
                return None
            if self.duty_pct - target >= c.min_step_pct or target == self._clamp(c.points[0][1]):
                return self._set(target, temperature_c, "falling")
            return None
        self._down_since_s = None
        return None

    def _delay_passed(self, now_s: float) -> bool:
        if self._down_since_s is None:
            self._down_since_s = now_s
        return now_s - self._down_since_s >= self.curve.spin_down_delay_s

    def _target(self, temperature_c: float) -> int:
        return self._clamp(duty_at(self.curve, temperature_c))

    def _clamp(self, duty: float) -> int:
        return round(min(self.max_pct, max(self.min_pct, duty)))

    def _set(self, duty: int, anchor_c: float | None, reason: str) -> FanCommand:
        self.duty_pct = duty
        self._anchor_c = anchor_c
        self._down_since_s = None
        return FanCommand(duty, reason)


def fan_ids(
    value: object, info: GPUInfo, error: type[TraylmError] = ConfigError
) -> tuple[int, ...]:
    """The fans of ``info`` that ``value`` names: a list of distinct fan numbers among those
    the GPU reports, or None for all of them. Raises ``error`` saying what is wrong (the daemon
    answers a ConfigError; traylm-gpud, which checks again, a GPUError)."""
    if value is None:
        if info.fan_count == 0:
            raise error(f"GPU {info.index} ({info.name}) reports no controllable fans")
        return tuple(range(info.fan_count))
    if not isinstance(value, list) or not value or len(set(map(str, value))) != len(value):
        raise error("fans must be a list of distinct fan numbers")
    for fan in value:
        if isinstance(fan, bool) or not isinstance(fan, int) or not 0 <= fan < info.fan_count:
            raise error(
                f"GPU {info.index} has fans 0-{info.fan_count - 1}; there is no fan {fan!r}"
            )
    return tuple(value)
