"""The shared codec of every event and API data type: the ``Event`` base class and the
conversion to and from JSON-ready data (``to_plain``, ``from_plain``).

Every event has a ``kind`` (its wire name) and a ``ts_s`` (Unix time). ``Event.to_wire`` turns an
event into JSON-ready data for the control API's SSE stream; ``engines.events.registry.from_wire``
turns it back into the same dataclass on the client side. Fields are plain values, tuples,
mappings or other frozen dataclasses, so nothing mutable ever reaches the GUI thread.
"""

from __future__ import annotations

import dataclasses
import enum
import time
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar, Union, get_args, get_origin, get_type_hints


def _now() -> float:
    return time.time()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Event:
    """Base of every event. Subclasses set ``kind`` as a class variable."""

    kind: ClassVar[str] = "event"
    ts_s: float = dataclasses.field(default_factory=_now)

    def to_wire(self) -> dict[str, Any]:
        data = to_plain(self)
        assert isinstance(data, dict)
        data["kind"] = self.kind
        return data


def to_plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [to_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    return value


T = TypeVar("T")


def from_plain(cls: type[T], data: Mapping[str, Any]) -> T:
    """Rebuild any frozen dataclass of the event modules (or nested ones) from JSON data."""
    hints = get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in data:
            kwargs[f.name] = _convert(hints[f.name], data[f.name])
    return cls(**kwargs)


def _convert(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        for arg in get_args(tp):
            if arg is type(None):
                continue
            return _convert(arg, value)
        return value
    if origin is tuple:
        args = get_args(tp)
        item = args[0] if args else Any
        return tuple(_convert(item, v) for v in value)
    if origin in (Mapping, dict, typing.Mapping):
        args = get_args(tp)
        vt = args[1] if len(args) == 2 else Any
        return {k: _convert(vt, v) for k, v in value.items()}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(value)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return from_plain(tp, value)
    if tp is float and isinstance(value, int):
        return float(value)
    return value
