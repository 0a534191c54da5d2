"""What the core control API acts on: starting and stopping engines (``EngineControl``), the
daemon's status report (``DaemonStatus``), and ``ControlAPI``, the bundle the daemon mounts for
engines/control/routes.py (status, engines, profiles, settings, engine envs, events, metrics).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from engines import __version__
from engines.config.live import SettingsEditor, SettingsView
from engines.config.profiles import Profile, ProfileStore, profile_from_mapping, replica_base
from engines.core.bus import EventBus
from engines.core.jobs import Job, JobKind
from engines.core.modelinfo import read_model_info
from engines.core.procs import PidRegistry
from engines.envs.manager import RECIPES, EnvInfo, EnvManager, has_nvidia_gpu
from engines.envs.pip_progress import PipStatus
from engines.errors import (
    ConfigError,
    EngineEnvError,
    EngineNotFound,
    GPUNotFound,
    ProfileNotFound,
    TraylmError,
    quoted,
)
from engines.events.codec import Event
from engines.events.core import EngineState, EngineStatus, EnvInstallProgress, Notice
from engines.runtime.adapters import adapter_for
from engines.runtime.adapters.base import EngineRuntime
from engines.runtime.adapters.vllm_models import family_parsers
from engines.runtime.supervisor import EngineView, ManagedEngine, Prepare, Ranks, Supervisor
from engines.runtime.traffic import EngineTraffic
from engines.runtime.warm import WarmPool

log = logging.getLogger(__name__)

PIP_EVENT_EVERY_S = 0.5  # download progress events, at most (a new file or step: at once)
REPO_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


class LaunchHook(Protocol):
    """Per-engine check before a start (raises TraylmError with the fix) that may return work
    to run before the first launch (a TensorRT engine build). The daemon gives EngineControl
    one per engine name (engines/trt/launcher.py for "trtllm")."""

    async def __call__(
        self, profile: Profile, *, runtime: EngineRuntime, model: str
    ) -> Prepare | None: ...


Spread = Callable[[Profile, EngineRuntime, str], Ranks]
"""(profile, runtime, model) → the ranks on the other boxes of a model across boxes
(engines/multinode/service.py MultiNode.ranks)."""
Place = Callable[[Profile], Awaitable[Profile]]
"""Put a profile on GPUs before it starts (engines/ondemand/service.py place_started)."""
TrustCheck = Callable[[str, str], Awaitable[None]]
"""(profile name, model) → None, or ConfigError when the profile runs code the user did not
trust (engines/hub/service.py HubFeature.require_trust)."""


async def _always(_profile: str, _model: str) -> None:
    return None


class EngineControl:
    """Starts engines after checking everything that can be checked before launch, finds them,
    and installs engine environments in the background."""

    def __init__(
        self,
        *,
        supervisor: Supervisor,
        envs: EnvManager,
        settings: SettingsView,
        logs_dir: Path,
        pids: PidRegistry,
        publish: Callable[[Event], None],
        launch_hooks: Mapping[str, LaunchHook],
        check_trust: TrustCheck,
        check_available: TrustCheck = _always,
        traffic: EngineTraffic | None = None,
        cache_dir: Path | None = None,
        warm: WarmPool | None = None,
        place: Place | None = None,
        gpu_count: Callable[[], Awaitable[int]] | None = None,
        spread: Spread | None = None,
        capability: Callable[[tuple[int, ...]], Awaitable[str]] | None = None,
    ) -> None:
        """``cache_dir``: where engines keep their compile caches (one folder per engine env);
        ``warm``: the processes started ahead for the next start of a profile; ``place``: puts a
        profile on GPUs before it starts (models on demand: resolves ``gpus = "auto"``, making
        room by unloading idle models, and books the engine); ``traffic``: the gateway's requests
        in flight, which each engine's supervision reads and ends (engines/runtime/traffic.py);
        ``gpu_count``: the GPUs engines can be placed on (the inventory, simulated ones
        included; without it the GPU count is not checked); ``capability``: (CUDA indices) →
        the oldest compute capability of those GPUs ("" unknown), which the adapters check a
        quantization against."""
        self._gpu_count = gpu_count
        self._capability = capability
        self._spread = spread
        self._supervisor = supervisor
        self._envs = envs
        self._settings = settings
        self._logs_dir = logs_dir
        self._cache_dir = cache_dir
        self._warm = warm
        self._pids = pids
        self._publish = publish
        self._launch_hooks = dict(launch_hooks)
        self._check_trust = check_trust
        self._traffic = traffic
        self._place = place
        self._check_available = check_available
        """(profile name, model) → None, or an error when the engine could not get the model
        (a Hub model, not downloaded, without network: HubFeature.require_available)."""
        self.installs: JobKind[EnvInfo | None] = JobKind(
            "engine install",
            publish=publish,
            finished=lambda _: None,  # the install's own done/failed/cancelled line says it
            busy=lambda _: "an engine install is already running; wait for it to finish",
            error=EngineEnvError,
        )
        """Engine env installs, one at a time; a job's record is the env once installed."""
        self._pip_published_s = 0.0

    async def stop(self) -> None:
        """Cancel a running install (the installer removes its half-made venv)."""
        await self.installs.stop()

    async def check_start(self, profile: Profile) -> None:
        """Everything ``start_engine`` checks before it places and launches (models on demand
        asks first, so that a load that cannot start unloads nothing to make room). Raises
        TraylmError subclasses with the fix in the message."""
        await self._checked(profile)

    async def start_engine(
        self, profile: Profile, *, placed: bool = False, warm: bool = True
    ) -> EngineStatus:
        """Validate everything that can be checked before launch, place it on GPUs (unless
        ``placed``), then start (returns at once with state ``starting``). Raises TraylmError
        subclasses with the fix in the message. ``warm=False``: no warm process is taken for
        this start nor prepared for the next (a measured start that must be cold, and must not
        evict the user's warm process)."""
        profile, runtime, model = await self._checked(profile)
        settings = self._settings.current.engines
        if self._place is not None and not placed:
            profile = await self._place(profile)
        hook = self._launch_hooks.get(profile.engine)
        prepare = await hook(profile, runtime=runtime, model=model) if hook else None
        ranks = self._spread(profile, runtime, model) if profile.boxes and self._spread else None
        engine = ManagedEngine(
            profile.name,
            profile=profile,
            adapter=adapter_for(profile.engine),
            runtime=runtime,
            model=model,
            settings=settings,
            log_path=self._logs_dir / "engines" / f"{profile.name}.log",
            pids=self._pids,
            publish=self._publish,
            prepare=prepare,
            traffic=self._traffic,
            warm=self._warm if warm else None,
            ranks=ranks,
        )
        self._supervisor.add(engine)
        await engine.start()
        return engine.status()

    async def command_for(self, profile: Profile) -> dict[str, Any]:
        """The command line and environment ``start_engine`` would launch for ``profile`` on
        this computer (its engine env, GPUs and flags), after the same checks; starts nothing.
        The port is the daemon's choice at start (shown as 0); ``gpus = 'auto'`` is placed at
        start (shown on the first GPUs of its count)."""
        profile, runtime, model = await self._checked(profile)
        notes = ["the port is picked when the engine starts (shown as 0)"]
        if profile.gpus_auto:
            profile = dataclasses.replace(profile, gpus=tuple(range(profile.gpu_count)))
            notes.append(
                "gpus = 'auto' is placed when it starts; shown on GPUs "
                + ",".join(str(g) for g in profile.gpus)
            )
        spec = adapter_for(profile.engine).launch(profile, runtime=runtime, port=0, model=model)
        return {
            "profile": profile.name,
            "engine": runtime.engine,
            "version": str(runtime.version),
            "device": runtime.device,
            "argv": list(spec.argv),
            "env": dict(spec.env),
            "files": sorted(spec.files),
            "notes": notes,
        }

    async def _checked(self, profile: Profile) -> tuple[Profile, EngineRuntime, str]:
        """The profile as it will launch (its CPU KV cache filled in), its engine runtime and
        model, once every check before a launch passed."""
        adapter = adapter_for(profile.engine)
        device = resolve_device(profile)
        if device == "cuda" and self._gpu_count is not None:  # the first reason: no GPU
            _check_gpus(profile, await self._gpu_count())
        env = self._envs.find(profile.engine, device=device, version=profile.engine_version)
        runtime = await asyncio.to_thread(env.runtime)
        if self._cache_dir is not None:
            runtime = dataclasses.replace(runtime, cache_dir=self._cache_dir / env.name)
        model = resolve_model(profile)
        settings = self._settings.current.engines
        if profile.boxes and self._spread is None:
            raise ConfigError(
                f"profile {profile.name!r} lists boxes, but this daemon runs without paired "
                "boxes; pair them first (`traylm pair`)"
            )
        if profile.trust_remote_code:  # the user must have trusted this model's code
            await self._check_trust(profile.name, model)
        await self._check_available(profile.name, model)  # offline and not downloaded: say so
        if profile.cpu_kv_cache_gib is None and device == "cpu":
            profile = dataclasses.replace(profile, cpu_kv_cache_gib=settings.cpu_kv_cache_gib)
        self._check_names_free(profile)
        check = profile
        if profile.gpus_auto:  # placed below: check the flags on some GPUs of that count
            check = dataclasses.replace(profile, gpus=tuple(range(profile.gpu_count)))
        if device == "cuda" and self._capability is not None:
            cc = await self._capability(check.gpus)
            runtime = dataclasses.replace(runtime, compute_capability=cc)
        adapter.launch(check, runtime=runtime, port=0, model=model)  # bad flags fail here
        return profile, runtime, model

    def _check_names_free(self, profile: Profile) -> None:
        for other in self._supervisor.engines.values():
            if replica_base(other.engine_id) == replica_base(profile.name) or other.state in (
                EngineState.STOPPED,
                EngineState.FAILED,
            ):
                continue
            clash = set(other.served_names) & set(profile.served_names)
            if clash:
                raise ConfigError(
                    f"{', '.join(sorted(clash))} is already served by engine "
                    f"{other.engine_id!r}; stop it first or give this profile another served_name"
                )

    async def stop_engine(self, engine_id: str) -> EngineStatus:
        """Stop an engine; one whose start had failed is then forgotten (``traylm status`` no
        longer lists it; its stopped state was published)."""
        engine = self.engine(engine_id)
        failed = engine.state == EngineState.FAILED
        await engine.stop()
        if failed:
            self._supervisor.remove(engine_id)
        return engine.status()

    def statuses(self) -> list[EngineStatus]:
        return [e.status() for e in self._supervisor.engines.values()]

    def engine(self, engine_id: str) -> ManagedEngine:
        engine = self._supervisor.get(engine_id)
        if engine is None:
            known = ", ".join(sorted(self._supervisor.engines)) or "none"
            raise EngineNotFound(f"no engine {quoted(engine_id)}; engines: {known}")
        return engine

    def install_env(self, engine: str, *, device: str, version: str | None) -> dict[str, str]:
        """Start installing an engine env in the background (one at a time); progress and the
        outcome are published as EnvInstallProgress events."""
        device = auto_device(device)
        self.begin_install(engine, device=device, version=version)
        return {"engine": engine, "device": device, "version": version or "default"}

    def begin_install(
        self, engine: str, *, device: str, version: str | None, held: str = ""
    ) -> Job[EnvInfo | None]:
        """The install as a job of its own (one at a time), published as EnvInstallProgress
        events; the job's record is the env it installed (None: it failed, with the error as
        its message). ``held``: EnvManager.install's (a guarded upgrade installs the new
        version held back)."""
        device = auto_device(device)
        if (engine, device) not in RECIPES:
            known = ", ".join(f"{e} ({d})" for e, d in RECIPES)
            raise ConfigError(f"traylm cannot install {engine!r} for {device}; it knows: {known}")
        self.installs.refuse_if_running()
        started = time.monotonic()
        last: list[PipStatus] = []  # the last pip status published (a few a second at most)

        def progress(phase: str, line: str, pip: PipStatus | None = None) -> None:
            pip = pip or (last[-1] if last and phase == "install" else None)
            event = EnvInstallProgress(
                engine=engine,
                device=device,
                phase=phase,
                line=line,
                elapsed_s=time.monotonic() - started,
            )
            self._publish(event if pip is None else _with_pip(event, pip))

        def on_pip(status: PipStatus) -> None:
            changed = not last or (last[-1].step, last[-1].package) != (status.step, status.package)
            if changed or time.monotonic() - self._pip_published_s >= PIP_EVENT_EVERY_S:
                self._pip_published_s = time.monotonic()
                last[:] = [status]
                progress("install", "", status)

        async def run(_: Job[EnvInfo | None]) -> EnvInfo:
            try:
                return await self._envs.install(
                    engine,
                    device=device,
                    version=version,
                    progress=progress,
                    on_pip=on_pip,
                    held=held,
                )
            except TraylmError as exc:
                progress("failed", exc.message)
                self.notify_error(f"installing {engine} failed", exc)
                raise
            except asyncio.CancelledError:
                progress("cancelled", "the install was cancelled; its unfinished folder is gone")
                raise

        return self.installs.start(None, run)

    async def cancel_install(self) -> bool:
        """Cancel the running install (the installer removes its half-made venv and says
        ``cancelled``); False when none runs."""
        if self.installs.current is None:
            return False
        await self.installs.cancel()
        return True

    def notify_error(self, title: str, exc: TraylmError) -> None:
        self._publish(Notice(level="error", title=title, message=exc.message, source=exc.code))


def _with_pip(event: EnvInstallProgress, pip: PipStatus) -> EnvInstallProgress:
    return dataclasses.replace(
        event,
        step=pip.step,
        package=pip.package,
        done_bytes=pip.done_bytes,
        file_done_bytes=pip.file_done_bytes,
        file_total_bytes=pip.file_total_bytes,
    )


class DaemonStatus:
    """The /api/status report: the daemon's own facts plus the keys features provide."""

    def __init__(
        self,
        *,
        settings: SettingsView,
        engines: EngineView,
        paused: Callable[[], str | None],
        reaped: Callable[[], list[str]],
        bound: Callable[[], list[str]],
        providers: Mapping[str, Callable[[], object]],
    ) -> None:
        """``bound``: the gateway's listening sockets now ("127.0.0.1:8000");
        ``providers``: extra keys (e.g. "remote", "bench") → their value now."""
        self._settings = settings
        self._engines = engines
        self._paused = paused
        self._reaped = reaped
        self._bound = bound
        self._providers = dict(providers)
        self.started_at_s = time.time()

    def report(self) -> dict[str, Any]:
        s = self._settings.current
        bound = self._bound()
        return {
            "version": __version__,
            "pid": os.getpid(),
            "url": f"http://127.0.0.1:{s.gateway.port}",
            "bind_host": bound[0].rsplit(":", 1)[0].strip("[]") if bound else "",
            "bound": bound,
            "lan_sharing": s.gateway.lan_sharing,
            "api_key_required": bool(s.gateway.api_key_sha256),
            "started_at_s": self.started_at_s,
            "engines": [e.status() for e in self._engines.engines.values()],
            "paused": self._paused(),
            "reaped_orphans": self._reaped(),
            **{key: provide() for key, provide in self._providers.items()},
        }


class StopRequest(Protocol):
    def __call__(self, reason: str = "", *, close_apps: bool = False) -> None: ...


async def _nothing_to_wait_for() -> None:
    return None


@dataclass(frozen=True)
class ControlAPI:
    """Everything the core control routes act on, given by the daemon."""

    engines: EngineControl
    status: DaemonStatus
    profiles: ProfileStore
    envs: EnvManager
    settings: SettingsEditor
    bus: EventBus
    metrics_text: Callable[[], str]
    """The gateway's Prometheus text (/api/metrics: readable with the control token even when
    API keys guard /metrics)."""
    request_stop: StopRequest
    remember_folder: Callable[[str, str], object] = lambda _path, _name: None
    """(folder, name): register a model folder started with --model in the library, unless
    it is there already (blocking: called through a thread)."""
    folder_profile: Callable[[str], Profile | None] = lambda _name: None
    """A model folder registered in the library, as the profile that serves it by its name
    (``traylm models add``; blocking: called through a thread). None: no such folder."""
    settled: Callable[[], Awaitable[None]] = _nothing_to_wait_for
    """Wait until what a settings change moves while the daemon runs (Ollama's listener)
    has moved."""

    async def load_profile(self, name: str) -> Profile:
        """The profile ``name``, else the model folder registered under that name."""
        try:
            return await asyncio.to_thread(self.profiles.load, name)
        except ProfileNotFound:
            folder = await asyncio.to_thread(self.folder_profile, name)
            if folder is None:
                raise
            return folder


def _check_gpus(profile: Profile, here: int) -> None:
    """A CUDA profile on a computer with too few GPUs: refused in words, before anything else
    (the engine, the model) is looked at."""
    if here == 0:
        brief = "needs an NVIDIA GPU (this computer has none)"
        raise GPUNotFound(
            f"{profile.name} {brief}; on the CPU, serve a model folder (`traylm models add "
            'PATH`) or a profile with device = "cpu"',
            brief=brief,
        )
    if profile.gpu_count > here:
        brief = f"needs {profile.gpu_count} NVIDIA GPUs ({here} here)"
        raise GPUNotFound(
            f"{profile.name} {brief}: lower its tensor_parallel_size × pipeline_parallel_size "
            f"× data_parallel_size to {here}",
            brief=brief,
        )


def resolve_device(profile: Profile) -> str:
    return auto_device(profile.device)


def auto_device(device: str) -> str:
    """``device``, with "auto" made "cuda" where an NVIDIA driver is, else "cpu"."""
    if device != "auto":
        return device
    return "cuda" if has_nvidia_gpu() else "cpu"


def resolve_model(profile: Profile) -> str:
    model = profile.model
    if model.startswith(("/", "./", "../", "~")):
        path = Path(model).expanduser().resolve()
        if not path.is_dir():
            raise ConfigError(
                f"model folder {model} does not exist; check the profile's model "
                "path, or use a Hugging Face repo id (org/name)"
            )
        if not (path / "config.json").exists():
            raise ConfigError(
                f"{model} has no config.json, so it is not a Hugging Face model "
                "folder; point the profile at the folder that holds config.json"
            )
        return str(path)
    if not REPO_ID_RE.match(model) or ".." in model or "--" in model:
        raise ConfigError(
            f"model {quoted(model)} is neither a local folder nor a Hugging Face repo id "
            "(org/name); fix the profile's model"
        )
    return model


def adhoc_profile(data: dict[str, Any]) -> Profile:
    """A profile from a start request's fields ({"model": M, "engine": ..., "name"?: N}). For
    vLLM the tool-call and reasoning parsers come from the model's family unless given.
    Blocking: reads the model's config.json (local folder or HF cache)."""
    model = str(data.get("model", ""))
    name = data.pop("name", None) or _name_from_model(model)
    if data.get("engine", "vllm") == "vllm":
        info = read_model_info(model) if model else None
        parsers = family_parsers(model, info.config if info else None)
        data.setdefault("tool_parser", parsers.tool)
        data.setdefault("reasoning_parser", parsers.reasoning)
    return profile_from_mapping(name, data, f"--model {model}")


def _name_from_model(model: str) -> str:
    base = model.rstrip("/").rsplit("/", 1)[-1] or "model"
    return re.sub(r"[^A-Za-z0-9._-]", "-", base)[:64].lstrip(".-_") or "model"
