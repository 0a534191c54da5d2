"""Efficiency profiles: Quiet, Eco, Max and the user's own, each a power limit, an SM clock lock
and a fan preset, per GPU.

A built-in profile is written relative to each card (a share of its default power limit and of
its highest supported SM clock), so it fits any card; a user's profile (TOML files in
``~/.config/traylm/efficiency/``) may also name absolute values per GPU::

    description = "night: quiet and cool"
    power_pct = 65          # of the card's default limit
    sm_clock_max_pct = 70   # of its highest supported SM clock
    fans = "quiet"          # a fan preset (resources/fans); absent: firmware control
    [gpus.1]                # GPU by NVML index or UUID
    power_w = 250
    sm_clock_max_mhz = 1800

``resolve`` turns a profile into concrete targets checked against the cards; a profile naming a
GPU that is gone is refused with the GPUs there are. The thermal guard's power layer sits above
whatever a profile sets in traylm-gpud, so the guard still wins.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from engines.config.paths import Paths
from engines.errors import ConfigError, GPUNotFound
from engines.events.gpu import GPUInfo
from engines.gpu.backend import find_info
from engines.gpu.clocks import check_lock
from engines.gpu.fans import preset as fan_preset
from engines.gpu.power import check_limit


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPUSettings:
    """What a profile sets on one GPU; None leaves that control to the card."""

    power_pct: float | None = None
    """Power limit as a share (%) of the card's default limit."""
    power_w: float | None = None
    """Power limit in watts (wins over ``power_pct``)."""
    sm_clock_max_pct: float | None = None
    """Top of the SM clock lock as a share (%) of the card's highest supported SM clock."""
    sm_clock_max_mhz: int | None = None
    """Top of the SM clock lock in MHz (wins over ``sm_clock_max_pct``)."""
    fans: str | None = None
    """A fan-curve preset name; None: the firmware's automatic control."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class EfficiencyProfile:
    name: str
    description: str = ""
    default: GPUSettings = GPUSettings()
    """The settings of every GPU not listed in ``gpus``."""
    gpus: Mapping[str, GPUSettings] = dataclasses.field(default_factory=dict)
    """Per-GPU settings by NVML index ("0") or UUID."""
    builtin: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProfileTarget:
    """A profile resolved for one GPU: what traylm-gpud is asked to set."""

    info: GPUInfo
    limit_mw: int | None  # None: the card's default
    sm_lock_mhz: tuple[int, int] | None  # None: no lock
    fans: str | None  # None: firmware control


BUILTIN = {
    "quiet": EfficiencyProfile(
        name="quiet",
        description="60 % power, SM clock at 60 %, quiet fans: cool and silent, slower prefill",
        default=GPUSettings(power_pct=60, sm_clock_max_pct=60, fans="quiet"),
        builtin=True,
    ),
    "eco": EfficiencyProfile(
        name="eco",
        description="75 % power, SM clock at 75 %: decode near full speed for less energy",
        default=GPUSettings(power_pct=75, sm_clock_max_pct=75, fans="balanced"),
        builtin=True,
    ),
    "max": EfficiencyProfile(
        name="max",
        description="the card's defaults: default power limit, no clock lock, firmware fans",
        builtin=True,
    ),
}

_FIELDS = {f.name for f in dataclasses.fields(GPUSettings)}


def profiles_dir() -> Path:
    """``efficiency/`` in traylm's config folder (~/.config/traylm; under TRAYLM_HOME when
    that is set)."""
    return Paths.from_env().config_dir / "efficiency"


def load_profiles(folder: Path | None = None) -> dict[str, EfficiencyProfile]:
    """The built-in profiles and the user's (``folder``/*.toml; a user's file may not take a
    built-in name). Raises ConfigError naming the file and the field."""
    profiles, problems = scan_profiles(folder)
    if problems:
        raise ConfigError(next(iter(problems.values())))
    return profiles


def scan_profiles(
    folder: Path | None = None,
) -> tuple[dict[str, EfficiencyProfile], dict[str, str]]:
    """The profiles that can be used, and the user's files that cannot (by profile name: why,
    naming the file and the field): one broken file leaves the others usable."""
    out = dict(BUILTIN)
    problems: dict[str, str] = {}
    base = folder or profiles_dir()
    for path in sorted(base.glob("*.toml")) if base.is_dir() else []:
        try:
            out[path.stem] = _load_file(path)
        except ConfigError as exc:
            problems[path.stem] = exc.message
    return out, problems


def _load_file(path: Path) -> EfficiencyProfile:
    if path.stem in BUILTIN:
        raise ConfigError(f"{path}: {path.stem!r} is a built-in profile; rename the file")
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: not readable TOML ({exc})") from None
    return _profile(path, data)


def resolve(profile: EfficiencyProfile, infos: Sequence[GPUInfo]) -> tuple[ProfileTarget, ...]:
    """Concrete, checked targets for every GPU. Raises GPUNotFound for a GPU the profile names
    that is not there, ClockLockError / PowerLimitError for values outside a card's range."""
    named: dict[str, GPUSettings] = {}
    for key, settings in profile.gpus.items():
        try:
            named[find_info(infos, key).uuid] = settings
        except GPUNotFound as exc:
            raise GPUNotFound(
                f"profile {profile.name!r} names GPU {key!r}, which is not here ({exc.message}); "
                "edit the profile or reconnect the card"
            ) from None
    return tuple(_target(info, named.get(info.uuid, profile.default)) for info in infos)


def _target(info: GPUInfo, s: GPUSettings) -> ProfileTarget:
    limit_mw: int | None = None
    if s.power_w is not None:
        limit_mw = round(s.power_w * 1000)
    elif s.power_pct is not None and info.power_default_mw is not None:
        limit_mw = round(info.power_default_mw * s.power_pct / 100)
        if info.power_min_mw is not None:
            limit_mw = max(limit_mw, info.power_min_mw)
    if limit_mw is not None:
        check_limit(info, limit_mw)
    lock: tuple[int, int] | None = None
    top = s.sm_clock_max_mhz
    if top is None and s.sm_clock_max_pct is not None and info.sm_clock_max_mhz is not None:
        top = round(info.sm_clock_max_mhz * s.sm_clock_max_pct / 100)
        if info.sm_clock_min_mhz is not None:
            top = max(top, info.sm_clock_min_mhz)
    if top is not None:
        low = info.sm_clock_min_mhz if info.sm_clock_min_mhz is not None else top
        check_lock(info, "sm", low, top)
        lock = (low, top)
    if s.fans is not None:
        fan_preset(s.fans)  # FanCurveError names the presets there are
    return ProfileTarget(info=info, limit_mw=limit_mw, sm_lock_mhz=lock, fans=s.fans)


def _profile(path: Path, data: dict[str, Any]) -> EfficiencyProfile:
    gpus_raw = data.pop("gpus", {})
    description = str(data.pop("description", ""))
    if not isinstance(gpus_raw, dict):
        raise ConfigError(f"{path}: gpus must be a table of [gpus.INDEX] sections")
    return EfficiencyProfile(
        name=path.stem,
        description=description,
        default=_settings(path, "", data),
        gpus={str(k): _settings(path, f"gpus.{k}.", v) for k, v in gpus_raw.items()},
    )


def _settings(path: Path, where: str, data: Any) -> GPUSettings:
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: {where or 'the profile'} must be a table")
    unknown = set(data) - _FIELDS
    if unknown:
        raise ConfigError(
            f"{path}: unknown field(s) {', '.join(where + u for u in sorted(unknown))}; "
            f"fields: {', '.join(sorted(_FIELDS))}"
        )
    for key, value in data.items():
        if key == "fans":
            if not isinstance(value, str):
                raise ConfigError(f"{path}: {where}fans must be a fan preset name")
        elif isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ConfigError(f"{path}: {where}{key} must be a positive number, not {value!r}")
    if "sm_clock_max_mhz" in data:
        data = {**data, "sm_clock_max_mhz": int(data["sm_clock_max_mhz"])}
    return GPUSettings(**data)
