"""Power-limit profiles (resources/power/*.toml) and their validation against a card's limits.

A preset names a limit in watts per card (efficient 300 W, balanced 350 W) or none (stock: the
card's default). Limits are validated against NVML's constraints before traylm-gpud applies
them; the helper re-applies the persisted ones after a reboot (NVML forgets them).
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any

from engines.config.sections import resources_dir
from engines.errors import ConfigError
from engines.events.gpu import GPUInfo, PowerPreset


class PowerLimitError(ConfigError):
    code = "power_limit_invalid"


def presets_dir() -> Path:
    return resources_dir() / "power"


def load_presets(folder: Path | None = None) -> dict[str, PowerPreset]:
    out: dict[str, PowerPreset] = {}
    for path in sorted((folder or presets_dir()).glob("*.toml")):
        with path.open("rb") as fh:
            data = tomllib.load(fh)
        watts = data.get("watts")
        if watts is not None and (isinstance(watts, bool) or not isinstance(watts, int | float)):
            raise ConfigError(f"{path}: watts must be a number (or absent for the card default)")
        out[path.stem] = PowerPreset(
            name=path.stem,
            description=str(data.get("description", "")),
            watts=float(watts) if watts is not None else None,
        )
    return out


def resolve_request(info: GPUInfo, *, watts: Any = None, preset: Any = None) -> int:
    """The limit in mW for a request naming ``watts`` or a ``preset``, checked against the card.
    Raises PowerLimitError with the valid range."""
    if (watts is None) == (preset is None):
        raise PowerLimitError("give either watts (a number) or preset (a preset name)")
    if preset is not None:
        presets = load_presets()
        if not isinstance(preset, str) or preset not in presets:
            raise PowerLimitError(f"no power preset {preset!r}; presets: {', '.join(presets)}")
        chosen = presets[preset].watts
        if chosen is None:
            if info.power_default_mw is None:
                raise PowerLimitError(
                    f"GPU {info.index} does not report its default power limit; give watts"
                )
            return info.power_default_mw
        watts = chosen
    if isinstance(watts, bool) or not isinstance(watts, int | float) or not math.isfinite(watts):
        raise PowerLimitError(f"watts must be a number, not {watts!r}")
    limit_mw = round(float(watts) * 1000)
    check_limit(info, limit_mw)
    return limit_mw


def percent_of_default(info: GPUInfo, pct: float) -> int | None:
    """``pct`` % of the card's default limit (its maximum when it reports no default), never
    below its minimum; None when the card reports neither (the thermal guard's power step, the
    tuner's power candidates)."""
    default = info.power_default_mw or info.power_max_mw
    if default is None:
        return None
    limit = round(default * pct / 100)
    return max(limit, info.power_min_mw) if info.power_min_mw is not None else limit


def check_limit(info: GPUInfo, limit_mw: int) -> None:
    lo, hi = info.power_min_mw, info.power_max_mw
    if lo is None or hi is None:
        raise PowerLimitError(
            f"GPU {info.index} ({info.name}) does not report its power-limit range, so traylm "
            "will not set a limit on it"
        )
    if not lo <= limit_mw <= hi:
        raise PowerLimitError(
            f"{limit_mw / 1000:g} W is outside what GPU {info.index} ({info.name}) accepts: "
            f"{lo / 1000:g}-{hi / 1000:g} W (default {_w(info.power_default_mw)})"
        )


def _w(mw: int | None) -> str:
    return "unknown" if mw is None else f"{mw / 1000:g} W"
