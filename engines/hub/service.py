"""``HubFeature``: the daemon's Hugging Face Hub part: search and model details (cached), the
fit estimate on the machine's GPUs, downloads in worker processes, the local library, and the
consent to run a model's own code. Its routes are engines/hub/routes.py.

Events: ``download.state`` (DownloadStateChanged), ``download.progress`` (DownloadProgress),
``library.changed`` (LibraryChanged).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from engines.config.live import SettingsView
from engines.config.profiles import ProfileStore
from engines.core.reach import reachable
from engines.core.store import Store
from engines.errors import ConfigError, HubError, HubUnavailable
from engines.events.codec import Event
from engines.events.core import EngineState
from engines.events.hub import FitResult, LibraryChanged, ModelDetails
from engines.events.models import Placement
from engines.gpu.inventory import Inventory
from engines.hub.access import HubAccess, resolve_access
from engines.hub.download import DownloadManager
from engines.hub.folders import FolderRegistry
from engines.hub.library import Library
from engines.hub.names import repo_id_from_cache_folder, validate_repo_id, validate_revision
from engines.hub.records import HubRecords
from engines.hub.search import model_details
from engines.runtime.supervisor import EngineView

log = logging.getLogger(__name__)
DETAILS_TTL_S = 600.0
FitPlacement = Callable[[FitResult], Awaitable[Placement | None]]
"""Where a fit row (an engine on N GPUs) would load now: the models-on-demand planner
(engines/ondemand/service.py place_fit), so the badges predict what a load does."""
HUB_READ_TIMEOUT_S = 20.0


class HubFeature:
    name = "hub"

    def __init__(
        self,
        *,
        settings: SettingsView,
        store: Store,
        publish: Callable[[Event], None],
        logs_dir: Path,
        profiles: ProfileStore,
        engines: EngineView,
        inventory: Inventory,
        local_models_dir: Path,
        placement: FitPlacement | None = None,
    ) -> None:
        self.settings = settings
        self.placement = placement
        """Adds each fit row's placement now (None: the fit alone)."""
        self.publish = publish
        self._profiles = profiles
        self._engines = engines
        self.inventory = inventory
        """The machine's GPUs (the GPU feature's), for the fit estimate."""
        self.records = HubRecords(store)
        self.downloads = DownloadManager(
            settings=lambda: settings.current.hub,
            access=self.access,
            records=self.records,
            publish=publish,
            logs_dir=logs_dir / "downloads",
        )
        self.library = Library(access=self.access, records=self.records)
        self.folders = FolderRegistry(local_models_dir)
        """Model folders on this computer in the library (``traylm models add``)."""
        # (repo, revision, code included) → when asked, and the one lookup every caller shares
        self._details: dict[tuple[str, str, bool], tuple[float, asyncio.Future[ModelDetails]]] = {}

    def access(self) -> HubAccess:
        return resolve_access(self.settings.current.hub)

    async def start(self) -> None:
        await asyncio.to_thread(_bound_hub_timeouts)
        await self.downloads.start()

    async def stop(self) -> None:
        await self.downloads.stop()

    # ----------------------------------------------------------------- models

    async def details(self, repo_id: str, revision: str | None) -> ModelDetails:
        """The Hub's metadata of a model, cached. The consent to run its code is part of the key
        (it decides whether the code files join the download), so a lookup still running when
        the consent changes can never answer for the new one. Concurrent callers (the details
        and the fit of one selection) share one lookup; a failed one is not kept."""
        revision = validate_revision(revision) or "main"
        include_code = repo_id in await asyncio.to_thread(self.records.trusted)
        key = (repo_id, revision, include_code)
        cached = self._details.get(key)
        if cached is None or time.monotonic() - cached[0] >= DETAILS_TTL_S:
            lookup = asyncio.ensure_future(
                asyncio.to_thread(
                    model_details, self.access(), repo_id, revision, include_code=include_code
                )
            )
            cached = self._details[key] = (time.monotonic(), lookup)
        try:
            return await asyncio.shield(cached[1])
        except Exception:
            if self._details.get(key) is cached:
                del self._details[key]
            raise

    # ----------------------------------------------------------------- launch guard

    async def require_available(self, profile_name: str, model: str) -> None:
        """A Hub model that is not in the local cache is fetched by the engine at its start:
        refuse at once, in words, when the Hub cannot be reached (else the engine fails a
        minute later with a raw transformers error). Local folders and cached models pass."""
        repo_id = _repo_of(model)
        if repo_id is None or model.startswith("/"):
            return
        cached = await asyncio.to_thread(self.library.cached_revisions, repo_id)
        if cached:
            return
        endpoint = self.access().endpoint
        if await reachable(endpoint):
            return
        raise HubUnavailable(
            f"{repo_id} (profile {profile_name!r}) is not downloaded and the Hugging Face Hub "
            f"({endpoint}) cannot be reached, so the engine could not fetch it: download it "
            f"while online (`traylm models pull {repo_id}`), or serve a model folder on this "
            "computer (`traylm models add PATH`)",
            brief="not downloaded and the Hub cannot be reached: download it while online",
        )

    async def require_trust(self, profile_name: str, model: str) -> None:
        """A profile with trust_remote_code runs the model repo's own Python code: refuse unless
        the user trusted that repo (``traylm models trust``). A plain local folder that is not
        in the HF cache has no repo id; there the profile's own flag is the consent."""
        repo_id = _repo_of(model)
        if repo_id is None:
            return
        if repo_id not in await asyncio.to_thread(self.records.trusted):
            raise ConfigError(
                f"profile {profile_name!r} sets trust_remote_code, which runs {repo_id}'s own "
                f"Python code; if you trust its authors, allow it with "
                f"`traylm models trust {repo_id}`, or set trust_remote_code = false"
            )

    # ----------------------------------------------------------------- helpers

    def served(self) -> dict[str, list[str]]:
        """repo id → the engines serving it (not stopped or failed)."""
        out: dict[str, list[str]] = {}
        for engine in self._engines.engines.values():
            if engine.state in (EngineState.STOPPED, EngineState.FAILED):
                continue
            repo = _repo_of(engine.model) or engine.profile.model
            out.setdefault(repo, []).append(engine.engine_id)
        return out

    def serving_name(self, name: str) -> list[str]:
        """The engines (not stopped or failed) that serve ``name`` itself: their id or a
        served name; not one serving another name for the same folder."""
        return [
            engine.engine_id
            for engine in self._engines.engines.values()
            if engine.state not in (EngineState.STOPPED, EngineState.FAILED)
            and (engine.engine_id == name or name in engine.served_names)
        ]

    def remember_folder(self, path: str, name: str) -> None:
        """A model folder served with --model joins the library (once; a name another entry
        has, or a folder that is not a model, is left alone)."""
        folder = self.folders.ensure(Path(path), name=name)
        if folder is not None:
            self.publish(LibraryChanged(repo_id=folder.name, commit_sha="", reason="added"))

    def profile_names(self) -> list[str]:
        return self._profiles.names()

    def profiles_by_repo(self) -> dict[str, list[str]]:
        """model → the profiles that run it (blocking: reads the profile files)."""
        good, _broken = self._profiles.load_all()
        out: dict[str, list[str]] = {}
        for p in good:
            out.setdefault(p.model, []).append(p.name)
        return out


def _repo_of(model: str) -> str | None:
    """The repo id of a model reference: ``org/name`` itself, or a path inside the HF cache
    (``.../models--org--name/snapshots/<sha>``); None for any other folder."""
    if "/models--" in model:
        return repo_id_from_cache_folder("models--" + model.split("/models--", 1)[1].split("/")[0])
    try:
        return validate_repo_id(model)
    except HubError:
        return None


def _bound_hub_timeouts() -> None:
    """huggingface_hub passes ``timeout=None`` (no limit) on some metadata calls, so a stalled
    Hub would hang a daemon thread forever. Every request made by huggingface_hub in the daemon
    process gets read and connect timeouts instead."""
    from huggingface_hub import set_client_factory
    from huggingface_hub.utils._http import default_client_factory

    def force_timeout(request: Any) -> None:
        current = request.extensions.get("timeout") or {}
        if current.get("read") is None:
            request.extensions["timeout"] = {
                "connect": 5.0,
                "read": HUB_READ_TIMEOUT_S,
                "write": HUB_READ_TIMEOUT_S,
                "pool": 5.0,
            }

    def factory() -> Any:
        client = default_client_factory()
        client.event_hooks["request"].append(force_timeout)
        return client

    set_client_factory(factory)
