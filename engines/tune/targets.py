"""What the tuner takes on this computer (GET /api/tune/targets, `traylm tune NAME`): every
profile, registered model folder and downloaded model of the servable list that can start here,
as it is. The servable list's ``blocked`` (the checks a start makes, engines/ondemand/
verdicts.py) is the one answer to "can it start here": those that cannot are listed apart with
that reason, never as targets.

A folder or a downloaded model has no profile file: its catalog entry's profile (the one a load
starts from, engines/hub/folders.py folder_profile) is what the tuner measures and changes.
"""

from __future__ import annotations

from engines.config.profiles import Profile, ProfileStore
from engines.errors import ConfigError, quoted
from engines.events.models import ModelStatus, ServableModel
from engines.events.tune import TuneTarget
from engines.ondemand.catalog import Entry
from engines.ondemand.service import ModelsOnDemand

KINDS = ("profile", "folder", "library")
"""What the tuner can start itself (an attached server runs elsewhere; an engine started ad hoc
has no entry to come back to)."""


async def tune_targets(ondemand: ModelsOnDemand) -> tuple[list[TuneTarget], list[TuneTarget]]:
    """(what can be tuned here, what cannot, each with its ``blocked`` reason)."""
    found = [_target(m) for m in await ondemand.listing() if m.kind in KINDS]
    return [t for t in found if not t.blocked], [t for t in found if t.blocked]


def _target(m: ServableModel) -> TuneTarget:
    return TuneTarget(
        name=m.engine_id,
        kind=m.kind,
        served_name=m.name,
        model=m.model,
        loaded=m.status == ModelStatus.LOADED,
        blocked=m.blocked,
    )


async def target_profile(name: str, profiles: ProfileStore, ondemand: ModelsOnDemand) -> Profile:
    """The profile a tune of ``name`` measures: the profile of that name, else the catalog
    entry of that engine id (a registered folder, a downloaded model), else the one profile
    serving ``name``, else the entry ``name`` routes to; ConfigError naming what it takes."""
    if name in profiles.names():
        return profiles.load(name)
    entries = [e for e in ondemand.catalog.index.entries if e.kind in KINDS and e.profile]
    by_id = next((e for e in entries if e.engine_id == name), None)
    if by_id is not None and by_id.profile is not None:
        return by_id.profile
    good, _ = profiles.load_all()
    serving = [p for p in good if name in p.served_names]
    if len(serving) == 1:
        return serving[0]
    entry = await ondemand.find(name) if not serving else None
    if entry is not None and entry.kind in KINDS and entry.profile is not None:
        return entry.profile
    several = f" (several serve it: {', '.join(p.name for p in serving)})" if serving else ""
    raise ConfigError(
        f"nothing to tune named {quoted(name)}{several}: the tuner takes a profile, a model folder "
        "added to the library or a downloaded model; `traylm tune --targets` lists those that "
        "can start here",
        code="profile_not_found",
    )


async def entry_for(profile: Profile, ondemand: ModelsOnDemand) -> Entry | None:
    """The catalog entry that runs ``profile`` (found by its engine id, never by its served
    name: a profile serving a folder's name under a name of its own claims that name beside the
    folder, and a lookup by the name would be refused as ambiguous); a profile written a moment
    ago is found after a fresh read."""

    def find() -> Entry | None:
        entries = ondemand.catalog.index.entries
        return next((e for e in entries if e.engine_id == profile.name), None)

    if find() is None:
        await ondemand.catalog.refresh_fresh()
    return find()
