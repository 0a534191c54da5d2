"""What the first-run setup proposes to serve on this computer.

With NVIDIA GPUs: the shipped presets that fit the GPUs present (a TP 2 preset needs two). On a
computer without one: the small instruct models of ``resources/starters.toml`` for vLLM's CPU
build. A model folder chosen with Browse… is a proposal too. Pure functions of the app state.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from types import MappingProxyType

from desktop.readiness import gpus_needed
from desktop.state import AppState
from engines.config import resources_dir


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

    @property
    def served_name(self) -> str:
        served = self.profile.get("served_name")
        return str(served) if served else self.name


def cpu_starters() -> list[Proposal]:
    data = tomllib.loads((resources_dir() / "starters.toml").read_text())
    starters = []
    for item in data.get("cpu", []):
        profile = {
            "engine": "vllm",
            "model": str(item["repo_id"]),
            "served_name": str(item["name"]),
            "device": "auto",
            "max_model_len": int(item.get("max_model_len", 4096)),
            "description": f"{item['title']} (set up for the CPU build)",
        }
        starters.append(
            Proposal(
                name=str(item["name"]),
                repo_id=str(item["repo_id"]),
                title=str(item["title"]),
                about=str(item.get("about", "")),
                kind="starter",
                profile=MappingProxyType(profile),
            )
        )
    return starters


def proposals(state: AppState) -> list[Proposal]:
    """The presets this computer's GPUs can run, or the CPU starters without a GPU."""
    gpus = state.real_gpus
    if gpus == 0:
        return cpu_starters()
    found = []
    for entry in state.profiles:
        if not entry.preset or gpus_needed(entry) > gpus:
            continue
        device = str(entry.fields.get("device", "auto"))
        if device == "cpu":
            continue
        found.append(
            Proposal(
                name=entry.name,
                repo_id=str(entry.fields.get("model", "")),
                title=entry.name,
                about=entry.description,
                kind="preset",
                profile=MappingProxyType(dict(entry.fields)),
            )
        )
    return found


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
