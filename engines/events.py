"""Frozen event dataclasses: the only things that cross from the core to a UI.

Every event has a ``kind`` (its wire name) and a ``ts_s`` (Unix time). ``to_wire`` turns an
event into JSON-ready data for the control API's SSE stream; ``from_wire`` turns it back into
the same dataclass on the client side. Fields are plain values, tuples, mappings or other
frozen dataclasses, so nothing mutable ever reaches the GUI thread.
"""

from __future__ import annotations

import dataclasses
import enum
import time
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar, Union, get_args, get_origin, get_type_hints


class EngineState(enum.StrEnum):
    """Lifecycle of one engine process. Transitions: stopped → starting → ready → stopping →
    stopped; any state → failed; failed → starting on a (re)start."""

    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    FAILED = "failed"


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


@dataclasses.dataclass(frozen=True, kw_only=True)
class Diagnosis:
    """A known failure recognised in an engine's log, with advice a person can act on."""

    code: str
    summary: str
    advice: str
    severity: str = "error"  # "error" (the engine will not run) | "warning" | "info" (benign)
    line: str = ""
    suggested: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class EngineStatus:
    """A snapshot of one managed engine, for the control API."""

    engine_id: str
    engine: str
    state: EngineState
    served_names: tuple[str, ...]
    port: int | None
    pid: int | None
    restarts: int
    detail: str
    diagnosis: Diagnosis | None
    started_at_s: float | None
    ready_at_s: float | None
    profile: str
    device: str
    version: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineStateChanged(Event):
    kind: ClassVar[str] = "engine.state"
    engine_id: str
    state: EngineState
    previous: EngineState
    engine: str = ""
    served_names: tuple[str, ...] = ()
    port: int | None = None
    pid: int | None = None
    detail: str = ""
    restarts: int = 0
    diagnosis: Diagnosis | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineLogLine(Event):
    kind: ClassVar[str] = "engine.log"
    engine_id: str
    line: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineDiagnosed(Event):
    kind: ClassVar[str] = "engine.diagnosis"
    engine_id: str
    diagnosis: Diagnosis


@dataclasses.dataclass(frozen=True, kw_only=True)
class Notice(Event):
    """Something a person should see (a tray notification, a banner in the dashboard)."""

    kind: ClassVar[str] = "notice"
    level: str  # "info" | "warning" | "error"
    title: str
    message: str
    source: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class DaemonStopping(Event):
    kind: ClassVar[str] = "daemon.stopping"
    reason: str = ""


# --------------------------------------------------------------------------- gpu (issue 3)
# GPU snapshots and telemetry/fan/power/thermal-guard events go here: they cross to the UI.


# --------------------------------------------------------------------------- hub (issue 4)
# Search results, fit verdicts, download progress and library events go here.


# --------------------------------------------------------------------------- engines (issue 5)
# TensorRT-LLM build progress, engine-cache and remote-fallback events go here.


# --------------------------------------------------------------------------- desktop (issue 6)
# Chat/conversation data crossing to the UI goes here.

CHAT_ROLES = ("system", "user", "assistant")


@dataclasses.dataclass(frozen=True)
class ChatSummary:
    """One stored conversation of the chat window, without its messages."""

    chat_id: int
    title: str
    model: str
    system_prompt: str
    params: Mapping[str, float]  # temperature, top_p, max_tokens
    created_s: float
    updated_s: float
    message_count: int


@dataclasses.dataclass(frozen=True)
class ChatMessage:
    """One message of a conversation. ``stats`` holds per-reply figures (ttft_s, tokens_per_s,
    completion_tokens); ``finish_reason`` is stop, length, stopped (by the user) or error."""

    message_id: int
    chat_id: int
    position: int
    role: str
    content: str
    model: str
    stats: Mapping[str, float]
    finish_reason: str
    created_s: float


@dataclasses.dataclass(frozen=True)
class ChatTranscript:
    chat: ChatSummary
    messages: tuple[ChatMessage, ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChatChanged(Event):
    """A conversation was created, renamed, given messages, or deleted (any client did it)."""

    kind: ClassVar[str] = "chat.changed"
    chat_id: int
    change: str  # created | updated | messages | deleted


# --------------------------------------------------------------------------- wire registry


def _all_event_types() -> dict[str, type[Event]]:
    found: dict[str, type[Event]] = {}
    pending: list[type[Event]] = [Event]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls is not Event:
            found[cls.kind] = cls
    return found


EVENT_TYPES: dict[str, type[Event]] = _all_event_types()
"""Every Event subclass defined above, by wire name (computed once, at import)."""


def from_wire(data: Mapping[str, Any]) -> Event:
    """Rebuild an event from its wire form. Unknown kinds raise KeyError; extra keys are ignored
    so that an older client can read a newer daemon's events."""
    cls = EVENT_TYPES[str(data["kind"])]
    return from_plain(cls, data)


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
    """Rebuild any frozen dataclass of this module (or nested ones) from JSON data."""
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
