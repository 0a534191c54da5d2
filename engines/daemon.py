"""The traylm daemon: the composition root. It builds every part from already-loaded settings,
hands each exactly what it uses, mounts their routes on the gateway, serves, and shuts down on a
deadline. No part imports this module back (an import-linter contract checks it).

One daemon per user (a lock file in the state dir). It writes ``daemon.json`` (pid, URL and the
control token, mode 0600) once it serves, and removes it on the way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import json
import logging
import os
import secrets
import signal
from typing import IO, Protocol

from aiohttp import web

from engines import __version__, daemon_lock
from engines.bench.routes import BENCH, bench_routes
from engines.bench.service import BenchFeature
from engines.bus import EventBus
from engines.chats.routes import CHATS, chats_routes
from engines.chats.service import ChatsFeature
from engines.chats.store import ChatStore
from engines.config import Paths, Settings
from engines.control.routes import CONTROL, control_routes
from engines.control.service import ControlAPI, DaemonStatus, EngineControl
from engines.envs import EnvManager
from engines.errors import PortInUseError, TraylmError
from engines.events.codec import to_plain
from engines.events.core import DaemonStopping
from engines.filemodes import make_private
from engines.gateway.app import build_app
from engines.gateway.connections import ConnectionGate, Listener, http_logger
from engines.gateway.express import ExpressLane
from engines.gateway.service import GatewayContext
from engines.gateway.usage import UsageRecorder
from engines.gpu.routes import GPU, gpu_routes
from engines.gpu.service import GPUFeature
from engines.http import mount
from engines.hub.routes import HUB, hub_routes
from engines.hub.service import HubFeature
from engines.metrics import MetricsRegistry
from engines.ondemand.catalog import FolderSource
from engines.ondemand.routes import ONDEMAND, ondemand_routes
from engines.ondemand.service import GPUReadings, ModelsOnDemand
from engines.procs import (
    MAX_CONNECTIONS_CEILING,
    PidRegistry,
    connections_for,
    port_holder,
    raise_open_files_limit,
    reap_orphans,
)
from engines.profiles import ProfileStore
from engines.remote.routes import REMOTE, remote_routes
from engines.remote.service import RemoteFallback
from engines.settings import LiveSettings
from engines.store import Store
from engines.supervisor import ManagedEngine, Supervisor
from engines.tomlfile import write_bytes_atomic
from engines.traffic import EngineTraffic
from engines.trt.env import env_extras
from engines.trt.routes import TRT, trt_routes
from engines.trt.service import TRTFeature
from engines.warm import WarmPool

log = logging.getLogger(__name__)

DAEMON_JSON_CHECK_S = 2.0


class DaemonAlreadyRunning(TraylmError):
    code = "daemon_running"


class Feature(Protocol):
    """A part of the daemon with background work. The daemon starts each after the gateway
    serves (in the order of ``Daemon.features``) and stops them in reverse before the engines.
    Constructors do no I/O."""

    name: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class Daemon:
    """Composition root. Construct (no I/O), then ``await run()``."""

    def __init__(self, paths: Paths, settings: Settings | LiveSettings) -> None:
        """``settings``: loaded and merged with the command line's overrides before anything
        is built (``LiveSettings.load``); plain Settings are used as config.toml's values."""
        self.paths = paths
        self.live = (
            settings
            if isinstance(settings, LiveSettings)
            else LiveSettings(settings, config_file=paths.config_file)
        )
        self.bus = EventBus()
        self.traffic = EngineTraffic()
        self.supervisor = Supervisor()
        self.warm = WarmPool(self.live.current.engines.warm_starts)
        self.registry = MetricsRegistry()
        self.profiles = ProfileStore(paths.profiles_dir)
        self.store = Store(paths.db_path)
        self.pids = PidRegistry(paths.engine_pids_json)
        self.token = secrets.token_urlsafe(32)
        self.reaped: list[str] = []
        self._stop = asyncio.Event()
        self._close_apps = False
        self._lock_fh: IO[str] | None = None
        self._runner: web.AppRunner | None = None
        self.listener: Listener | None = None
        self._fd_connections = MAX_CONNECTIONS_CEILING
        g = self.live.current.gateway
        self.gate = ConnectionGate(
            max_connections=g.max_connections,
            header_timeout_s=g.header_timeout_s,
            lan=g.lan_sharing,
        )
        self.live.subscribe(self._listen_settings)
        self._info: dict[str, object] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._build()

    def _build(self) -> None:
        """Every part, each given what it uses. Order matters only where one part is another's
        dependency (the gateway before the GPU feature, the GPU inventory before hub and trt)."""
        live, paths, publish = self.live, self.paths, self.bus.publish
        self.usage = UsageRecorder(self.store, live)
        self.chats = ChatsFeature(ChatStore(self.store), publish)
        self.remote = RemoteFallback(lambda: live.current.remote, publish)
        # models on demand is the gateway's router, so it comes first; what it reads of parts
        # built after it (the GPU feature, the hub library, engine starts) goes through lambdas
        self.ondemand = ModelsOnDemand(
            settings=live,
            engines=self.supervisor,
            start_engine=lambda p: self.control.start_engine(p, placed=True),
            check_start=lambda p: self.control.check_start(p),
            profiles=self.profiles,
            library=lambda: self.hub.library.models(),
            gpus=GPUReadings(
                gpus=lambda: self.gpu.inventory.gpus(),
                latest=lambda: self.gpu.sampler.latest,
                simulated=lambda: self.gpu.backend.simulated,
            ),
            activity=lambda upstream: self.ctx.activity(upstream),
            publish=publish,
            attached_file=paths.config_dir / "attached.toml",
            extra_sources=(
                FolderSource(lambda: self.hub.folders.list(), lambda: set(self.profiles.names())),
            ),
        )
        self.ctx = GatewayContext(
            settings=live,
            routing=self.ondemand,
            registry=self.registry,
            control_token=self.token,
            fallback=self.remote,
            usage=self.usage.record,
            traffic=self.traffic,
            replies=self.chats.tap_reply,
        )
        self.gate.lane = ExpressLane(self.ctx)
        self.gpu = GPUFeature(
            settings=live,
            bus=self.bus,
            store=self.store,
            engines=self.supervisor,
            gateway=self.ctx,
            state_dir=paths.state_dir,
        )
        self.registry.collector(self.gpu.exposition)
        inventory = self.gpu.inventory
        self.envs = EnvManager(paths.envs_dir, extras=env_extras(inventory))
        self.hub = HubFeature(
            settings=live,
            store=self.store,
            publish=publish,
            logs_dir=paths.logs_dir,
            profiles=self.profiles,
            engines=self.supervisor,
            inventory=inventory,
            placement=self.ondemand.placer.place_fit,
            local_models_dir=paths.local_models_dir,
        )
        self.trt = TRTFeature(
            cache_dir=paths.trt_engines_dir,
            settings=live,
            envs=self.envs,
            engines=self.supervisor,
            inventory=inventory,
            publish=publish,
        )
        self.bench = BenchFeature(
            store=self.store,
            routing=self.supervisor,
            settings=live,
            control_token=self.token,
            logs_dir=paths.logs_dir,
            publish=publish,
        )
        self.control = EngineControl(
            supervisor=self.supervisor,
            envs=self.envs,
            settings=live,
            logs_dir=paths.logs_dir,
            cache_dir=paths.engine_cache_dir,
            warm=self.warm,
            pids=self.pids,
            publish=publish,
            launch_hooks={"trtllm": self.trt.launcher},
            check_trust=self.hub.require_trust,
            check_available=self.hub.require_available,
            traffic=self.traffic,
            place=self.ondemand.placer.place_started,
        )
        self.status = DaemonStatus(
            settings=live,
            engines=self.supervisor,
            paused=lambda: self.ctx.paused,
            reaped=lambda: self.reaped,
            bound=lambda: self.listener.addresses() if self.listener is not None else [],
            providers={
                "connections": self._connections_status,
                "remote": lambda: to_plain(self.remote.status()),
                "trt_builds": lambda: to_plain(self.trt.builds()),
                "bench": self.bench.status,
                "models": lambda: to_plain(self.ondemand.ps()),
            },
        )
        self.features: list[Feature] = [
            self.gpu,
            self.hub,
            self.ondemand,
            self.trt,
            self.remote,
            self.usage,
            self.chats,
            self.bench,
        ]

    def _app(self) -> web.Application:
        """The gateway's app with every feature's routes, each reachable by its typed key."""
        app = build_app(self.ctx)
        control = ControlAPI(
            engines=self.control,
            status=self.status,
            profiles=self.profiles,
            envs=self.envs,
            settings=self.live,
            bus=self.bus,
            metrics_text=self.registry.render,
            request_stop=self.request_stop,
            folder_profile=self.hub.folders.profile_for,
            remember_folder=self.hub.remember_folder,
        )
        mount(app, CONTROL, control, control_routes())
        mount(app, GPU, self.gpu, gpu_routes())
        mount(app, HUB, self.hub, hub_routes())
        mount(app, TRT, self.trt, trt_routes())
        mount(app, REMOTE, self.remote, remote_routes())
        mount(app, CHATS, self.chats, chats_routes())
        mount(app, BENCH, self.bench, bench_routes())
        mount(app, ONDEMAND, self.ondemand, ondemand_routes())
        return app

    def _connections_status(self) -> dict[str, int]:
        gate = self.gate
        return {
            "open": gate.open,
            "max": gate.max_connections,
            "refused_total": gate.refused_total,
            "evicted_total": gate.evicted_total,
            "head_timeouts_total": gate.timed_out_total,
            "foreign_refused_total": gate.foreign_total,
        }

    def _listen_settings(self, settings: Settings) -> None:
        """Connection limits apply at once; LAN sharing turned on or off moves the socket
        (and, off, closes the connections other computers hold)."""
        g = settings.gateway
        self.gate.configure(
            max_connections=min(g.max_connections, self._fd_connections),
            header_timeout_s=g.header_timeout_s,
            lan=g.lan_sharing,
        )
        if not g.lan_sharing and (closed := self.gate.close_foreign()):
            log.warning("LAN sharing is off: closed %d connections from other computers", closed)
        listener = self.listener
        if listener is not None and listener.host != settings.bind_host:
            task = asyncio.create_task(self._rebind(listener, settings.bind_host))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _rebind(self, listener: Listener, host: str) -> None:
        try:
            await listener.rebind(host)
        except OSError as exc:
            log.error(
                "the gateway could not move to %s:%d (%s); it still listens on %s",
                host,
                listener.port,
                exc.strerror,
                ", ".join(listener.addresses()) or "nothing",
            )

    @property
    def settings(self) -> Settings:
        """The settings in use now (config.toml's values under the overrides)."""
        return self.live.current

    def engine(self, engine_id: str) -> ManagedEngine:
        return self.control.engine(engine_id)

    # ----------------------------------------------------------------- lifecycle

    @property
    def url(self) -> str:
        host = "127.0.0.1" if not self.settings.gateway.lan_sharing else "0.0.0.0"  # noqa: S104
        return f"http://{host}:{self.settings.gateway.port}"

    def request_stop(self, reason: str = "", *, close_apps: bool = False) -> None:
        """Stop; ``close_apps``: the tray app closes too (`traylm shutdown`)."""
        log.info("stop requested%s", f": {reason}" if reason else "")
        self._close_apps = self._close_apps or close_apps
        self._stop.set()

    async def run(
        self,
        *,
        ready: asyncio.Event | None = None,
        install_signal_handlers: bool = True,
        freeze_heap: bool = False,
    ) -> None:
        """Serve until stopped. ``freeze_heap``: the daemon owns its process (`traylm serve`),
        so what start-up built is moved out of the garbage collector's sight."""
        self.bus.bind_loop(asyncio.get_running_loop())
        for line in await asyncio.to_thread(make_private, self.paths):
            log.warning("made private (was readable by others): %s", line)
        self._take_lock()
        self._fd_connections = connections_for(raise_open_files_limit())
        self._listen_settings(self.settings)
        try:
            if install_signal_handlers:  # from here on: a SIGTERM during start-up stops cleanly
                loop = asyncio.get_running_loop()
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.add_signal_handler(sig, self.request_stop, sig.name)
            self.reaped = await asyncio.to_thread(reap_orphans, self.pids)
            await asyncio.to_thread(self.store.open)
            await self._serve()
            for feature in self.features:
                await feature.start()
            keeper = asyncio.create_task(self._keep_daemon_json(), name="daemon.json")
            self._background.add(keeper)
            if freeze_heap:
                # what start-up built lives as long as the process: the collector stops scanning
                # it (tests/perf/gateway_bench.py --paced: the relay's allocations per token had
                # it walk that heap again and again)
                gc.freeze()
            if ready is not None:
                ready.set()
            log.info("traylm %s serving on %s", __version__, self.url)
            await self._stop.wait()
        finally:
            await self._shutdown()

    async def _serve(self) -> None:
        g = self.settings.gateway
        runner = web.AppRunner(
            self._app(),
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=2.0,
            logger=http_logger(),
            keepalive_timeout=g.keepalive_timeout_s,
        )
        await runner.setup()
        self._runner = runner
        self.listener = Listener(runner, port=g.port, gate=self.gate)
        try:
            await self.listener.bind(self.settings.bind_host)
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                holder = port_holder(self.settings.bind_host, g.port) or "another process"
                raise PortInUseError(
                    f"port {g.port} is held by {holder}; stop it, or move traylm with "
                    f"`traylm config set gateway.port {g.port + 1}`"
                ) from exc
            raise
        self._info = {
            "pid": os.getpid(),
            "url": f"http://127.0.0.1:{g.port}",
            "port": g.port,
            "token": self.token,
            "version": __version__,
            "started_at_s": self.status.started_at_s,
        }
        self._write_daemon_json()
        if self._lock_fh is not None:
            daemon_lock.note(self._lock_fh, port=g.port)

    def _write_daemon_json(self) -> None:
        write_bytes_atomic(self.paths.daemon_json, json.dumps(self._info).encode(), mode=0o600)

    async def _keep_daemon_json(self) -> None:
        """Write daemon.json again when it was deleted or overwritten while the daemon runs
        (every client finds the daemon and its token through it)."""
        while True:
            await asyncio.sleep(DAEMON_JSON_CHECK_S)
            try:
                if not await asyncio.to_thread(self._daemon_json_intact):
                    await asyncio.to_thread(self._write_daemon_json)
                    log.warning("%s was removed or changed; wrote it again", self.paths.daemon_json)
            except OSError as exc:
                log.warning("cannot write %s: %s", self.paths.daemon_json, exc.strerror)

    async def _shutdown(self) -> None:
        for task in self._background:
            task.cancel()
        self.bus.publish(DaemonStopping(reason="daemon stopping", close_apps=self._close_apps))
        await self.control.stop()  # a running env install removes its half-made venv
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
        await self.warm.close()
        if self._runner is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._runner.cleanup(), 5)
        with contextlib.suppress(FileNotFoundError):
            if self._owns_daemon_json():
                self.paths.daemon_json.unlink()
        self.store.close()
        self._release_lock()

    def _daemon_json_intact(self) -> bool:
        try:
            return bool(json.loads(self.paths.daemon_json.read_text()) == self._info)
        except (OSError, ValueError):
            return False

    def _owns_daemon_json(self) -> bool:
        try:
            return bool(json.loads(self.paths.daemon_json.read_text())["pid"] == os.getpid())
        except (OSError, ValueError, KeyError):
            return False

    def _take_lock(self) -> None:
        fh = daemon_lock.take(self.paths.daemon_lock)
        if fh is None:
            other = daemon_lock.holder(self.paths.daemon_lock)
            running = f" ({other.where})" if other is not None else ""
            raise DaemonAlreadyRunning(
                f"a traylm daemon is already running{running}; use it, or stop it with "
                "`traylm shutdown`"
            ) from None
        self._lock_fh = fh

    def _release_lock(self) -> None:
        if self._lock_fh is not None:
            self._lock_fh.close()
            self._lock_fh = None
