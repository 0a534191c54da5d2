"""The daemon feature for issue 5: TensorRT-LLM builds and engine cache, the remote fallback,
and the gateway's usage log.

Control API:
    GET    /api/trt/cache             cached engines (TRTCacheEntry list, LRU first)
    DELETE /api/trt/cache/{id}        remove one (refused while an engine serves from it)
    POST   /api/trt/cache/prune       {"stale": bool, "budget_gib": float|null} → removed list
    GET    /api/trt/builds            running builds (TRTBuildProgress list)
    GET    /api/remote                RemoteStatus
    POST   /api/remote/refresh-key    read the OS keyring again → RemoteStatus
/api/status gains "remote" (RemoteStatus) and "trt_builds". Events: trt.build, remote.routed.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web

from engines.errors import ConfigError
from engines.events.codec import to_plain
from engines.events.trt import TRTCacheEntry
from engines.gateway.usage import UsageRecorder
from engines.http import json_body, ok, traylm_errors
from engines.remote.service import RemoteFallback
from engines.trt.cache import EngineCache, differences
from engines.trt.launcher import GIB, TRTLauncher, current_environment

if TYPE_CHECKING:
    from engines.daemon import Daemon

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class EnginesFeature:
    name = "engines"

    def __init__(self, daemon: Daemon) -> None:
        self._d = daemon
        self.cache = EngineCache(daemon.paths.trt_engines_dir, int(200 * GIB))
        self.launcher = TRTLauncher(daemon, self.cache)
        self.remote = RemoteFallback(lambda: daemon.settings.remote, daemon.bus.publish)
        self.usage = UsageRecorder(daemon.store)
        daemon.launch_hooks["trtllm"] = self.launcher
        daemon.status_providers["remote"] = lambda: to_plain(self.remote.status())
        daemon.status_providers["trt_builds"] = lambda: to_plain(
            list(self.launcher.builds.values())
        )

    async def start(self) -> None:
        await asyncio.to_thread(self.cache.clean_partials)
        await self.remote.refresh_key()
        ctx = self._d.ctx
        assert ctx is not None
        ctx.fallback = self.remote
        ctx.usage = self.usage.record
        self.usage.start()

    async def stop(self) -> None:
        await self.usage.stop()

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/api/trt/cache", traylm_errors(self.list_cache)),
            web.delete("/api/trt/cache/{entry_id}", traylm_errors(self.remove_entry)),
            web.post("/api/trt/cache/prune", traylm_errors(self.prune)),
            web.get("/api/trt/builds", traylm_errors(self.list_builds)),
            web.get("/api/remote", traylm_errors(self.remote_status)),
            web.post("/api/remote/refresh-key", traylm_errors(self.refresh_key)),
        ]

    # ------------------------------------------------------------------ handlers

    async def entries(self) -> list[TRTCacheEntry]:
        entries = await asyncio.to_thread(self.cache.entries, self.launcher.in_use())
        here = await current_environment(self._d)
        if here is None:
            return entries
        out = []
        for e in entries:
            problem = differences(e.environment, here)
            out.append(dataclasses.replace(e, compatible=not problem, problem=problem))
        return out

    async def list_cache(self, request: web.Request) -> web.Response:
        return ok(await self.entries())

    async def remove_entry(self, request: web.Request) -> web.Response:
        entry_id = request.match_info["entry_id"]
        removed = await asyncio.to_thread(self.cache.remove, entry_id, self.launcher.in_use())
        return ok(removed)

    async def prune(self, request: web.Request) -> web.Response:
        body = await json_body(request, empty_ok=True)
        stale = bool(body.get("stale", False))
        budget = body.get("budget_gib")
        if budget is not None and (not isinstance(budget, int | float) or budget < 0):
            raise ConfigError("budget_gib must be a number of GiB (0 or more)")
        environment = await current_environment(self._d) if stale else None
        if stale and environment is None:
            raise ConfigError(
                "--stale needs the installed TensorRT-LLM and an NVIDIA GPU to compare engines "
                "against; neither answered"
            )
        removed = await asyncio.to_thread(
            self.cache.prune,
            in_use=self.launcher.in_use(),
            environment=environment,
            budget_bytes=int(budget * GIB)
            if budget is not None
            else int(self._d.settings.trt.cache_budget_gib * GIB),
        )
        return ok(removed)

    async def list_builds(self, request: web.Request) -> web.Response:
        return ok(list(self.launcher.builds.values()))

    async def remote_status(self, request: web.Request) -> web.Response:
        return ok(self.remote.status())

    async def refresh_key(self, request: web.Request) -> web.Response:
        await self.remote.refresh_key()
        return ok(self.remote.status())
