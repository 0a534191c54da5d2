"""The daemon's launch hook for TensorRT-LLM: refuse what cannot work before anything long
starts, and for build-mode profiles serve a cached engine or build one first.

    start → GPU/precision checks → (build mode) model facts, architecture, context and fit
          → cache lookup: hit → serve it | built elsewhere → refused with the differences
                          | miss → build (progress events, cancellable) → cache → serve
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Protocol

from engines.config.live import SettingsView
from engines.config.profiles import Profile
from engines.core.reach import reachable
from engines.envs.manager import EnvInfo, load_flags
from engines.errors import ConfigError, EngineEnvError, EngineError
from engines.events.codec import Event
from engines.events.core import EngineState, Notice
from engines.events.gpu import GPUInfo
from engines.events.trt import TRTBuildProgress, TRTCacheEntry
from engines.gpu.inventory import Inventory, major_version
from engines.runtime.adapters.base import EngineRuntime, tp_env
from engines.runtime.supervisor import EngineView, LogSink, Prepare
from engines.trt.build import ETAModel, run_build
from engines.trt.cache import CacheKey, EngineCache, mismatch_error
from engines.trt.checks import check_build_model, check_fit, check_gpus, check_precision
from engines.trt.env import EXAMPLES_DIR, find_openmpi, import_facts
from engines.trt.model import ModelFacts, local_model_dir, read_model_facts
from engines.trt.plan import (
    CALIB_DATASET,
    QUANTIZE_SCRIPT,
    BuildTools,
    build_arguments,
    plan_build,
)

log = logging.getLogger(__name__)

GIB = 1024**3
TOOLS = ("quantize", "convert-llama", "build")


class EnvFinder(Protocol):
    """Finds an installed engine environment (engines/envs/manager.py EnvManager.find)."""

    def find(self, engine: str, *, device: str, version: str | None = None) -> EnvInfo: ...


def calibration_data_cached(environ: dict[str, str] | None = None) -> bool:
    """cnn_dailymail in the Hugging Face caches (the hub's datasets--abisee--cnn_dailymail, or
    the datasets library's own cache), so that quantize.py finds it offline."""
    env = os.environ if environ is None else environ
    home = Path(env.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    hub = Path(env.get("HF_HUB_CACHE") or home / "hub")
    datasets = Path(env.get("HF_DATASETS_CACHE") or home / "datasets")
    candidates = (
        hub / "datasets--abisee--cnn_dailymail",
        hub / "datasets--cnn_dailymail",
        datasets / "abisee___cnn_dailymail",
        datasets / "cnn_dailymail",
    )
    return any(path.is_dir() for path in candidates)


def _local_folder(text: str) -> Path | None:
    folder = Path(text).expanduser()
    return folder if folder.is_dir() else None


class TRTLauncher:
    """The launch hook for engine = "trtllm" (the engine control calls it before a start)."""

    def __init__(
        self,
        *,
        cache: EngineCache,
        settings: SettingsView,
        envs: EnvFinder,
        engines: EngineView,
        inventory: Inventory,
        publish: Callable[[Event], None],
    ) -> None:
        self.cache = cache
        self._settings = settings
        self._envs = envs
        self._engines = engines
        self._inventory = inventory
        self._publish = publish
        self._build_lock = asyncio.Lock()
        self.builds: dict[str, TRTBuildProgress] = {}
        self.find_mpi: Callable[[], str | None] = find_openmpi
        self.hub_reachable: Callable[[], Awaitable[bool]] = self._hub_reachable
        self.datasets_cached: Callable[[], bool] = calibration_data_cached

    async def __call__(
        self, profile: Profile, *, runtime: EngineRuntime, model: str
    ) -> Prepare | None:
        gpus = await self._inventory.gpus()
        mine = check_gpus(profile, gpus)
        check_precision(profile, mine)
        if profile.world_size > 1:
            await self._warn_without_mpi(profile)
        if profile.mode != "build":
            return None
        folder, source = await asyncio.to_thread(local_model_dir, model, profile.revision)
        facts = await asyncio.to_thread(read_model_facts, folder, source)
        check_build_model(profile, facts)
        check_fit(profile, facts, mine)
        arguments = build_arguments(profile, facts, mine)
        if arguments["checkpoint.tool"] == "quantize":
            await self._check_calibration_data(profile)
        env = await asyncio.to_thread(
            self._envs.find, "trtllm", device="cuda", version=str(runtime.version)
        )
        tools = self._tools(env, arguments["checkpoint.tool"])
        key = CacheKey(
            identity=identity(profile, facts, arguments),
            environment=environment(env, runtime, mine),
        )
        launch_profile = dataclasses.replace(
            profile, model=str(folder), served_name=profile.effective_served_name
        )
        lookup = await asyncio.to_thread(self.cache.lookup, key)
        if lookup.hit is not None:
            return self._serve_cached(launch_profile, lookup.hit)
        if lookup.refused:
            raise mismatch_error(lookup.refused)
        return self._build_then_serve(launch_profile, facts, key, arguments, tools)

    async def _check_calibration_data(self, profile: Profile) -> None:
        """ModelOpt's quantize.py calibrates on a dataset: the profile's local folder, or
        cnn_dailymail, which it downloads from the Hub. Offline and not cached, say so now
        (else the build dies minutes in with a datasets ConnectionError)."""
        if profile.calib_dataset:
            folder = await asyncio.to_thread(_local_folder, profile.calib_dataset)
            if folder is None:
                raise ConfigError(
                    f"profile {profile.name!r}: calib_dataset {profile.calib_dataset!r} is not a "
                    "folder on this computer; give the folder of a dataset saved with "
                    "`datasets` (or a copy of abisee/cnn_dailymail), or remove calib_dataset "
                    "to download cnn_dailymail from the Hub"
                )
            return
        if await asyncio.to_thread(self.datasets_cached) or await self.hub_reachable():
            return
        raise ConfigError(
            f"profile {profile.name!r} builds a quantized TensorRT engine "
            f"(quant_recipe = {profile.quant_recipe or 'full_prec'!r}): ModelOpt calibrates it on "
            f"the {CALIB_DATASET} dataset, which it downloads from the Hugging Face Hub, and "
            "the Hub cannot be reached. Give a local copy: set calib_dataset = "
            "'/path/to/cnn_dailymail' in the profile (a folder with the dataset, passed to "
            "quantize.py --calib_dataset), or build once while online"
        )

    async def _hub_reachable(self) -> bool:
        hub = self._settings.current.hub
        endpoint = hub.endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
        return await reachable(endpoint)

    # ------------------------------------------------------------------ the two paths

    def _serve_cached(self, profile: Profile, entry: TRTCacheEntry) -> Prepare:
        async def prepare(emit: LogSink) -> tuple[Profile, str]:
            emit(
                f"traylm: cache hit: serving TensorRT engine {entry.id} (built "
                f"{time.ctime(entry.created_s)} in {entry.build_s:.0f} s, "
                f"{entry.size_bytes / GIB:.2f} GiB) without rebuilding"
            )
            await asyncio.to_thread(self.cache.touch, entry.id)
            return profile, str(self.cache.engine_dir(entry.id))

        return prepare

    def _build_then_serve(
        self,
        profile: Profile,
        facts: ModelFacts,
        key: CacheKey,
        arguments: dict[str, str],
        tools: BuildTools,
    ) -> Prepare:
        async def prepare(emit: LogSink) -> tuple[Profile, str]:
            if self._build_lock.locked():
                emit("traylm: waiting for another TensorRT engine build to finish")
            async with self._build_lock:
                # built meanwhile (a restart of this engine, or another start of the same key)?
                lookup = await asyncio.to_thread(self.cache.lookup, key)
                if lookup.hit is not None:
                    return await self._serve_cached(profile, lookup.hit)(emit)
                entry = await self._build(profile, facts, key, arguments, tools, emit)
            return profile, str(self.cache.engine_dir(entry.id))

        return prepare

    async def _build(
        self,
        profile: Profile,
        facts: ModelFacts,
        key: CacheKey,
        arguments: dict[str, str],
        tools: BuildTools,
        emit: LogSink,
    ) -> TRTCacheEntry:
        emit(f"traylm: cache miss: building TensorRT engine {key.id} for {facts.source_id}")
        staging = await asyncio.to_thread(self.cache.begin, key)
        timeout_s = self._settings.current.trt.build_timeout_s
        try:
            plan = plan_build(arguments, model_dir=facts.path, work_dir=staging, tools=tools)
            eta = ETAModel(await asyncio.to_thread(self.cache.history), facts.weights_bytes)
            try:
                report = await asyncio.wait_for(
                    run_build(
                        plan,
                        engine_id=profile.name,
                        cache_id=key.id,
                        env={**tp_env(profile), "PYTHONUNBUFFERED": "1", **profile.env},
                        cwd=staging,
                        emit=emit,
                        progress=self._progress,
                        eta=eta,
                    ),
                    timeout_s,
                )
            except TimeoutError:
                raise EngineError(
                    f"the TensorRT engine build took longer than {timeout_s:.0f} s "
                    "(trt.build_timeout_s) and was stopped"
                ) from None
            entry = await asyncio.to_thread(
                self.cache.commit,
                staging,
                key,
                model=facts.source_id,
                build_s=report.total_s,
                extra={"weights_bytes": facts.weights_bytes},
            )
            await asyncio.to_thread(
                self.cache.record_build,
                {
                    "weights_bytes": facts.weights_bytes,
                    "steps": dict(report.step_s),
                    "quant_recipe": profile.quant_recipe or "none",
                    "world_size": profile.world_size,
                    "ts_s": time.time(),
                },
            )
            removed = await asyncio.to_thread(
                self.cache.prune,
                in_use=self.in_use(),
                budget_bytes=int(self._settings.current.trt.cache_budget_gib * GIB),
                keep=entry.id,
            )
            for old in removed:
                emit(f"traylm: removed cached engine {old.id} (least recently used; over budget)")
            emit(f"traylm: engine {entry.id} built in {report.total_s:.1f} s and cached")
            return entry
        finally:
            await asyncio.to_thread(shutil.rmtree, staging, True)  # moved away on success

    # ------------------------------------------------------------------ helpers

    def _progress(self, event: TRTBuildProgress) -> None:
        if event.state == "running":
            self.builds[event.engine_id] = event
        else:
            self.builds.pop(event.engine_id, None)
        self._publish(event)

    def in_use(self) -> dict[str, list[str]]:
        """cache id → engine ids serving from it (or about to)."""
        users: dict[str, list[str]] = {}
        root = self.cache.root.resolve()
        for engine in self._engines.engines.values():
            if engine.state in (EngineState.STOPPED, EngineState.FAILED):
                continue
            path = Path(engine.model)
            if path.is_absolute() and path.resolve().is_relative_to(root):
                entry_id = path.resolve().relative_to(root).parts[0]
                users.setdefault(entry_id, []).append(engine.engine_id)
        return users

    def _tools(self, env: EnvInfo, tool: str) -> BuildTools:
        examples = env.path / EXAMPLES_DIR
        script = (
            examples / QUANTIZE_SCRIPT
            if tool == "quantize"
            else examples
            / "models"
            / "core"
            / tool.removeprefix("convert-")
            / "convert_checkpoint.py"
        )
        if not script.exists():
            raise EngineEnvError(
                f"mode = 'build' runs {script.name} from {examples}, which is missing; run "
                "`traylm engines install trtllm` again with network access (it fetches the "
                "release's example scripts)"
            )
        flags = {t: load_flags("trtllm", env.version, env.path, tool=t) for t in TOOLS}
        return BuildTools(env.python, env.path / "bin" / "trtllm-build", examples, flags)

    async def _warn_without_mpi(self, profile: Profile) -> None:
        if await asyncio.to_thread(self.find_mpi) is None:
            self._publish(
                Notice(
                    level="warning",
                    title=f"{profile.name}: OpenMPI not found",
                    message="TensorRT-LLM runs tensor-parallel ranks as MPI processes and no "
                    "libmpi was found; if the start fails, `sudo apt install openmpi-bin "
                    "libopenmpi-dev`",
                    source="trtllm",
                )
            )


def identity(profile: Profile, facts: ModelFacts, arguments: dict[str, str]) -> dict[str, str]:
    return {
        "model": facts.source_id,
        "architecture": facts.architecture,
        "quant_recipe": profile.quant_recipe or "none",
        "kv_cache_dtype": profile.kv_cache_dtype,
        "tensor_parallel_size": str(profile.tensor_parallel_size),
        "pipeline_parallel_size": str(profile.pipeline_parallel_size),
        **arguments,
    }


def environment(env: EnvInfo, runtime: EngineRuntime, gpus: Sequence[GPUInfo]) -> dict[str, str]:
    facts = import_facts(env.path)
    first = gpus[0]
    return {
        "tensorrt_llm": facts.get("tensorrt_llm") or str(runtime.version),
        "tensorrt": facts.get("tensorrt") or env.packages.get("tensorrt", "unknown"),
        "gpu": ",".join(sorted({g.name for g in gpus})),
        "compute_capability": first.compute_capability,
        "driver_major": str(major_version(first.driver_version)),
        "cuda_major": str(major_version(first.cuda_version)),
    }


async def current_environment(envs: EnvFinder, inventory: Inventory) -> dict[str, str] | None:
    """The environment a build would get now (newest TensorRT-LLM env, the GPUs), if any."""
    try:
        env = await asyncio.to_thread(envs.find, "trtllm", device="cuda")
    except EngineEnvError:
        return None
    gpus = await inventory.gpus()
    if not gpus:
        return None
    return environment(env, await asyncio.to_thread(env.runtime), gpus)
