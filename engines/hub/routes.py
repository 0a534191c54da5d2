"""The hub feature's routes: /api/models (search, details, fit, library) and /api/downloads.

Routes (all behind the control token; errors in the OpenAI error shape with traylm's code):

    GET    /api/models                          local library → [LocalModel]
    GET    /api/models/hub                      endpoint, cache folder, whether a token is sent
    GET    /api/hub/token                       → HFTokenStatus (where the token comes from)
    PUT    /api/hub/token                       {"token"} → HFTokenStatus (the login file, 0600)
    DELETE /api/hub/token                       → HFTokenStatus (the saved login removed)
    GET    /api/models/search?q=&sort=&quant=&limit=       → [ModelSummary]
    GET    /api/models/{org}/{name}?revision=   details from metadata → ModelDetails
    GET    /api/models/{org}/{name}/fit?revision=&engine=&gpus=&context=&concurrency=
           &kv_cache_dtype=&device=             → [FitResult] (every engine × 1 and 2 GPUs
                                                  unless engine/gpus are given; each with
                                                  its placement now, from the same planner
                                                  as a load; device=cpu: the CPU build in
                                                  this computer's memory)
    GET|POST /api/models/local, DELETE /api/models/local/{name}: model folders
                                                  (engines/hub/folders_api.py)
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
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import psutil
from aiohttp import web

from engines.core.http import json_body, ok, query_int, query_text, traylm_errors
from engines.core.reach import reachable
from engines.errors import ConfigError, HubUnavailable, ModelInUse, quoted
from engines.events.hub import FitResult, LibraryChanged
from engines.gpu.inventory import RTX_4090
from engines.hub import fit
from engines.hub.folders_api import folder_routes
from engines.hub.names import validate_repo_id
from engines.hub.search import search_models
from engines.hub.service import HubFeature
from engines.hub.token import clear_token, save_token, token_status

MAX_CONTEXT = 1 << 27
"""The longest context ``fit`` estimates for, in tokens (the longest models have 10M)."""
MAX_CONCURRENCY = 1 << 16

HUB: web.AppKey[HubFeature] = web.AppKey("hub", HubFeature)
"""``request.app[HUB]``: the hub feature these routes act on (mounted by the daemon)."""


def hub_routes() -> list[web.RouteDef]:
    m = "/api/models/{org}/{name}"
    return [
        *folder_routes(HUB),  # before m, which would take /api/models/local/NAME
        web.get("/api/models", traylm_errors(models_library)),
        web.get("/api/models/hub", traylm_errors(hub_info)),
        web.get("/api/hub/token", traylm_errors(hf_token)),
        web.put("/api/hub/token", traylm_errors(set_hf_token)),
        web.delete("/api/hub/token", traylm_errors(clear_hf_token)),
        web.get("/api/models/search", traylm_errors(search)),
        web.get(m, traylm_errors(model_info)),
        web.get(m + "/fit", traylm_errors(model_fit)),
        web.post(m + "/verify", traylm_errors(verify_model)),
        web.put(m + "/trust", traylm_errors(trust_model)),
        web.delete(m, traylm_errors(delete_model)),
        web.get("/api/downloads", traylm_errors(list_downloads)),
        web.post("/api/downloads", traylm_errors(start_download)),
        web.get("/api/downloads/{id}", traylm_errors(get_download)),
        web.post("/api/downloads/{id}/{action}", traylm_errors(download_action)),
        web.delete("/api/downloads/{id}", traylm_errors(cancel_download)),
    ]


async def models_library(request: web.Request) -> web.Response:
    hub = request.app[HUB]
    profiles = await asyncio.to_thread(hub.profiles_by_repo)
    return ok(await asyncio.to_thread(hub.library.models, profiles=profiles, served=hub.served()))


async def hub_info(request: web.Request) -> web.Response:
    hub = request.app[HUB]
    a = hub.access()
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


async def hf_token(request: web.Request) -> web.Response:
    hub = request.app[HUB]
    return ok(await asyncio.to_thread(token_status, hub.settings.current.hub))


async def set_hf_token(request: web.Request) -> web.Response:
    """Save the token as the login every Hugging Face tool reads (hf auth login's file)."""
    hub = request.app[HUB]
    token = (await json_body(request)).get("token")
    if not isinstance(token, str):
        raise ConfigError('the body must be {"token": "hf_..."}')
    try:
        await asyncio.to_thread(save_token, token)
    except OSError as exc:
        raise ConfigError(f"cannot save the Hugging Face token: {exc}") from None
    return ok(await asyncio.to_thread(token_status, hub.settings.current.hub))


async def clear_hf_token(request: web.Request) -> web.Response:
    hub = request.app[HUB]
    try:
        await asyncio.to_thread(clear_token)
    except OSError as exc:
        raise ConfigError(f"cannot remove the saved Hugging Face token: {exc}") from None
    return ok(await asyncio.to_thread(token_status, hub.settings.current.hub))


async def search(request: web.Request) -> web.Response:
    hub = request.app[HUB]
    query, sort = query_text(request, "q"), query_text(request, "sort", default="downloads")
    quantization = query_text(request, "quant") or None
    access = hub.access()
    if not await reachable(access.endpoint):  # at once, not after the client's retries
        raise HubUnavailable(
            f"cannot reach {access.endpoint}; check your network connection (or hub.endpoint "
            "/ HF_ENDPOINT), or serve a model folder on this computer (`traylm models add PATH`)"
        )
    found = await asyncio.to_thread(
        search_models,
        access,
        query=query,
        sort=sort,
        quantization=quantization,
        limit=query_int(request, "limit", default=20, lo=1, hi=1000),
    )
    return ok(list(found))


def _repo(request: web.Request) -> str:
    return validate_repo_id(f"{request.match_info['org']}/{request.match_info['name']}")


async def model_info(request: web.Request) -> web.Response:
    hub = request.app[HUB]
    return ok(await hub.details(_repo(request), query_text(request, "revision") or None))


async def model_fit(request: web.Request) -> web.Response:
    hub = request.app[HUB]
    details = await hub.details(_repo(request), query_text(request, "revision") or None)
    context = query_int(request, "context", default=None, lo=1, hi=MAX_CONTEXT)
    concurrency = query_int(request, "concurrency", default=1, lo=1, hi=MAX_CONCURRENCY)
    kv = query_text(request, "kv_cache_dtype", default="auto")
    if kv not in ("auto", "fp8", "fp8_e4m3", "fp8_e5m2"):
        raise ConfigError("kv_cache_dtype must be auto, fp8, fp8_e4m3 or fp8_e5m2")
    if (
        query_text(request, "device") == "cpu"
    ):  # the CPU build: this computer's memory instead of GPUs
        ram = await asyncio.to_thread(lambda: psutil.virtual_memory().total)
        kv_bytes = hub.settings.current.engines.cpu_kv_cache_gib * fit.GIB
        return ok(
            [fit.cpu_estimate(details, kv_cache_bytes=kv_bytes, ram_bytes=ram, context_len=context)]
        )
    pool = await hub.inventory.gpus()
    engine = query_text(request, "engine") or None
    n_gpus = query_int(request, "gpus", default=None, lo=1, hi=1024)
    if engine is None and n_gpus is None:
        matrix = fit.fit_matrix(
            details, pool, context_len=context, concurrency=concurrency, kv_cache_dtype=kv
        )
        return ok(await _placed(hub, matrix))
    if engine not in (None, *fit.FIT_ENGINES):
        raise ConfigError(f"engine must be one of {', '.join(fit.FIT_ENGINES)}")
    gpus = pool or (RTX_4090, RTX_4090)
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
    return ok(await _placed(hub, [fit.estimate(details, request_)]))


async def _placed(hub: HubFeature, results: list[FitResult]) -> list[FitResult]:
    """Each row with where it would load now (the planner behind every load)."""
    if hub.placement is None:
        return results
    return [dataclasses.replace(r, placement=await hub.placement(r)) for r in results]


async def verify_model(request: web.Request) -> web.Response:
    hub = request.app[HUB]
    repo_id = _repo(request)
    found = await asyncio.to_thread(
        hub.library.verify, repo_id, query_text(request, "revision") or None
    )
    for m in found:
        reason = "verified" if m.verified == "verified" else "corrupt"
        hub.publish(LibraryChanged(repo_id=repo_id, commit_sha=m.commit_sha, reason=reason))
    return ok(found)


async def trust_model(request: web.Request) -> web.Response:
    hub = request.app[HUB]
    repo_id = _repo(request)
    value = (await json_body(request)).get("trust_remote_code")
    if not isinstance(value, bool):
        raise ConfigError("trust_remote_code must be true or false")
    await asyncio.to_thread(hub.records.set_trust, repo_id, value)
    hub.publish(LibraryChanged(repo_id=repo_id, commit_sha="", reason="trust"))
    return ok({"repo_id": repo_id, "trust_remote_code": value})


async def delete_model(request: web.Request) -> web.Response:
    hub = request.app[HUB]
    repo_id = _repo(request)
    users = hub.served().get(repo_id)
    if users:
        raise ModelInUse(
            f"{repo_id} is being served by engine {', '.join(users)}; stop it first "
            f"(`traylm stop {users[0]}`)"
        )
    for d in hub.downloads.statuses():
        if d.repo_id == repo_id and d.state in (
            "queued",
            "downloading",
            "verifying",
            "retrying",
        ):
            raise ModelInUse(f"{repo_id} is downloading ({d.id}); cancel the download first")
    freed = await asyncio.to_thread(
        hub.library.delete, repo_id, query_text(request, "revision") or None
    )
    hub.publish(LibraryChanged(repo_id=repo_id, commit_sha="", reason="deleted"))
    return ok({"repo_id": repo_id, "freed_bytes": freed})


async def list_downloads(request: web.Request) -> web.Response:
    hub = request.app[HUB]
    return ok(hub.downloads.statuses())


async def get_download(request: web.Request) -> web.Response:
    hub = request.app[HUB]
    return ok(hub.downloads.get(request.match_info["id"]))


async def start_download(request: web.Request) -> web.Response:
    hub = request.app[HUB]
    body = await json_body(request)
    if not isinstance(body.get("repo_id"), str):
        raise ConfigError('the body must name a model: {"repo_id": "org/name"}')
    repo_id = validate_repo_id(body["repo_id"])
    revision = body.get("revision")
    if revision is not None and not isinstance(revision, str):
        raise ConfigError("revision must be a string (branch, tag or commit sha)")
    trusted = await asyncio.to_thread(hub.records.trusted)
    status = await hub.downloads.add(repo_id, revision, include_code=repo_id in trusted)
    return ok(status, status=202)


async def download_action(request: web.Request) -> web.Response:
    hub = request.app[HUB]
    action = request.match_info["action"]
    ops: dict[str, Callable[[str], Awaitable[Any]]] = {
        "pause": hub.downloads.pause,
        "resume": hub.downloads.resume,
        "cancel": hub.downloads.cancel,
    }
    if action not in ops:
        raise ConfigError(f"unknown action {quoted(action)}: pause, resume or cancel")
    return ok(await ops[action](request.match_info["id"]))


async def cancel_download(request: web.Request) -> web.Response:
    hub = request.app[HUB]
    return ok(await hub.downloads.cancel(request.match_info["id"]))
