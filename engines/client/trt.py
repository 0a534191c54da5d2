"""TensorRT-LLM's engine cache and builds (engines/trt/routes.py)."""

from __future__ import annotations

from engines.client.base import ClientBase, api_path
from engines.events.codec import from_plain
from engines.events.trt import TRTBuildProgress, TRTCacheEntry


class TRTCalls(ClientBase):
    async def trt_cache(self) -> list[TRTCacheEntry]:
        """Cached TensorRT engines, least recently used first."""
        return [from_plain(TRTCacheEntry, e) for e in await self._call("GET", "/api/trt/cache")]

    async def trt_cache_remove(self, entry_id: str) -> TRTCacheEntry:
        data = await self._call("DELETE", api_path("/api/trt/cache/{}", entry_id))
        return from_plain(TRTCacheEntry, data)

    async def trt_cache_prune(
        self, *, stale: bool = False, budget_gib: float | None = None
    ) -> list[TRTCacheEntry]:
        """Remove engines built for another environment (``stale``) and least recently used
        ones past the budget (default: trt.cache_budget_gib); returns what was removed."""
        body = {"stale": stale, "budget_gib": budget_gib}
        data = await self._call("POST", "/api/trt/cache/prune", json_body=body)
        return [from_plain(TRTCacheEntry, e) for e in data]

    async def trt_builds(self) -> list[TRTBuildProgress]:
        data = await self._call("GET", "/api/trt/builds")
        return [from_plain(TRTBuildProgress, e) for e in data]
