"""Frozen messages the bridge hands to the GUI thread, besides the core's own events.

Everything that crosses from the bridge's asyncio thread to Qt is one of these, an
``engines.events`` dataclass, or a value passed through ``freeze`` (read-only mappings and
tuples), so no mutable object is ever shared between the two threads.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from engines.config.sections import Settings
from engines.events import (
    EfficiencyProfiles,
    EngineStatus,
    GPUOverview,
    LocalFolder,
    LocalModel,
    ServableModel,
)


class LinkState(enum.StrEnum):
    """How the app stands with the daemon."""

    CONNECTING = "connecting"
    STARTING_DAEMON = "starting_daemon"
    CONNECTED = "connected"
    VERSION_MISMATCH = "version_mismatch"
    UNREACHABLE = "unreachable"

    @property
    def usable(self) -> bool:
        """The control API answers (a daemon of another version still does, mostly)."""
        return self in (LinkState.CONNECTED, LinkState.VERSION_MISMATCH)


@dataclass(frozen=True)
class ConnectionChanged:
    state: LinkState
    message: str
    url: str = ""  # gateway base URL, http://127.0.0.1:PORT (no /v1)
    daemon_version: str = ""
    daemon_pid: int | None = None
    spawned: bool = False  # this app started the daemon
    serve_args: tuple[str, ...] = ()  # the daemon's `traylm serve` flags (a restart keeps them)


@dataclass(frozen=True)
class ProfileEntry:
    """A profile as the control API lists it; ``fields`` are its plain (frozen) values."""

    name: str
    preset: bool
    fields: Mapping[str, object]

    @property
    def served_names(self) -> tuple[str, ...]:
        served = (
            self.fields.get("served_name")
            or str(self.fields.get("model", "")).rstrip("/").rsplit("/", 1)[-1]
        )
        aliases = self.fields.get("aliases") or ()
        assert isinstance(aliases, tuple)
        return (str(served or self.name), *(str(a) for a in aliases))

    @property
    def description(self) -> str:
        return str(self.fields.get("description", ""))


@dataclass(frozen=True)
class EnginesLoaded:
    engines: tuple[EngineStatus, ...]


@dataclass(frozen=True)
class ProfilesLoaded:
    profiles: tuple[ProfileEntry, ...]
    broken: tuple[str, ...]


@dataclass(frozen=True)
class SettingsLoaded:
    settings: Settings
    docs: Mapping[str, str]


@dataclass(frozen=True)
class StatusLoaded:
    """GET /api/status: bind host, LAN sharing, whether API keys are required, paused."""

    status: Mapping[str, object]


@dataclass(frozen=True)
class EnvEntry:
    """An engine environment as GET /api/envs lists it."""

    name: str
    engine: str
    version: str
    device: str
    complete: bool


@dataclass(frozen=True)
class EnvsLoaded:
    envs: tuple[EnvEntry, ...]


@dataclass(frozen=True)
class LibraryLoaded:
    """The local library: models in the Hugging Face cache and registered model folders."""

    cached: tuple[LocalModel, ...]
    folders: tuple[LocalFolder, ...]


@dataclass(frozen=True)
class ServableLoaded:
    """The daemon's servable models, each with why it cannot start here (``blocked``)."""

    models: tuple[ServableModel, ...]


@dataclass(frozen=True)
class GPUsLoaded:
    """GET /api/gpus at connect: ``overview`` is None when this daemon has no GPU telemetry
    (``error`` says why)."""

    overview: GPUOverview | None
    error: str = ""


@dataclass(frozen=True)
class EfficiencyLoaded:
    """GET /api/gpus/profiles, at connect and after each GPU control change: ``profiles`` is
    None when this daemon cannot list them (``error`` says why)."""

    profiles: EfficiencyProfiles | None
    error: str = ""


@dataclass(frozen=True)
class CallResult:
    """The outcome of one ``Bridge.call``/``Bridge.run``: a frozen value, or an error text."""

    call_id: int
    value: object = None
    error: str = ""
    error_code: str = ""
    cancelled: bool = False

    @property
    def ok(self) -> bool:
        return not self.error and not self.cancelled


def freeze(value: object) -> object:
    """A read-only deep copy: mappings become MappingProxyType, lists become tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({str(k): freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    return value
