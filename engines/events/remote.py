"""The remote OpenAI-compatible fallback's status and its routing events (engines/remote/)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from engines.events.codec import Event


@dataclasses.dataclass(frozen=True)
class RemoteStatus:
    """The optional remote OpenAI-compatible fallback, for the tray and /api/status."""

    enabled: bool
    base_url: str
    aliases: tuple[str, ...]
    key_source: str  # "keyring" | "env" | "none"
    ready: bool
    detail: str
    routed_requests: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class RemoteRouted(Event):
    """A request went to the remote API instead of a local engine."""

    kind: ClassVar[str] = "remote.routed"
    model: str
    why: str  # "not_served" | an engine state | "queue_full"
