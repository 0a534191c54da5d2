"""The traylm daemon: the composition root. It builds every part from already-loaded settings,
hands each exactly what it uses, mounts their routes on the gateway, serves, and shuts down on a
deadline. No part imports this module back (an import-linter contract checks it).

One daemon per user (a lock file in the state dir). The gateway serves through
``gateway/server.py``; once it does, ``daemon.json`` (daemon_file.py: pid, URL and the control
token, mode 0600) is written, and removed on the way out.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import secrets
import signal
from collections.abc import Sequence
from typing import IO, Protocol

from aiohttp import web

from engines import __version__
from engines.batch.batch_routes import BATCHES, batch_routes
from engines.batch.files import FileStore
from engines.batch.routes import FILES, file_routes
from engines.batch.service import BatchFeature
from engines.bench.routes import BENCH, bench_routes
from engines.bench.service import BenchFeature
from engines.chats.routes import CHATS, chats_routes
from engines.chats.service import ChatsFeature
from engines.chats.store import ChatStore
from engines.config.live import LiveSettings
from engines.config.profiles import ProfileStore
from engines.config.sections import Paths, Settings
from engines.control.routes import CONTROL, control_routes
from engines.control.service import ControlAPI, DaemonStatus, EngineControl
from engines.core import daemon_lock
from engines.core.bus import EventBus
from engines.core.daemon_file import DaemonFile
from engines.core.filemodes import make_private
from engines.core.http import mount
from engines.core.metrics import MetricsRegistry
from engines.core.procs import (
    PidRegistry,
    raise_open_files_limit,
    reap_orphans,
)
from engines.core.store import Store
from engines.envs.manager import EnvManager
from engines.errors import DiskFull, TraylmError
from engines.events.codec import to_plain
from engines.events.core import DaemonStopping, Notice
from engines.gateway.app import build_app
from engines.gateway.server import GatewayServer
from engines.gateway.service import GatewayContext
from engines.gateway.usage import UsageRecorder
from engines.gpu.backend import cuda_order
from engines.gpu.inventory import capability
from engines.gpu.routes import GPU, gpu_routes
from engines.gpu.service import GPUFeature
from engines.hub.routes import HUB, hub_routes
from engines.hub.service import HubFeature
from engines.multinode.follower import FollowerRanks
from engines.multinode.routes import SPREAD, extend_peer_app
from engines.multinode.routes import control_routes as spread_routes
from engines.multinode.service import MultiNode
from engines.ollama.app import build_app as build_ollama_app
from engines.ollama.parts import OllamaParts
from engines.ollama.router_api import router_routes
from engines.ollama.server import OllamaServer
from engines.ondemand.parts import Parts
from engines.ondemand.routes import ONDEMAND, ondemand_routes
from engines.ondemand.service import ModelsOnDemand
from engines.peers.replicas import BoxReplicas
from engines.peers.routes import PEERS, peer_app, peers_routes
from engines.peers.service import PeersFeature
from engines.peers.serving import extend_peer_app as serve_boxes
from engines.recorder.routes import REQUESTS, requests_routes
from engines.recorder.service import RequestRecorder
from engines.remote.routes import REMOTE, remote_routes
from engines.remote.service import RemoteFallback
from engines.runtime.supervisor import ManagedEngine, Supervisor
from engines.runtime.traffic import EngineTraffic
from engines.runtime.warm import WarmPool
from engines.trt.env import env_extras
from engines.trt.routes import TRT, trt_routes
from engines.trt.service import TRTFeature
from engines.tune.power import PowerLimits
from engines.tune.previous import PreviousProfiles
from engines.tune.routes import TUNE, tune_routes
from engines.tune.service import TuneFeature
from engines.tune.variants import library_models
from engines.upgrade.history import UpgradeHistory
from engines.upgrade.routes import UPGRADE, upgrade_routes
from engines.upgrade.service import UpgradeFeature

log = logging.getLogger(__name__)


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

    def __init__(
        self, paths: Paths, settings: Settings | LiveSettings, *, serve_args: Sequence[str] = ()
    ) -> None:
        """``settings``: loaded and merged with the command line's overrides before anything
        is built (``LiveSettings.load``); plain Settings are used as config.toml's values.
        ``serve_args``: the flags `traylm serve` was given, kept in daemon.json so that a
        restart from the app starts the daemon the same way."""
        self.paths = paths
        self.serve_args = tuple(serve_args)
        self.live = (
            settings
            if isinstance(settings, LiveSettings)
            else LiveSettings(settings, config_file=paths.config_file)
        )
        self.bus = EventBus()
        self.traffic = EngineTraffic()
        self.supervisor = Supervisor()
        self.warm = WarmPool(self.live.current.engines.warm_starts)
        self.live.subscribe(lambda now: self.warm.set_limit(now.engines.warm_starts))
        self.registry = MetricsRegistry()
        self.profiles = ProfileStore(paths.profiles_dir)
        self.store = Store(paths.db_path, on_disk_full=self._disk_full)
        self.pids = PidRegistry(paths.engine_pids_json)
        self.token = secrets.token_urlsafe(32)
        self.reaped: list[str] = []
        self._stop = asyncio.Event()
        self._close_apps = False
        self._lock_fh: IO[str] | None = None
        self.gateway = GatewayServer(self.live)
        self.ollama = OllamaServer(self.live, self.gateway.gate)
        self.daemon_file = DaemonFile(paths.daemon_json)
        self._background: set[asyncio.Task[None]] = set()
        self._build()

    def _build(self) -> None:
        """Every part, each given what it uses, in the order they need each other: models on
        demand first (the gateway routes through it; engine control, the hub and multinode
        place through it), then the gateway, the GPU feature (it pauses the gateway), the hub
        and trt (they read the GPU inventory), engine control. What models on demand uses of
        those later parts is handed over once, when they exist (``ondemand.connect``)."""
        live, paths, publish = self.live, self.paths, self.bus.publish
        self.peers = PeersFeature(
            settings=live, folder=paths.data_dir / "peers", peer_app=self._peer_app
        )
        self.boxes = BoxReplicas(
            peers=self.peers, settings=live, end_requests=self.traffic.end_all, publish=publish
        )
        self.ondemand = ModelsOnDemand(
            settings=live,
            engines=self.supervisor,
            profiles=self.profiles,
            publish=publish,
            attached_file=paths.config_dir / "attached.toml",
            bus=self.bus,
            boxes=self.boxes,
        )
        self.usage = UsageRecorder(self.store, live)
        self.requests = RequestRecorder(
            paths.data_dir / "requests.db", live, upstream_of=self.ondemand.upstream
        )
        self.chats = ChatsFeature(ChatStore(self.store), publish)
        self.files = FileStore(self.store, paths.data_dir / "files")
        self.remote = RemoteFallback(lambda: live.current.remote, publish)
        self.ctx = GatewayContext(
            settings=live,
            routing=self.ondemand,
            registry=self.registry,
            control_token=self.token,
            fallback=self.remote,
            usage=self.usage.record,
            traffic=self.traffic,
            replies=self.chats.tap_reply,
            exchanges=self.requests.record,
            kept=self.requests.responses,
            publish=publish,
        )
        self.gpu = GPUFeature(
            settings=live,
            bus=self.bus,
            store=self.store,
            engines=self.supervisor,
            gateway=self.ctx,
            state_dir=paths.state_dir,
        )
        self.registry.collector(self.gpu.exposition)
        self.batches = BatchFeature(
            store=self.store,
            files=self.files,
            settings=live,
            internal_key=lambda: self.ctx.internal_key,
            publish=publish,
            efficiency=self.gpu,
        )
        inventory = self.gpu.inventory
        self.envs = EnvManager(paths.envs_dir, extras=env_extras(inventory), gpus=inventory.gpus)
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
            engines=self.supervisor,
            settings=live,
            control_token=self.token,
            logs_dir=paths.logs_dir,
            publish=publish,
            internal_key=lambda: self.ctx.internal_key,
            note_failed=self.requests.note_errors,
        )
        self.multinode = MultiNode(
            peers=self.peers,
            followers=FollowerRanks(
                envs=self.envs,
                logs_dir=paths.logs_dir,
                pids=self.pids,
                box_name=lambda: self.peers.box_name,
                place=self.ondemand.placer.place_rank,
                cache_dir=paths.engine_cache_dir,
            ),
            load_profile=lambda name: asyncio.to_thread(self.profiles.load, name),
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
            gpu_count=self._gpu_count,
            spread=self.multinode.ranks,
            capability=self._capability,
        )
        self.ondemand.connect(
            Parts(control=self.control, gateway=self.ctx, gpus=self.gpu, hub=self.hub)
        )
        self.tune = TuneFeature(
            control=self.control,
            engines=self.supervisor,
            bench=self.bench,
            ondemand=self.ondemand,
            envs=self.envs,
            profiles=self.profiles,
            settings=live,
            gpu_count=self._gpu_count,
            previous=PreviousProfiles(
                paths.data_dir / "tune" / "previous", paths.profiles_dir, self.profiles
            ),
            power=PowerLimits(self.gpu),
            local_models=lambda: library_models(self.hub),
            publish=publish,
            running_file=paths.data_dir / "tune" / "running.json",
        )
        self.upgrade = UpgradeFeature(
            control=self.control,
            tune=self.tune,
            envs=self.envs,
            profiles=self.profiles,
            engines=self.supervisor,
            history=UpgradeHistory(paths.data_dir / "upgrade"),
            publish=publish,
        )
        self.status = DaemonStatus(
            settings=live,
            engines=self.supervisor,
            paused=lambda: self.ctx.paused,
            reaped=lambda: self.reaped,
            bound=self.gateway.addresses,
            providers={
                "connections": self.gateway.connections,
                "ollama": self.ollama.status,
                "remote": lambda: to_plain(self.remote.status()),
                "trt_builds": lambda: to_plain(self.trt.builds()),
                "bench": lambda: to_plain(self.bench.status()),
                "tune": lambda: to_plain(self.tune.status()),
                "upgrade": lambda: to_plain(self.upgrade.status()),
                "models": lambda: to_plain(self.ondemand.ps()),
                "disk": self._disk_status,
                "peers": self.peers.status,
                "boxes": self.boxes.status,
                "spread": self.multinode.status,
                "requests": self.requests.status,
                "batches": self.batches.running,
            },
        )
        self.features: list[Feature] = [
            self.gpu,
            self.hub,
            self.ondemand,
            self.trt,
            self.remote,
            self.usage,
            self.requests,
            self.chats,
            self.bench,
            self.tune,  # stopped before the bench: its measurement is a bench run
            self.upgrade,  # stopped before the tune: its measurement is a tune
            self.peers,
            self.boxes,
            self.multinode,
            self.batches,  # stopped first: its lines go through the gateway and the engines
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
            settled=self.ollama.settled,
        )
        mount(app, CONTROL, control, control_routes())
        mount(app, GPU, self.gpu, gpu_routes())
        mount(app, HUB, self.hub, hub_routes())
        mount(app, TRT, self.trt, trt_routes())
        mount(app, REMOTE, self.remote, remote_routes())
        mount(app, CHATS, self.chats, chats_routes())
        mount(app, BENCH, self.bench, bench_routes())
        mount(app, TUNE, self.tune, tune_routes())
        mount(app, UPGRADE, self.upgrade, upgrade_routes())
        mount(app, ONDEMAND, self.ondemand, ondemand_routes())
        mount(app, PEERS, self.peers, peers_routes())
        mount(app, SPREAD, self.multinode, spread_routes())
        mount(app, REQUESTS, self.requests, requests_routes())
        app.router.add_routes(router_routes(self.ondemand))  # llama.cpp's, for Open WebUI
        mount(app, FILES, self.files, file_routes())
        mount(app, BATCHES, self.batches, batch_routes())
        return app

    def _peer_app(self, peers: PeersFeature) -> web.Application:
        """The listener's application for paired boxes: pairing's routes, a model across
        boxes' (multinode), and this box's models served to paired boxes (peers/serving.py)."""

        def extend(app: web.Application) -> None:
            extend_peer_app(app, self.multinode)
            serve_boxes(
                app, ctx=self.ctx, shared=self.ondemand.shared, gpus=self.gpu.inventory.gpus
            )

        return peer_app(peers, extend=extend)

    async def _gpu_count(self) -> int:
        """The GPUs an engine can be placed on (the simulator's included)."""
        return len(await self.gpu.inventory.gpus())

    async def _capability(self, gpus: tuple[int, ...]) -> str:
        """The oldest compute capability of these GPUs (CUDA indices); "" when unknown."""
        infos = cuda_order(await self.gpu.inventory.gpus())
        known = [infos[i].compute_capability for i in gpus if i < len(infos)]
        known = [cc for cc in known if cc]
        return min(known, key=capability, default="")

    def _disk_full(self, full: DiskFull | None) -> None:
        """The store found the disk full, or writable again (from the writing thread): a
        notice for the tray; the details are in /api/status's ``disk``."""
        if full is not None:
            notice = Notice(
                level="warning", title="Disk full", message=full.message, source=full.code
            )
        else:
            notice = Notice(
                level="info",
                title="Disk space back",
                message="traylm.db is written again; what was kept in memory is being saved",
                source="disk_space",
            )
        self.bus.publish_threadsafe(notice)

    def _disk_status(self) -> dict[str, object]:
        """Whether the disk of traylm's data folder has room, and what waits in memory."""
        full = self.store.full
        return {
            "full": full is not None,
            "folder": str(self.paths.data_dir),
            "message": full.message if full is not None else "",
            "full_since_s": self.store.full_since_s,
            "usage_rows_waiting": self.usage.waiting,
            "usage_rows_dropped": self.usage.dropped,
            "replies_waiting": self.chats.replies_waiting,
        }

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
        self.gateway.limit_connections(raise_open_files_limit())
        try:
            if install_signal_handlers:  # from here on: a SIGTERM during start-up stops cleanly
                loop = asyncio.get_running_loop()
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.add_signal_handler(sig, self.request_stop, sig.name)
                self._stop_on_hangup(loop)
            self.reaped = await asyncio.to_thread(reap_orphans, self.pids)
            await asyncio.to_thread(self.store.open)
            await self._serve()
            for feature in self.features:
                await feature.start()
            keeper = asyncio.create_task(self.daemon_file.keep(), name="daemon.json")
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

    def _stop_on_hangup(self, loop: asyncio.AbstractEventLoop) -> None:
        """SIGHUP stops the daemon as SIGTERM does: engines stopped, streams told why,
        daemon.json removed. It comes when the terminal or ssh session that runs `traylm serve`
        closes, and a daemon nobody can see any more should not go on holding the GPUs (a
        daemon started by the tray app or systemd has no terminal, so none comes to it).
        Started with SIGHUP ignored (`nohup traylm serve`), the daemon keeps ignoring it.
        No reload: settings changes apply while it runs (`traylm config set`)."""
        if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
            log.info(
                "SIGHUP is ignored (nohup): the daemon goes on serving when its terminal closes"
            )
            return
        loop.add_signal_handler(
            signal.SIGHUP,
            self.request_stop,
            "SIGHUP (the terminal or session of `traylm serve` closed; "
            "`nohup traylm serve` or the tray app keeps a daemon serving)",
        )

    async def _serve(self) -> None:
        await self.gateway.start(self._app())
        parts = OllamaParts(self.ctx, self.ondemand, self.hub)
        await self.ollama.start(build_ollama_app(parts, lambda: self.live.current.ollama.port))
        port = self.settings.gateway.port
        self.daemon_file.write(
            {
                "url": f"http://127.0.0.1:{port}",
                "port": port,
                "token": self.token,
                "version": __version__,
                "started_at_s": self.status.started_at_s,
                "serve_args": list(self.serve_args),
            }
        )
        if self._lock_fh is not None:
            daemon_lock.note(self._lock_fh, port=port)

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
        await self.ollama.stop()
        await self.gateway.stop()
        self.daemon_file.remove()
        self.store.close()
        self._release_lock()

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
