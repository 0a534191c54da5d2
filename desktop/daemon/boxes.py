"""Paired boxes as the app shows them, read from the daemon's /api/status (no Qt here): each
box's GPUs and whether it answers (``boxes``), and the models it serves as replicas of names
behind this box's :8000 (the ``models`` rows with a ``box``: what `traylm ps` lists)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from engines.events import BoxGPU, LoadedModel, from_plain


@dataclass(frozen=True)
class Box:
    """A paired box as this box last heard of it."""

    name: str
    problem: str
    """Why it is away (naming the fix); "" while it answers."""
    gpus: tuple[BoxGPU, ...]


@dataclass(frozen=True)
class BoxReplica:
    """A model a paired box serves, one more replica of ``name`` here."""

    name: str
    box: str
    away: str
    """Why its box is away ("" while it answers): the replica takes no request then."""
    detail: str
    """Where it runs there ("on box-b: GPU 0 NVIDIA ...")."""
    gpus: tuple[int, ...]
    """Its box's GPU indices (none: that box's CPU)."""

    @property
    def label(self) -> str:
        """ "on box-b", or "on box-b, away: why"."""
        return f"on {self.box}" + (f", away: {self.away}" if self.away else "")


def boxes_of(status: Mapping[str, object]) -> tuple[Box, ...]:
    """The paired boxes in a /api/status answer, by name."""
    boxes = status.get("boxes")
    if not isinstance(boxes, Mapping):
        return ()
    return tuple(
        Box(
            name=str(name),
            problem=str(box.get("problem", "")),
            gpus=tuple(
                from_plain(BoxGPU, g) for g in box.get("gpus", ()) if isinstance(g, Mapping)
            ),
        )
        for name, box in sorted(boxes.items())
        if isinstance(box, Mapping)
    )


def box_replicas_of(status: Mapping[str, object]) -> tuple[BoxReplica, ...]:
    """The paired boxes' replicas among a /api/status answer's ``models`` rows."""
    rows = status.get("models")
    if not isinstance(rows, Sequence):
        return ()
    models = (from_plain(LoadedModel, r) for r in rows if isinstance(r, Mapping) and r.get("box"))
    return tuple(
        BoxReplica(m.name, m.box, m.detail if m.state == "away" else "", m.detail, m.gpus)
        for m in models
    )
