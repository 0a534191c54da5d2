"""What the first-run setup proposes to serve on this computer: the daemon's proposals (the
presets its GPUs start, or the small models for vLLM's CPU build: engines/ondemand/
proposals.py), and the model folders registered here or chosen with Browse….
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import MappingProxyType

from engines.events import SetupProposal


@dataclass(frozen=True)
class Proposal:
    """One model the setup can download (or find), start and chat with."""

    name: str  # the profile (or folder) name: what `traylm start NAME` takes
    repo_id: str  # "" for a folder on this computer
    title: str
    about: str
    kind: str  # "starter" (a profile to write) | "preset" | "folder"
    profile: MappingProxyType[str, object] = field(
        default_factory=lambda: MappingProxyType({})
    )  # the fields a starter's profile gets
    path: str = ""  # a folder's
    device: str = ""  # where the daemon would run it: "cuda" | "cpu" ("" for a folder)

    @property
    def served_name(self) -> str:
        served = self.profile.get("served_name")
        return str(served) if served else self.name


def from_daemon(proposal: SetupProposal) -> Proposal:
    """One of the daemon's proposals (GET /api/setup/proposals) as the setup shows it."""
    return Proposal(
        name=proposal.name,
        repo_id=proposal.repo_id,
        title=proposal.title,
        about=proposal.about,
        kind=proposal.kind,
        profile=MappingProxyType(dict(proposal.profile)),
        device=proposal.device,
    )


def folder_proposal(name: str, path: str, served_name: str, family: str) -> Proposal:
    return Proposal(
        name=name,
        repo_id="",
        title=f"{name} (a folder on this computer)",
        about=f"{family or 'model'} at {path}",
        kind="folder",
        profile=MappingProxyType({"served_name": served_name}),
        path=path,
    )


def folder_name(path: str) -> str:
    """The name a folder is registered under: its last part, made safe."""
    base = path.rstrip("/").rsplit("/", 1)[-1]
    return re.sub(r"[^A-Za-z0-9._-]", "-", base).strip(".-_")[:64] or "model"
