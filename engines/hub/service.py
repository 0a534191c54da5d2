"""The hub feature of the daemon: /api/models (search, details, fit, library) and /api/downloads.

Routes (all behind the control token; errors in the OpenAI error shape with traylm's code):

    GET    /api/models                          local library → [LocalModel]
    GET    /api/models/hub                      endpoint, cache folder, whether a token is sent
    GET    /api/models/search?q=&sort=&quant=&limit=       → [ModelSummary]
    GET    /api/models/{org}/{name}?revision=   details from metadata → ModelDetails
    GET    /api/models/{org}/{name}/fit?revision=&engine=&gpus=&context=&concurrency=
           &kv_cache_dtype=&device=             → [FitResult] (every engine × 1 and 2 GPUs
                                                  unless engine/gpus are given; device=cpu:
                                                  the CPU build in this computer's memory)
    POST   /api/models/{org}/{name}/verify?revision=       → [LocalModel]
    PUT    /api/models/{org}/{name}/trust       {"trust_remote_code": bool}
    DELETE /api/models/{org}/{name}?revision=   → {"repo_id", "freed_bytes"} (409 if served)
    GET    /api/downloads                       → [DownloadStatus]
    POST   /api/downloads                       {"repo_id", "revision"?} → DownloadStatus (202)
    GET    /api/downloads/{id}                  → DownloadStatus
    POST   /api/downloads/{id}/pause|resume|cancel          → DownloadStatus
    DELETE /api/downloads/{id}                  same as cancel

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

import psutil
from aiohttp import web

from engines.config import ProfileStore, Settings
from engines.errors import ConfigError, HubError, ModelInUse
from engines.events import EngineState, Event, GPUSpec, LibraryChanged, ModelDetails
from engines.gateway.control import ok, traylm_errors
from engines.hub import fit
from engines.hub.access import HubAccess, resolve_access
from engines.hub.download import DownloadManager
from engines.hub.folders import FolderRegistry
from engines.hub.folders_api import FolderRoutes
from engines.hub.library import Library
from engines.hub.names import repo_id_from_cache_folder, validate_repo_id, validate_revision
from engines.hub.records import HubRecords
from engines.hub.search import model_details, search_models
from engines.store import Store
from engines.supervisor import Supervisor

log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
DETAILS_TTL_S = 600.0
HUB_READ_TIMEOUT_S = 20.0


def _int_param(request: web.Request, name: str, default: int | None) -> int | None:
    raw = request.query.get(name)
    if raw in (None, ""):
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, not {raw!r}") from None


class HubFeature:
    name = "hub"

    def __init__(
        self,
        *,
        settings: Callable[[], Settings],
        store: Store,
        publish: Callable[[Event], None],
        logs_dir: Path,
        profiles: ProfileStore,
        supervisor: Supervisor,
        local_models_dir: Path,
    ) -> None:
        self._settings = settings
        self._publish = publish
        self._profiles = profiles
        self._supervisor = supervisor
        self.records = HubRecords(store)
        self.downloads = DownloadManager(
            settings=lambda: settings().hub,
            access=self.access,
            records=self.records,
            publish=publish,
            logs_dir=logs_dir / "downloads",
        )
        self.library = Library(access=self.access, records=self.records)
        self.folders = FolderRegistry(local_models_dir)
        self._folder_routes = FolderRoutes(
            self.folders, profiles=profiles, publish=publish, served=self._served
        )
        # (repo, revision, code included) → when asked, and the one lookup every caller shares
        self._details: dict[tuple[str, str, bool], tuple[float, asyncio.Future[ModelDetails]]] = {}
        self._gpus: tuple[GPUSpec, ...] | None = None

    def access(self) -> HubAccess:
        return resolve_access(self._settings().hub)

    async def start(self) -> None:
        await asyncio.to_thread(_bound_hub_timeouts)
        await self.downloads.start()

    async def stop(self) -> None:
        await self.downloads.stop()

    def routes(self) -> list[web.RouteDef]:
        m = "/api/models/{org}/{name}"
        return [
            *self._folder_routes.routes(),  # before m, which would take /api/models/local/NAME
            web.get("/api/models", traylm_errors(self._library)),
            web.get("/api/models/hub", traylm_errors(self._hub)),
            web.get("/api/models/search", traylm_errors(self._search)),
            web.get(m, traylm_errors(self._info)),
            web.get(m + "/fit", traylm_errors(self._fit)),
            web.post(m + "/verify", traylm_errors(self._verify)),
            web.put(m + "/trust", traylm_errors(self._trust)),
            web.delete(m, traylm_errors(self._delete)),
            web.get("/api/downloads", traylm_errors(self._downloads)),
            web.post("/api/downloads", traylm_errors(self._pull)),
            web.get("/api/downloads/{id}", traylm_errors(self._download)),
            web.post("/api/downloads/{id}/{action}", traylm_errors(self._download_action)),
            web.delete("/api/downloads/{id}", traylm_errors(self._download_cancel)),
        ]

    # ----------------------------------------------------------------- models

    async def _library(self, request: web.Request) -> web.Response:
        profiles = await asyncio.to_thread(self._profiles_by_repo)
        return ok(
            await asyncio.to_thread(self.library.models, profiles=profiles, served=self._served())
        )

    async def _hub(self, request: web.Request) -> web.Response:
        a = self.access()
        return ok(
            {
                "endpoint": a.endpoint,
                "official": a.official,
                "cache_dir": str(a.cache_dir),
                "token_found": a.token_found,
                "token_sent": a.token is not None,
                "token_withheld_reason": a.token_withheld_reason,
            }
        )

    async def _search(self, request: web.Request) -> web.Response:
        q = request.query
        found = await asyncio.to_thread(
            search_models,
            self.access(),
            query=q.get("q", ""),
            sort=q.get("sort", "downloads"),
            quantization=q.get("quant") or None,
            limit=_int_param(request, "limit", 20) or 20,
        )
        return ok(list(found))

    def _repo(self, request: web.Request) -> str:
        return validate_repo_id(f"{request.match_info['org']}/{request.match_info['name']}")

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

    async def _info(self, request: web.Request) -> web.Response:
        return ok(await self.details(self._repo(request), request.query.get("revision")))

    async def _fit(self, request: web.Request) -> web.Response:
        details = await self.details(self._repo(request), request.query.get("revision"))
        q = request.query
        context = _int_param(request, "context", None)
        concurrency = _int_param(request, "concurrency", 1) or 1
        kv = q.get("kv_cache_dtype", "auto")
        if kv not in ("auto", "fp8", "fp8_e4m3", "fp8_e5m2"):
            raise ConfigError("kv_cache_dtype must be auto, fp8, fp8_e4m3 or fp8_e5m2")
        if q.get("device") == "cpu":  # the CPU build: system memory instead of GPUs
            ram = await asyncio.to_thread(lambda: psutil.virtual_memory().total)
            kv_bytes = self._settings().engines.cpu_kv_cache_gib * fit.GIB
            return ok([fit.cpu_estimate(details, kv_cache_bytes=kv_bytes, ram_bytes=ram,
                                        context_len=context)])  # fmt: skip
        pool = await self._detected_gpus()
        engine = q.get("engine")
        n_gpus = _int_param(request, "gpus", None)
        if engine is None and n_gpus is None:
            return ok(
                fit.fit_matrix(
                    details, pool, context_len=context, concurrency=concurrency, kv_cache_dtype=kv
                )
            )
        if engine not in (None, *fit.FIT_ENGINES):
            raise ConfigError(f"engine must be one of {', '.join(fit.FIT_ENGINES)}")
        gpus = pool or (fit.RTX_4090, fit.RTX_4090)
        count = n_gpus or 1
        if count < 1 or count > max(len(gpus), 2):
            raise ConfigError(f"gpus must be between 1 and {max(len(gpus), 2)}")
        gpu_set = tuple(gpus[i % len(gpus)] for i in range(count))
        request_ = fit.FitRequest(
            engine=engine or "vllm",
            gpus=gpu_set,
            context_len=context,
            concurrency=concurrency,
            kv_cache_dtype=kv,
            gpus_available=max(len(gpus), count),
        )
        return ok([fit.estimate(details, request_)])

    async def _verify(self, request: web.Request) -> web.Response:
        repo_id = self._repo(request)
        found = await asyncio.to_thread(self.library.verify, repo_id, request.query.get("revision"))
        for m in found:
            reason = "verified" if m.verified == "verified" else "corrupt"
            self._publish(LibraryChanged(repo_id=repo_id, commit_sha=m.commit_sha, reason=reason))
        return ok(found)

    async def _trust(self, request: web.Request) -> web.Response:
        repo_id = self._repo(request)
        try:
            body = await request.json()
        except ValueError:
            raise ConfigError('the body must be JSON: {"trust_remote_code": true}') from None
        value = body.get("trust_remote_code") if isinstance(body, dict) else None
        if not isinstance(value, bool):
            raise ConfigError("trust_remote_code must be true or false")
        await asyncio.to_thread(self.records.set_trust, repo_id, value)
        self._publish(LibraryChanged(repo_id=repo_id, commit_sha="", reason="trust"))
        return ok({"repo_id": repo_id, "trust_remote_code": value})

    async def _delete(self, request: web.Request) -> web.Response:
        repo_id = self._repo(request)
        users = self._served().get(repo_id)
        if users:
            raise ModelInUse(
                f"{repo_id} is being served by engine {', '.join(users)}; stop it first "
                f"(`traylm stop {users[0]}`)"
            )
        for d in self.downloads.statuses():
            if d.repo_id == repo_id and d.state in (
                "queued",
                "downloading",
                "verifying",
                "retrying",
            ):
                raise ModelInUse(f"{repo_id} is downloading ({d.id}); cancel the download first")
        freed = await asyncio.to_thread(self.library.delete, repo_id, request.query.get("revision"))
        self._publish(LibraryChanged(repo_id=repo_id, commit_sha="", reason="deleted"))
        return ok({"repo_id": repo_id, "freed_bytes": freed})

    # ----------------------------------------------------------------- downloads

    async def _downloads(self, request: web.Request) -> web.Response:
        return ok(self.downloads.statuses())

    async def _download(self, request: web.Request) -> web.Response:
        return ok(self.downloads.get(request.match_info["id"]))

    async def _pull(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            raise ConfigError('the body must be JSON: {"repo_id": "org/name"}') from None
        if not isinstance(body, dict) or not isinstance(body.get("repo_id"), str):
            raise ConfigError('the body must name a model: {"repo_id": "org/name"}')
        repo_id = validate_repo_id(body["repo_id"])
        revision = body.get("revision")
        if revision is not None and not isinstance(revision, str):
            raise ConfigError("revision must be a string (branch, tag or commit sha)")
        trusted = await asyncio.to_thread(self.records.trusted)
        status = await self.downloads.add(repo_id, revision, include_code=repo_id in trusted)
        return ok(status, status=202)

    async def _download_action(self, request: web.Request) -> web.Response:
        action = request.match_info["action"]
        ops: dict[str, Callable[[str], Awaitable[Any]]] = {
            "pause": self.downloads.pause,
            "resume": self.downloads.resume,
            "cancel": self.downloads.cancel,
        }
        if action not in ops:
            raise HubError(f"unknown action {action!r}: pause, resume or cancel", code="not_found")
        return ok(await ops[action](request.match_info["id"]))

    async def _download_cancel(self, request: web.Request) -> web.Response:
        return ok(await self.downloads.cancel(request.match_info["id"]))

    # ----------------------------------------------------------------- launch guard

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

    def _served(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for engine in self._supervisor.engines.values():
            if engine.state in (EngineState.STOPPED, EngineState.FAILED):
                continue
            repo = _repo_of(engine.model) or engine.profile.model
            out.setdefault(repo, []).append(engine.engine_id)
        return out

    def _profiles_by_repo(self) -> dict[str, list[str]]:
        good, _broken = self._profiles.load_all()
        out: dict[str, list[str]] = {}
        for p in good:
            out.setdefault(p.model, []).append(p.name)
        return out

    async def _detected_gpus(self) -> tuple[GPUSpec, ...]:
        simulate = self._settings().gpu.simulate_gpus
        if simulate:
            return (fit.RTX_4090,) * simulate
        if self._gpus is None:
            self._gpus = await asyncio.to_thread(_nvml_gpus)
        return self._gpus


def _repo_of(model: str) -> str | None:
    """The repo id of a model reference: ``org/name`` itself, or a path inside the HF cache
    (``.../models--org--name/snapshots/<sha>``); None for any other folder."""
    if "/models--" in model:
        return repo_id_from_cache_folder("models--" + model.split("/models--", 1)[1].split("/")[0])
    try:
        return validate_repo_id(model)
    except HubError:
        return None


def _nvml_gpus() -> tuple[GPUSpec, ...]:
    """The machine's NVIDIA GPUs, or () when NVML is not available."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return ()
    try:
        found = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            memory = int(pynvml.nvmlDeviceGetMemoryInfo(h).total)
            found.append(GPUSpec(str(name), memory, f"{major}.{minor}"))
        return tuple(found)
    except Exception:
        return ()
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: S110
            pass


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
