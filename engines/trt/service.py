"""``TRTFeature``: TensorRT-LLM engine builds and the engine cache.

It owns the cache (``<data>/trt-engines``) and the launch hook for engine = "trtllm"
(engines/trt/launcher.py): the engine control calls it before each start, and it checks the GPUs
and the precision, then serves a cached engine or builds one first. Its routes are
engines/trt/routes.py; /api/status gains "trt_builds". Events: trt.build (TRTBuildProgress).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from pathlib import Path

from engines.config.live import SettingsView
from engines.events.codec import Event
from engines.events.trt import TRTBuildProgress, TRTCacheEntry
from engines.gpu.inventory import Inventory
from engines.runtime.supervisor import EngineView
from engines.trt.cache import EngineCache, differences
from engines.trt.launcher import GIB, EnvFinder, TRTLauncher, current_environment

CACHE_MAX_BYTES = int(200 * GIB)
"""The cache's hard ceiling; trt.cache_budget_gib (smaller) is what pruning keeps it under."""


class TRTFeature:
    name = "trt"

    def __init__(
        self,
        *,
        cache_dir: Path,
        settings: SettingsView,
        envs: EnvFinder,
        engines: EngineView,
        inventory: Inventory,
        publish: Callable[[Event], None],
    ) -> None:
        """No I/O."""
        self.settings = settings
        self.envs = envs
        self.inventory = inventory
        self.cache = EngineCache(cache_dir, CACHE_MAX_BYTES)
        self.launcher = TRTLauncher(
            cache=self.cache,
            settings=settings,
            envs=envs,
            engines=engines,
            inventory=inventory,
            publish=publish,
        )
        """The launch hook for engine = "trtllm"."""

    async def start(self) -> None:
        await asyncio.to_thread(self.cache.clean_partials)

    async def stop(self) -> None:
        return None

    def builds(self) -> list[TRTBuildProgress]:
        """The builds running now (/api/status "trt_builds")."""
        return list(self.launcher.builds.values())

    async def entries(self) -> list[TRTCacheEntry]:
        """Cached engines, each marked whether it can run here (this TensorRT-LLM, these GPUs)."""
        entries = await asyncio.to_thread(self.cache.entries, self.launcher.in_use())
        here = await current_environment(self.envs, self.inventory)
        if here is None:
            return entries
        out = []
        for e in entries:
            problem = differences(e.environment, here)
            out.append(dataclasses.replace(e, compatible=not problem, problem=problem))
        return out
