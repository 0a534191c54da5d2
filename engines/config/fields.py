"""Settings and profile fields: declared with their doc line and bounds (``setting``), read
back from TOML tables with every problem collected (``build_dataclass``), written back as only
what differs from the defaults (``non_default``); and durations as Ollama and Go write them.

A leaf: config.py (settings) and profiles.py (engine profiles) are built on it.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import re
from collections.abc import Iterable, Mapping
from dataclasses import field
from typing import Any, TypeVar, get_args, get_origin, get_type_hints

from engines.errors import ConfigError, quoted

# --------------------------------------------------------------------------- field metadata


def setting(
    default: Any,
    doc: str,
    *,
    min: float | None = None,
    max: float | None = None,
    choices: Iterable[str] | None = None,
    label: str = "",
    suggestions: Iterable[str] = (),
) -> Any:
    """A dataclass field with its doc line and validation bounds. ``label``: the name a form
    shows instead of the field's; ``suggestions``: common values a form offers (not a limit)."""
    meta = {
        "doc": doc,
        "min": min,
        "max": max,
        "choices": tuple(choices) if choices else None,
        "label": label,
        "suggestions": tuple(suggestions),
    }
    if isinstance(default, list | dict):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return field(default=default, metadata=meta)


def doc(cls: type[Any], name: str) -> str:
    """The one-line documentation of a settings or profile field (the UI's tooltip)."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            return str(f.metadata.get("doc", ""))
    raise KeyError(name)


# --------------------------------------------------------------------------- durations

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|h|m|s)?")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, None: 1.0}


def parse_duration(value: object, *, what: str) -> float:
    """Seconds from a number (seconds) or a duration string as Ollama and Go write them:
    "300", "90s", "10m", "1h30m", "-1". Negative values are returned as they are (the caller
    decides what they mean). Raises ConfigError naming ``what``."""
    if isinstance(value, bool):
        raise ConfigError(f'{what} must be a duration such as 300, "10m" or "1h", not {value}')
    if isinstance(value, int | float):
        return float(value)
    text = str(value).strip().lower()
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    total, pos = 0.0, 0
    for m in _DURATION_PART.finditer(body):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    if not body or pos != len(body):
        raise ConfigError(
            f"{what} {quoted(value)} is not a duration: write seconds (300) or a number with "
            "a unit (90s, 10m, 1h, 1h30m)"
        )
    return sign * total


# --------------------------------------------------------------------------- reading tables

C = TypeVar("C")


def build_dataclass(cls: type[C], data: Mapping[str, Any], where: str, problems: list[str]) -> C:
    """An instance of the dataclass ``cls`` from a TOML table: each value type-checked and
    bounds-checked against its ``setting``; each problem (unknown key, wrong type, out of bounds)
    is appended to ``problems`` prefixed with ``where``, and that field keeps its default."""
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    prefix = f"{where} " if where else ""
    for key, raw in data.items():
        if key not in fields:
            problems.append(
                f"{prefix}{quoted(key)} is not a known field{did_you_mean(key, fields)}"
            )
            continue
        meta = fields[key].metadata
        try:
            value = _coerce(hints[key], raw)
        except (TypeError, ValueError) as exc:
            problems.append(f"{prefix}{key} = {quoted(raw)}: {exc}")
            continue
        bad = _check_bounds(value, meta)
        if bad:
            problems.append(f"{prefix}{key} = {quoted(raw)}: {bad}")
            continue
        kwargs[key] = value
    return cls(**kwargs)


def _coerce(tp: Any, raw: Any) -> Any:
    origin = get_origin(tp)
    args = get_args(tp)
    if origin is not None and type(None) in args:
        if raw is None:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], raw)
    if tp is bool:
        if not isinstance(raw, bool):
            raise TypeError("must be true or false")
        return raw
    if tp is int:
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise TypeError("must be a whole number")
        return raw
    if tp is float:
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            raise TypeError("must be a number")
        return float(raw)
    if tp is str:
        if not isinstance(raw, str):
            raise TypeError("must be a string")
        return raw
    if origin is tuple:
        if not isinstance(raw, list | tuple):
            raise TypeError("must be a list")
        return tuple(_coerce(args[0], v) for v in raw)
    if origin is dict:
        if not isinstance(raw, dict):
            raise TypeError("must be a table")
        return {str(k): _coerce(args[1], v) for k, v in raw.items()}
    raise TypeError(f"unsupported field type {tp}")


def _check_bounds(value: Any, meta: Mapping[str, Any]) -> str | None:
    if value is None:
        return None
    lo, hi, choices = meta.get("min"), meta.get("max"), meta.get("choices")
    if choices and value not in choices:
        return f"must be one of {', '.join(choices)}{did_you_mean(str(value), choices)}"
    if isinstance(value, int | float) and not isinstance(value, bool):
        if lo is not None and value < lo:
            return f"must be at least {lo}"
        if hi is not None and value > hi:
            return f"must be at most {hi}"
    return None


def non_default(obj: Any) -> dict[str, Any]:
    """The fields of a settings or profile dataclass that differ from their defaults (tuples as
    lists), which is what a file keeps."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        default = (
            f.default
            if f.default is not dataclasses.MISSING
            else (f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        )
        if value != default and value is not None:
            out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def did_you_mean(word: str, options: Iterable[str]) -> str:
    """The text "; did you mean 'x'?" for the option closest to ``word``, or "" if none is."""
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def problems_message(where: str, problems: list[str]) -> str:
    """One error text for every problem found in ``where`` (one line, or a list)."""
    if len(problems) == 1:
        return f"{where}: {problems[0]}"
    return f"{where} has {len(problems)} problems:\n" + "\n".join(f"  - {p}" for p in problems)
