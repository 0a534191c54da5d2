"""What the first-run setup proposes to serve on this computer (GET /api/setup/proposals): the
daemon's answer, so that the desktop keeps no rule of its own.

With NVIDIA GPUs: the shipped presets for them that a start's checks do not refuse for the
GPUs (a TP 2 preset needs two: ``gpu_not_found``), each with the planner's placement now.
Without one, or with simulated GPUs (telemetry only: they run nothing): the small instruct
models of ``resources/starters.toml`` for vLLM's CPU build.
"""

from __future__ import annotations

import tomllib
from typing import Protocol

from engines.config.profiles import ProfileStore, profile_to_mapping
from engines.config.sections import resources_dir
from engines.events.gpu import GPUInfo
from engines.events.models import ServableModel, SetupProposal
from engines.ondemand.catalog import Catalog
from engines.ondemand.placing import Placer

GPU_NOT_FOUND = "gpu_not_found"
"""The start checks' code for a profile that needs more NVIDIA GPUs than this computer has."""


class ModelsOnDemand(Protocol):
    """What the proposals read of the feature (engines/ondemand/service.py)."""

    catalog: Catalog
    placer: Placer
    profiles: ProfileStore

    async def listing(self) -> list[ServableModel]: ...


def cpu_starters() -> list[SetupProposal]:
    """resources/starters.toml's models, each with the profile the setup writes for it."""
    data = tomllib.loads((resources_dir() / "starters.toml").read_text())
    starters = []
    for item in data.get("cpu", []):
        profile: dict[str, object] = {
            "engine": "vllm",
            "model": str(item["repo_id"]),
            "served_name": str(item["name"]),
            "device": "auto",
            "max_model_len": int(item.get("max_model_len", 4096)),
            "description": f"{item['title']} (set up for the CPU build)",
        }
        starters.append(
            SetupProposal(
                name=str(item["name"]),
                repo_id=str(item["repo_id"]),
                title=str(item["title"]),
                about=str(item.get("about", "")),
                kind="starter",
                device="cpu",
                profile=profile,
            )
        )
    return starters


async def setup_proposals(
    feature: ModelsOnDemand, gpus: tuple[GPUInfo, ...]
) -> list[SetupProposal]:
    """The presets ``gpus`` can run (with their placement now), or the CPU starters."""
    if not gpus or any(g.simulated for g in gpus):
        return cpu_starters()
    blocked = {m.engine_id: m.blocked_code for m in await feature.listing()}
    found = []
    for entry in feature.catalog.index.entries:
        profile = entry.profile
        if entry.kind != "profile" or profile is None or profile.device == "cpu":
            continue
        if not feature.profiles.is_preset(entry.engine_id):
            continue
        if blocked.get(entry.engine_id) == GPU_NOT_FOUND:
            continue  # the start checks: this computer has too few GPUs for it
        found.append(
            SetupProposal(
                name=entry.engine_id,
                repo_id=profile.model,
                title=entry.engine_id,
                about=profile.description,
                kind="preset",
                device="cuda",
                profile=profile_to_mapping(profile),
                placement=feature.placer.preview(entry),
            )
        )
    return sorted(found, key=lambda p: p.name)
