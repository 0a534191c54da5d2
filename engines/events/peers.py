"""Paired boxes and pairing, as the control API and the CLI show them (engines/peers/)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from engines.events.codec import Event


@dataclasses.dataclass(frozen=True)
class PairingCode:
    """A pairing just begun on this box: the code a person types on the other box."""

    code: str  # "ABCDE-FGHJK"
    expires_in_s: float
    address: str  # host:port the other box pairs with (the first of addresses)
    fingerprint: str  # this box's certificate, to compare by eye
    qr: str  # traylm-pair://HOST:PORT/CODE?fp=FINGERPRINT (the dashboard's QR code)
    addresses: tuple[str, ...] = ()  # every host:port of this box the listener serves


@dataclasses.dataclass(frozen=True)
class PairingState:
    active: bool
    expires_in_s: float
    outcome: str  # what ended the last pairing ("paired with B", "the code expired"), or ""


@dataclasses.dataclass(frozen=True)
class PeerInfo:
    """One paired box. ``reachable``: None when not checked; ``problem``: why not, with the
    fix."""

    name: str
    address: str
    fingerprint: str
    paired_at_s: float
    last_seen_s: float | None
    reachable: bool | None = None
    problem: str = ""


@dataclasses.dataclass(frozen=True)
class PeersView:
    name: str  # this box
    fingerprint: str  # this box's certificate
    listening: str  # host:port, or "" when nothing listens for paired boxes
    peers: tuple[PeerInfo, ...]


@dataclasses.dataclass(frozen=True)
class Unpaired:
    name: str
    removed_there: bool
    detail: str


@dataclasses.dataclass(frozen=True)
class BoxGPU:
    """A GPU of a paired box, as that box reports it (``index``: its own NVML index)."""

    index: int
    name: str
    memory_total_bytes: int | None = None


@dataclasses.dataclass(frozen=True)
class BoxModel:
    """A model a box serves on its own engines now (ready): what it tells paired boxes
    (/peer/models), each of which then has it as one more replica of ``name``."""

    name: str
    names: tuple[str, ...]
    """Every name that routes to it on that box (``name`` first)."""
    engine: str
    gpus: tuple[int, ...] = ()
    """That box's GPU indices (none: on its CPU)."""
    in_flight: int = 0
    waiting: int = 0


@dataclasses.dataclass(frozen=True)
class BoxServes:
    """What one box serves (its answer to /peer/models)."""

    name: str
    models: tuple[BoxModel, ...]
    gpus: tuple[BoxGPU, ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class BoxesChanged(Event):
    """What the paired boxes serve here changed: a box was heard of, went away, came back, or
    its models or GPUs changed (``boxes``: the names of those known); read /api/status."""

    kind: ClassVar[str] = "boxes.changed"
    boxes: tuple[str, ...] = ()
    away: tuple[str, ...] = ()
