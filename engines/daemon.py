"""The traylm daemon: builds every part, serves the gateway, shuts down on a deadline.

One daemon per user (a lock file in the state dir). It writes ``daemon.json`` (pid, URL and the
control token, mode 0600) once it serves, and removes it on the way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import fcntl
import json
import logging
import os
import re
import secrets
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Protocol

from aiohttp import web

from engines import __version__
from engines.adapters import adapter_for
from engines.adapters.base import EngineRuntime
from engines.bus import EventBus
from engines.config import (
    Paths,
    Profile,
    ProfileStore,
    Settings,
    load_settings,
    profile_from_mapping,
    replace_setting,
    save_settings,
    write_bytes_atomic,
)
from engines.envs import EnvManager, has_nvidia_gpu
from engines.errors import (
    ConfigError,
    EngineEnvError,
    EngineNotFound,
    PortInUseError,
    ProfileNotFound,
    TraylmError,
)
from engines.events import DaemonStopping, EngineState, EngineStatus, EnvInstallProgress, Notice
from engines.gateway.app import GatewayContext, build_app
from engines.gateway.control import control_routes
from engines.gateway.metrics import MetricsRegistry
from engines.procs import PidRegistry, port_holder, reap_orphans
from engines.store import Store
from engines.supervisor import ManagedEngine, Prepare, Supervisor
from engines.trt.feature import EnginesFeature

log = logging.getLogger(__name__)

REPO_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


class DaemonAlreadyRunning(TraylmError):
    code = "daemon_running"


class Feature(Protocol):
    """A part of the daemon with its own routes and background work (GPU telemetry, hub, ...).

    The daemon builds each feature in ``_build_features`` (no I/O in constructors), adds its
    routes to the gateway, starts it after the gateway serves, and stops it before the engines.
    """

    name: str

    def routes(self) -> list[web.RouteDef]: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class LaunchHook(Protocol):
    """Per-engine check before a start (raises TraylmError with the fix) that may return work
    to run before the first launch (a TensorRT engine build), registered by a feature."""

    async def __call__(
        self, profile: Profile, *, runtime: EngineRuntime, model: str
    ) -> Prepare | None: ...


class Daemon:
    """Composition root. Construct (no I/O), then ``await run()``."""

    def __init__(self, paths: Paths, settings: Settings | None = None) -> None:
        self.paths = paths
        self._settings_override = settings
        self.settings = settings or Settings()
        self.bus = EventBus()
        self.supervisor = Supervisor()
        self.registry = MetricsRegistry()
        self.profiles = ProfileStore(paths.profiles_dir)
        self.envs = EnvManager(paths.envs_dir)
        self.store = Store(paths.db_path)
        self.pids = PidRegistry(paths.engine_pids_json)
        self.token = secrets.token_urlsafe(32)
        self.ctx: GatewayContext | None = None
        self.started_at_s = time.time()
        self.reaped: list[str] = []
        self._stop = asyncio.Event()
        self._lock_fh: IO[str] | None = None
        self._runner: web.AppRunner | None = None
        self._install_task: asyncio.Task[None] | None = None
        self.launch_hooks: dict[str, LaunchHook] = {}
        """engine name → hook; features register theirs while they are built."""
        self.status_providers: dict[str, Callable[[], object]] = {}
        """Extra /api/status keys (e.g. "remote"), filled by features."""
        self.features: list[Feature] = self._build_features()

    def _build_features(self) -> list[Feature]:
        features: list[Feature] = []
        # gpu (issue 3): telemetry sampler, fan curves and power limits via traylm-gpud, guard
        from engines.gpu.service import GPUFeature

        features.append(GPUFeature(self))

        # hub (issue 4): search, fit estimate, downloads, library
        from engines.hub.service import HubFeature

        self.hub = HubFeature(
            settings=lambda: self.settings,
            store=self.store,
            publish=self.bus.publish,
            logs_dir=self.paths.logs_dir,
            profiles=self.profiles,
            supervisor=self.supervisor,
            local_models_dir=self.paths.local_models_dir,
        )
        features.append(self.hub)

        # engines (issue 5): TensorRT-LLM engine cache and builds, remote fallback
        features.append(EnginesFeature(self))

        # desktop (issue 6): chats persisted for the chat window
        from engines.chats import ChatStore
        from engines.gateway.chats import DesktopFeature

        features.append(DesktopFeature(ChatStore(self.store), self.bus, self.registry))

        # bench: `traylm bench` runs (load generator worker, results in SQLite, reports)
        from engines.bench.service import BenchFeature

        features.append(BenchFeature(self))

        return features

    # ----------------------------------------------------------------- lifecycle

    @property
    def url(self) -> str:
        host = "127.0.0.1" if not self.settings.gateway.lan_sharing else "0.0.0.0"  # noqa: S104
        return f"http://{host}:{self.settings.gateway.port}"

    def request_stop(self, reason: str = "") -> None:
        log.info("stop requested%s", f": {reason}" if reason else "")
        self._stop.set()

    async def run(
        self, *, ready: asyncio.Event | None = None, install_signal_handlers: bool = True
    ) -> None:
        self.bus.bind_loop(asyncio.get_running_loop())
        self._take_lock()
        try:
            if self._settings_override is None:
                self.settings = await asyncio.to_thread(load_settings, self.paths.config_file)
            self.reaped = await asyncio.to_thread(reap_orphans, self.pids)
            await asyncio.to_thread(self.store.open)
            await self._serve()
            for feature in self.features:
                await feature.start()
            if install_signal_handlers:
                loop = asyncio.get_running_loop()
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.add_signal_handler(sig, self.request_stop, sig.name)
            if ready is not None:
                ready.set()
            log.info("traylm %s serving on %s", __version__, self.url)
            await self._stop.wait()
        finally:
            await self._shutdown()

    async def _serve(self) -> None:
        g = self.settings.gateway
        self.ctx = GatewayContext(
            self.settings, self.supervisor, self.registry, self.token, daemon=self
        )
        routes = [*control_routes(), *(r for f in self.features for r in f.routes())]
        app = build_app(self.ctx, control_routes=routes)
        runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, shutdown_timeout=2.0
        )
        await runner.setup()
        self._runner = runner
        site = web.TCPSite(
            runner, self.settings.bind_host, g.port, reuse_address=True, backlog=1024
        )
        try:
            await site.start()
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                holder = port_holder(self.settings.bind_host, g.port) or "another process"
                raise PortInUseError(
                    f"port {g.port} is held by {holder}; stop it, or move traylm with "
                    f"`traylm config set gateway.port {g.port + 1}`"
                ) from exc
            raise
        info = {
            "pid": os.getpid(),
            "url": f"http://127.0.0.1:{g.port}",
            "port": g.port,
            "token": self.token,
            "version": __version__,
            "started_at_s": self.started_at_s,
        }
        write_bytes_atomic(self.paths.daemon_json, json.dumps(info).encode(), mode=0o600)

    async def _shutdown(self) -> None:
        self.bus.publish(DaemonStopping(reason="daemon stopping"))
        if self._install_task is not None and not self._install_task.done():
            self._install_task.cancel()  # the installer removes its half-made venv
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._install_task
        for feature in reversed(self.features):
            try:
                await asyncio.wait_for(feature.stop(), 10)
            except Exception:  # boundary: one feature failing to stop must not block the rest
                log.exception("feature %s did not stop cleanly", feature.name)
        deadline = self.settings.engines.stop_timeout_s + 10
        try:
            await asyncio.wait_for(self.supervisor.stop_all(), deadline)
        except TimeoutError:
            log.error("engines did not stop within %.0f s", deadline)
        if self._runner is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._runner.cleanup(), 5)
        with contextlib.suppress(FileNotFoundError):
            if self._owns_daemon_json():
                self.paths.daemon_json.unlink()
        self.store.close()
        self._release_lock()

    def _owns_daemon_json(self) -> bool:
        try:
            return bool(json.loads(self.paths.daemon_json.read_text())["pid"] == os.getpid())
        except (OSError, ValueError, KeyError):
            return False

    def _take_lock(self) -> None:
        self.paths.state_dir.mkdir(parents=True, exist_ok=True)
        fh = (self.paths.state_dir / "daemon.lock").open("a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            running = ""
            with contextlib.suppress(OSError, ValueError, KeyError):
                info = json.loads(self.paths.daemon_json.read_text())
                running = f" (pid {info['pid']}, {info['url']})"
            raise DaemonAlreadyRunning(
                f"a traylm daemon is already running{running}; use it, or stop it with "
                "`traylm shutdown`"
            ) from None
        self._lock_fh = fh

    def _release_lock(self) -> None:
        if self._lock_fh is not None:
            self._lock_fh.close()
            self._lock_fh = None

    # ----------------------------------------------------------------- engines

    async def start_engine(self, profile: Profile) -> EngineStatus:
        """Validate everything that can be checked before launch, then start (returns at once
        with state ``starting``). Raises TraylmError subclasses with the fix in the message."""
        adapter = adapter_for(profile.engine)
        device = resolve_device(profile)
        env = self.envs.find(profile.engine, device=device, version=profile.engine_version)
        runtime = await asyncio.to_thread(env.runtime)
        model = resolve_model(profile)
        if profile.trust_remote_code:  # hub (issue 4): the user must have trusted this model
            await self.hub.require_trust(profile.name, model)
        if profile.cpu_kv_cache_gib is None and device == "cpu":
            profile = dataclasses.replace(
                profile, cpu_kv_cache_gib=self.settings.engines.cpu_kv_cache_gib
            )
        self._check_names_free(profile)
        adapter.launch(profile, runtime=runtime, port=0, model=model)  # bad flags fail here
        hook = self.launch_hooks.get(profile.engine)
        prepare = await hook(profile, runtime=runtime, model=model) if hook else None
        engine = ManagedEngine(
            profile.name,
            profile=profile,
            adapter=adapter,
            runtime=runtime,
            model=model,
            settings=self.settings.engines,
            log_path=self.paths.logs_dir / "engines" / f"{profile.name}.log",
            pids=self.pids,
            publish=self.bus.publish,
            prepare=prepare,
        )
        self.supervisor.add(engine)
        await engine.start()
        return engine.status()

    async def load_profile(self, name: str) -> Profile:
        """The profile ``name``, else the model folder registered under that name in the
        library (``traylm models add``), which is servable by name like a profile."""
        try:
            return await asyncio.to_thread(self.profiles.load, name)
        except ProfileNotFound:
            folder = await asyncio.to_thread(self.hub.folders.profile_for, name)
            if folder is None:
                raise
            return folder

    def _check_names_free(self, profile: Profile) -> None:
        for other in self.supervisor.engines.values():
            if other.engine_id == profile.name or other.state in (
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

    def engine(self, engine_id: str) -> ManagedEngine:
        engine = self.supervisor.get(engine_id)
        if engine is None:
            known = ", ".join(sorted(self.supervisor.engines)) or "none"
            raise EngineNotFound(f"no engine {engine_id!r}; engines: {known}")
        return engine

    def install_env(self, engine: str, *, device: str, version: str | None) -> dict[str, str]:
        """Start installing an engine env in the background (one at a time); progress and the
        outcome are published as EnvInstallProgress events."""
        from engines.envs import RECIPES

        if device == "auto":
            device = "cuda" if has_nvidia_gpu() else "cpu"
        if (engine, device) not in RECIPES:
            known = ", ".join(f"{e} ({d})" for e, d in RECIPES)
            raise ConfigError(f"traylm cannot install {engine!r} for {device}; it knows: {known}")
        if self._install_task is not None and not self._install_task.done():
            raise EngineEnvError("an engine install is already running; wait for it to finish")
        started = time.monotonic()

        def progress(phase: str, line: str) -> None:
            self.bus.publish(
                EnvInstallProgress(
                    engine=engine,
                    device=device,
                    phase=phase,
                    line=line,
                    elapsed_s=time.monotonic() - started,
                )
            )

        async def run() -> None:
            try:
                await self.envs.install(engine, device=device, version=version, progress=progress)
            except TraylmError as exc:
                progress("failed", exc.message)
                self.notify_error(f"installing {engine} failed", exc)

        self._install_task = asyncio.create_task(run(), name=f"install:{engine}")
        return {"engine": engine, "device": device, "version": version or "default"}

    def notify_error(self, title: str, exc: TraylmError) -> None:
        self.bus.publish(Notice(level="error", title=title, message=exc.message, source=exc.code))

    # ----------------------------------------------------------------- settings

    async def update_settings(self, changes: dict[str, Any]) -> Settings:
        """Apply ``{"section.field": value}`` changes: all validated, saved and applied, or
        none (the first invalid one raises ConfigError)."""
        new = self.settings
        for dotted, value in changes.items():
            new = replace_setting(new, dotted, value)
        await asyncio.to_thread(save_settings, self.paths.config_file, new)
        self.settings = new
        if self.ctx is not None:
            self.ctx.apply_settings(new)
        return new

    def adhoc_profile(self, data: dict[str, Any]) -> Profile:
        model = str(data.get("model", ""))
        name = data.pop("name", None) or _name_from_model(model)
        return profile_from_mapping(name, data, f"--model {model}")


def resolve_device(profile: Profile) -> str:
    if profile.device != "auto":
        return profile.device
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
            f"model {model!r} is neither a local folder nor a Hugging Face repo id "
            "(org/name); fix the profile's model"
        )
    return model


def _name_from_model(model: str) -> str:
    base = model.rstrip("/").rsplit("/", 1)[-1] or "model"
    return re.sub(r"[^A-Za-z0-9._-]", "-", base)[:64].lstrip(".-_") or "model"
