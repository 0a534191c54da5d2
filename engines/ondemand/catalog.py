"""The servable catalog: every model a request may name at :8000 without it being loaded.

Sources plug in (``Source``, two members): the profiles, the verified models of the hub library,
the model folders registered in the library (``traylm models add PATH``) and the attached
servers. Each source is read in a worker thread; the catalog keeps a name index that the gateway
reads with one dict lookup.

Names and precedence. Each entry claims names at one of three levels:

1. explicit names: a profile's ``served_name`` and ``aliases``, an attached server's name;
2. profile names (the engine id: ``traylm load PROFILE``; a registered folder's library name);
3. implicit names: repo ids (a profile's model, a library model), a library model's short
   name, the model ids an attached server reports.

A name goes to the entry that claims it at the lowest level (an alias beats a repo id, and the
shadowed claim is listed in ``notes``). Two entries claiming one name at the same level make the
name ambiguous: it routes nowhere and a request for it gets a 409 that names both and the fix.
A library model that a profile already runs is not listed twice: the profile is its entry.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from engines.config.profiles import Profile, ProfileStore, profile_from_mapping
from engines.core.modelinfo import ConfigUnreadable, folder_config, read_model_info
from engines.errors import ConfigError
from engines.events.hub import LocalFolder, LocalModel, ModelDetails
from engines.hub.folders import folder_profile
from engines.hub.names import repo_id_from_cache_folder
from engines.hub.search import Listing, details_from
from engines.hub.selection import RepoEntry
from engines.hub.shape import parse_config
from engines.runtime.adapters.vllm_models import family_parsers

log = logging.getLogger(__name__)

EXPLICIT, PROFILE_NAME, IMPLICIT = 1, 2, 3
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True)
class Entry:
    """One servable model."""

    name: str
    """The name /v1/models lists first (a profile's served name, a library repo id)."""
    kind: str  # profile | library | folder | attached
    engine_id: str
    claims: tuple[tuple[str, int], ...]
    """(name, level) for every name it answers to (see the module docstring)."""
    listed: tuple[str, ...] = ()
    """More names /v1/models lists for it (aliases)."""
    profile: Profile | None = None
    """How to run it (None for an attached server)."""
    repo_id: str | None = None
    weights_bytes: int | None = None
    details: ModelDetails | None = None
    """The model's shape, for the fit estimate that picks 1 or 2 GPUs (library models)."""
    url: str = ""

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(name for name, _ in self.claims))


class SaidOnce:
    """Lines about things that cannot be served, logged once each and again only when they
    change (the catalog is read every 30 s: a profile named like a folder once filled a third
    of the daemon's log with one line); ``gone`` (a %-format for the subject) says once that a
    thing's problem went away."""

    def __init__(self, gone: str | None = None, *, level: int = logging.INFO) -> None:
        self._gone = gone
        self._level = level
        self._said: dict[str, str] = {}

    def update(self, found: dict[str, str]) -> None:
        """``found``: this read's lines, by subject."""
        for subject, line in found.items():
            if self._said.get(subject) != line:
                log.log(self._level, "%s", line)
        if self._gone is not None:
            for subject in self._said.keys() - found.keys():
                log.info(self._gone, subject)
        self._said = dict(found)


class Source(Protocol):
    """A kind of servable model. ``entries`` runs in a worker thread (it may read files)."""

    kind: str

    def entries(self) -> list[Entry]: ...


@dataclass
class Index:
    by_name: dict[str, Entry] = field(default_factory=dict)
    ambiguous: dict[str, str] = field(default_factory=dict)
    """name → why it routes nowhere (and how to fix it)."""
    notes: list[str] = field(default_factory=list)
    """Names resolved by precedence, said once (they are shown in `traylm models ls`)."""
    entries: list[Entry] = field(default_factory=list)
    broken: list[str] = field(default_factory=list)


def build_index(entries: Sequence[Entry], broken: Sequence[str] = ()) -> Index:
    """The name index with the precedence rules of the module docstring."""
    claims: dict[str, dict[int, list[Entry]]] = {}
    for entry in entries:
        for name, level in entry.claims:
            holders = claims.setdefault(name, {}).setdefault(level, [])
            if entry not in holders:
                holders.append(entry)
    index = Index(entries=list(entries), broken=list(broken))
    for name, levels in claims.items():
        top = min(levels)
        winners = levels[top]
        if len(winners) > 1:
            index.ambiguous[name] = _ambiguity(name, top, winners)
            continue
        index.by_name[name] = winners[0]
        shadowed = [e for lv, es in levels.items() if lv > top for e in es if e is not winners[0]]
        if shadowed:
            others = ", ".join(f"{e.kind} {e.engine_id}" for e in shadowed)
            index.notes.append(
                f"{name!r} goes to {winners[0].kind} {winners[0].engine_id} (an explicit name "
                f"wins over a profile name, which wins over a repo id), not to {others}"
            )
    return index


def _ambiguity(name: str, level: int, winners: Sequence[Entry]) -> str:
    who = " and ".join(f"{e.kind} {e.engine_id!r}" for e in winners)
    if level == EXPLICIT:
        return (
            f"{name!r} is a served name or alias of both {who}; give one of them another "
            "served_name or alias (or detach the server), then ask again"
        )
    choices = ", ".join(e.name for e in winners)
    return f"{name!r} could mean {who}; ask for one of them by its name: {choices}"


class Catalog:
    """The entries of every source and the name index (no I/O until ``refresh``)."""

    def __init__(self, sources: Sequence[Source]) -> None:
        self._sources = list(sources)
        self.index = Index()
        self._refreshing: asyncio.Future[None] | None = None
        self._started_s = -1.0
        self._failed = SaidOnce(gone="catalog source %s reads again", level=logging.WARNING)

    def find(self, name: str) -> Entry | None:
        return self.index.by_name.get(name)

    async def refresh(self) -> None:
        """Re-read every source (concurrent callers share one read)."""
        if self._refreshing is None or self._refreshing.done():
            self._start_read()
        assert self._refreshing is not None
        await asyncio.shield(self._refreshing)

    async def refresh_fresh(self) -> None:
        """Wait for a read that began after this call (a profile written a moment ago is
        found); callers arriving together share it. For a name the index does not know, and
        for the model list."""
        asked = time.monotonic()
        while self._started_s < asked:
            if self._refreshing is not None and not self._refreshing.done():
                await asyncio.shield(self._refreshing)
            else:
                self._start_read()
        assert self._refreshing is not None
        await asyncio.shield(self._refreshing)

    def _start_read(self) -> None:
        self._started_s = time.monotonic()
        self._refreshing = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        entries, broken = await asyncio.to_thread(self._collect)
        self.index = build_index(entries, broken)

    def _collect(self) -> tuple[list[Entry], list[str]]:
        found: list[Entry] = []
        broken: list[str] = []
        failed: dict[str, str] = {}
        for source in self._sources:
            try:
                found.extend(source.entries())
            except (OSError, ConfigError) as exc:  # one bad source must not hide the rest
                failed[source.kind] = f"catalog source {source.kind} failed: {exc}"
                broken.append(f"{source.kind}: {exc}")
        self._failed.update(failed)
        run_by_profile = {e.repo_id for e in found if e.kind == "profile" and e.repo_id}
        kept = [e for e in found if not (e.kind == "library" and e.repo_id in run_by_profile)]
        return _one_entry_per_engine(kept, broken), broken


def _one_entry_per_engine(entries: list[Entry], broken: list[str]) -> list[Entry]:
    """An engine id runs one model: a later source's entry with a taken id (a model folder
    registered as "tiny-llama" beside the library's org/tiny-llama) is left out, said in
    ``broken`` with the fix."""
    holders: dict[str, Entry] = {}
    kept = []
    for e in entries:
        holder = holders.setdefault(e.engine_id, e)
        if holder is e:
            kept.append(e)
            continue
        fix = (
            f"register the folder under another name (`traylm models rm {e.engine_id}`, then "
            "`traylm models add PATH --name NEW`)"
            if e.kind == "folder"
            else "give one of them another name"
        )
        broken.append(
            f"{e.kind} {e.name} is left out: its name {e.engine_id!r} is taken by "
            f"{holder.kind} {holder.name}; {fix}"
        )
    return kept


# --------------------------------------------------------------------------- sources


class ProfileSource:
    """Every loadable profile (presets and the user's)."""

    kind = "profile"

    def __init__(self, profiles: ProfileStore, weights: Callable[[str], int | None]) -> None:
        """``weights``: repo id → its weights' size when the library has it (else None)."""
        self._profiles = profiles
        self._weights = weights
        self._said = SaidOnce()

    def entries(self) -> list[Entry]:
        good, broken = self._profiles.load_all()
        self._said.update({problem: f"profile not servable: {problem}" for problem in broken})
        return [self._entry(p) for p in good]

    def _entry(self, p: Profile) -> Entry:
        repo = repo_of(p.model)
        claims = [(p.effective_served_name, EXPLICIT), *((a, EXPLICIT) for a in p.aliases)]
        claims.append((p.name, PROFILE_NAME))
        if repo:
            claims.append((repo, IMPLICIT))
        return Entry(
            name=p.effective_served_name,
            kind=self.kind,
            engine_id=p.name,
            claims=tuple(claims),
            listed=p.aliases,
            profile=p,
            repo_id=repo,
            weights_bytes=self._weights(repo) if repo else None,
        )


class LibrarySource:
    """The verified models of the hub library, each runnable without a profile: vLLM (or the
    first engine that can run it), ``gpus = "auto"``, from its snapshot folder (no network),
    with its family's tool-call and reasoning parsers (as ``traylm start --model`` gives)."""

    kind = "library"

    def __init__(self, models: Callable[[], list[LocalModel]], taken: Callable[[], set[str]]):
        """``models``: the library (blocking); ``taken``: engine ids in use by profiles."""
        self._models = models
        self._taken = taken

    def entries(self) -> list[Entry]:
        taken = set(self._taken())
        newest: dict[str, LocalModel] = {}
        for m in self._models():
            if m.verified != "verified" or not m.engines:
                continue
            if m.repo_id not in newest or m.last_modified_s > newest[m.repo_id].last_modified_s:
                newest[m.repo_id] = m
        out = []
        for repo, m in sorted(newest.items()):
            engine_id = _engine_id(repo, taken)
            taken.add(engine_id)
            out.append(self._entry(m, engine_id))
        return out

    def _entry(self, m: LocalModel, engine_id: str) -> Entry:
        short = m.repo_id.rsplit("/", 1)[-1]
        fields: dict[str, Any] = {
            "engine": m.engines[0],
            "model": m.snapshot_path,
            "served_name": m.repo_id,
            "aliases": [short],
            "gpus": "auto",
            "description": f"library model {m.repo_id}",
            "trust_remote_code": m.needs_remote_code and m.trust_remote_code,
        }
        if m.engines[0] == "vllm":
            info = read_model_info(m.snapshot_path)
            parsers = family_parsers(m.repo_id, info.config if info else None)
            fields |= {"tool_parser": parsers.tool, "reasoning_parser": parsers.reasoning}
        profile = profile_from_mapping(engine_id, fields, f"library model {m.repo_id}")
        details = details_from_folder(Path(m.snapshot_path), m.repo_id, m.commit_sha)
        return Entry(
            name=m.repo_id,
            kind=self.kind,
            engine_id=engine_id,
            claims=((m.repo_id, IMPLICIT), (short, IMPLICIT), (engine_id, PROFILE_NAME)),
            profile=profile,
            repo_id=m.repo_id,
            weights_bytes=details.weights_bytes if details else m.size_bytes,
            details=details,
        )


class FolderSource:
    """The model folders registered in the library, each servable by its served name and its
    library name from the folder itself (``gpus = "auto"``). A folder whose files are gone is
    left out (``traylm models ls`` says what is missing); so is one whose name a profile has
    (the profile is what ``traylm start NAME`` runs, too)."""

    kind = "folder"

    def __init__(
        self, folders: Callable[[], list[LocalFolder]], taken: Callable[[], set[str]]
    ) -> None:
        """``folders``: the registered folders (blocking); ``taken``: the profiles' names."""
        self._folders = folders
        self._taken = taken
        self._said = SaidOnce(gone="model folder %s can be served now")

    def entries(self) -> list[Entry]:
        taken = self._taken()
        out = []
        problems: dict[str, str] = {}
        for folder in self._folders():
            if folder.problems or folder.name in taken:
                why = "; ".join(folder.problems) or (
                    f"a profile has its name (the profile is what `traylm start {folder.name}` "
                    "runs); rename the profile, or register the folder under another name"
                )
                problems[folder.name] = f"model folder {folder.name} not servable: {why}"
                continue
            out.append(self._entry(folder))
        self._said.update(problems)
        return out

    def _entry(self, folder: LocalFolder) -> Entry:
        served = folder.served_name
        details = details_from_folder(Path(folder.path), folder.name)
        return Entry(
            name=served,
            kind=self.kind,
            engine_id=folder.name,
            claims=((served, EXPLICIT), (folder.name, PROFILE_NAME)),
            profile=folder_profile(folder, f"model folder {folder.name}"),
            weights_bytes=details.weights_bytes if details else folder.size_bytes,
            details=details,
        )


def _engine_id(repo_id: str, taken: set[str]) -> str:
    base = _UNSAFE.sub("-", repo_id.rsplit("/", 1)[-1])[:56].lstrip(".-_") or "model"
    name, n = base, 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    return name


def repo_of(model: str) -> str | None:
    """The repo id a profile's model names: ``org/name`` itself, or a snapshot folder inside
    the Hugging Face cache; None for any other folder."""
    if "/models--" in model:
        return repo_id_from_cache_folder("models--" + model.split("/models--", 1)[1].split("/")[0])
    if model.startswith(("/", ".", "~")) or model.count("/") != 1:
        return None
    return model


def details_from_folder(folder: Path, name: str, sha: str = "") -> ModelDetails | None:
    """The model's shape from a folder's config.json and its files' sizes (what the hub's
    details give from the Hub's metadata; here nothing leaves the machine)."""
    try:
        config = folder_config(folder)
        files = tuple(
            RepoEntry(f.relative_to(folder).as_posix(), f.stat().st_size, "", None)
            for f in sorted(folder.rglob("*"))
            if f.is_file()
        )
    except (OSError, ConfigUnreadable):
        return None
    listing = Listing(name, sha, sha, files, "", False, "", {})
    return details_from(listing, parse_config(config))
