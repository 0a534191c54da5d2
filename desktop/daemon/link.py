"""The app's connection to the daemon, kept alive on the bridge's asyncio loop (no Qt here).

``DaemonLink.run`` connects (starting the daemon detached on first use when none runs), loads
a snapshot (status, engines, profiles, settings), then relays the daemon's event stream (the
gateway's throughput among its events) until the connection breaks; then it says so and
reconnects on its own as soon as a daemon answers again. A daemon of another version is
reported, not refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from desktop.daemon.gateway import GatewayHTTP
from desktop.daemon.launcher import SpawnedDaemon, SpawnFailed, spawn_daemon, wait_until_serving
from desktop.daemon.messages import (
    CallResult,
    ConnectionChanged,
    EfficiencyLoaded,
    EnginesLoaded,
    EnvEntry,
    EnvsLoaded,
    GPUsLoaded,
    LibraryLoaded,
    LinkState,
    ProfileEntry,
    ProfilesLoaded,
    ServableLoaded,
    SettingsLoaded,
    StatusLoaded,
    freeze,
)
from engines import __version__
from engines.client import DaemonClient, pid_alive
from engines.config.sections import Paths, Settings
from engines.errors import ControlAPIError, DaemonUnavailable, TraylmError
from engines.events import (
    BatchFinished,
    BatchProgress,
    BoxesChanged,
    DaemonStopping,
    EngineStateChanged,
    EnvInstallProgress,
    Event,
    GPUControlChanged,
    LibraryChanged,
    Notice,
    RemoteRouted,
    TuneFinished,
    from_plain,
)

log = logging.getLogger(__name__)

Post = Callable[[object], None]
RETRY_FIRST_S = 0.25
RETRY_MAX_S = 2.0
RESYNC_AFTER_S = 0.5
DISK_NOTICES = frozenset({"disk_full", "disk_space"})
"""Sources of the daemon's notices that its disk is full, or has room again: the status (the
tray's disk line) is re-read."""
STATUS_AFTER_ROUTED_S = 2.0  # re-read /api/status (the remote fallback's count) at most this often
RESTARTING = "restarting the traylm daemon, as you asked…"
CLIENT_TIMEOUT_S = 30.0  # how long a call to the daemon may take (some have their own: the doctor)


class DaemonLink:
    def __init__(self, paths: Paths, post: Post, *, spawn_daemon: bool = True) -> None:
        self.paths = paths
        self._post = post
        self._spawn_first = spawn_daemon
        self.client: DaemonClient | None = None
        self.gateway = GatewayHTTP(post)
        self.spawned: SpawnedDaemon | None = None
        self.closing = False
        self._spawn_requested = False
        self._restarting = False  # a restart the user asked for is under way
        self._quitting = False  # "Stop engines and quit": no daemon is started again
        self._spawning: asyncio.Future[SpawnedDaemon] | None = None  # a start under way
        self._serve_args: tuple[str, ...] = ()  # the flags of the daemon being restarted
        self._spawn_error = ""  # why the last start failed; shown until a daemon answers
        self._stopping_token = ""  # the daemon that announced it is stopping
        self._wake_retry: asyncio.Event | None = None
        self._status_task: asyncio.Task[None] | None = None
        self._status_again = False
        self._known: set[str] = set()  # engine ids whose full status the app has
        self._refreshes: set[asyncio.Task[None]] = set()
        self._servable_task: asyncio.Task[None] | None = None
        self._servable_again = False

    # ----------------------------------------------------------------- supervision

    async def run(self) -> None:
        self._wake_retry = asyncio.Event()
        self._post(ConnectionChanged(LinkState.CONNECTING, "connecting to the traylm daemon…"))
        delay_s = RETRY_FIRST_S
        while not self.closing:
            try:
                client = await self._connect()
            except DaemonUnavailable as exc:
                if self._restarting and not isinstance(exc, SpawnFailed):
                    self._post(ConnectionChanged(LinkState.STARTING_DAEMON, RESTARTING))
                else:
                    self._post(
                        ConnectionChanged(
                            LinkState.UNREACHABLE,
                            self._unreachable_text(exc),
                            spawned=self.spawned is not None,
                        )
                    )
                await self._pause(delay_s)
                delay_s = min(delay_s * 2, RETRY_MAX_S)
                continue
            delay_s = RETRY_FIRST_S
            try:
                await self._serve(client)
            except DaemonUnavailable as exc:
                if self._restarting:  # asked for: no alarm, and no "start the daemon" button
                    self._post(ConnectionChanged(LinkState.STARTING_DAEMON, RESTARTING))
                else:
                    self._post(
                        ConnectionChanged(
                            LinkState.UNREACHABLE,
                            f"lost the daemon ({exc.message}); waiting for it to come back",
                        )
                    )
            except TraylmError as exc:
                self._post(
                    ConnectionChanged(
                        LinkState.UNREACHABLE,
                        f"the daemon answered with an error ({exc.message}); retrying",
                    )
                )
                await self._pause(RETRY_MAX_S)
            except Exception as exc:  # boundary: the link must outlive any bug below it
                log.exception("daemon link failed")
                self._post(
                    ConnectionChanged(LinkState.UNREACHABLE, f"internal error: {exc}; retrying")
                )
                await self._pause(RETRY_MAX_S)
            finally:
                self.client = None
                await client.close()

    def _unreachable_text(self, exc: DaemonUnavailable) -> str:
        if isinstance(exc, SpawnFailed):
            self._spawn_error = exc.message
        if self._spawn_error:
            return f"Could not start the traylm daemon: {self._spawn_error}"
        if not self.paths.daemon_json.exists():
            return (
                "The traylm daemon is not running. Start it here (or with `traylm serve`); "
                "this app connects as soon as it answers."
            )
        return f"{exc.message}. Retrying on its own."

    async def _pause(self, delay_s: float) -> None:
        assert self._wake_retry is not None
        self._wake_retry.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake_retry.wait(), delay_s)

    async def _connect(self) -> DaemonClient:
        spawn = not self._quitting and (
            self._spawn_requested or (self._spawn_first and self.spawned is None)
        )
        self._spawn_first = False
        try:
            client = await DaemonClient.connect(self.paths, timeout_s=CLIENT_TIMEOUT_S)
        except DaemonUnavailable:
            if not spawn or self._quitting:  # quitting meanwhile: start nothing
                raise
        else:
            if client.info.token != self._stopping_token:
                return client
            await client.close()  # the one that said it is stopping: wait for it to go
            raise DaemonUnavailable("the daemon is stopping")
        self._spawn_requested = False
        command = " ".join(("traylm serve", *self._serve_args))
        self._post(
            ConnectionChanged(LinkState.STARTING_DAEMON, f"starting the daemon ({command})…")
        )
        self._spawning = asyncio.ensure_future(
            asyncio.to_thread(spawn_daemon, self.paths, self._serve_args)
        )
        self.spawned = await self._spawning
        if self._quitting:  # "Stop engines and quit" came while it started
            self.spawned.terminate()
            raise DaemonUnavailable("the app is quitting")
        try:
            return await wait_until_serving(self.paths, self.spawned)
        finally:
            self._restarting = False

    async def _serve(self, client: DaemonClient) -> None:
        self._spawn_error = ""
        status = await client.status()
        self.client = client
        url = str(status.get("url", client.info.url))
        self.gateway.base_url = url
        self.gateway.control_token = client.info.token
        version = str(status.get("version", client.info.version))
        spawned = self.spawned is not None and self.spawned.pid == client.info.pid
        if version == __version__:
            state, message = LinkState.CONNECTED, f"connected to the daemon at {url}"
        else:
            state = LinkState.VERSION_MISMATCH
            message = (
                f"the running daemon is traylm {version} but this app is {__version__}; "
                "restart the daemon (menu: Restart daemon) so that both match"
            )
        self._post(
            ConnectionChanged(
                state,
                message,
                url,
                version,
                client.info.pid,
                spawned=spawned,
                serve_args=client.info.serve_args,
            )
        )
        self._post(StatusLoaded(freeze(status)))  # type: ignore[arg-type]
        # subscribe first, then read the snapshot: a change made in between (a paired box's
        # models) is then in the snapshot or in the stream, never in neither
        subscribed = asyncio.Event()
        pump = asyncio.create_task(self._pump_events(client, subscribed.set), name="events")
        waiting = asyncio.create_task(subscribed.wait(), name="subscribed")
        resync: asyncio.Task[None] | None = None
        try:
            await asyncio.wait((pump, waiting), return_when=asyncio.FIRST_COMPLETED)
            if pump.done():
                await pump  # the stream failed before it opened: its error
            await self.load_all(client)
            resync = asyncio.create_task(self._resync(client), name="resync")
            await pump
        finally:
            tasks = [t for t in (pump, waiting, resync) if t is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _pump_events(self, client: DaemonClient, opened: Callable[[], None]) -> None:
        async for event in client.events(opened=opened):
            self._post(event)
            self._refresh_after(client, event)
            if isinstance(event, BoxesChanged):  # what the paired boxes serve here
                self._refresh_status_soon(client, after_s=0.0)
            elif isinstance(event, (RemoteRouted, BatchProgress, BatchFinished)) or (
                isinstance(event, Notice) and event.source in DISK_NOTICES
            ):  # (a batch's counts: the tooltip's and the engines page's line)
                self._refresh_status_soon(client)
            if isinstance(event, DaemonStopping):
                # let go at once (the daemon would otherwise wait for this stream to close),
                # and do not reconnect to it while it finishes stopping
                self._stopping_token = client.info.token
                raise DaemonUnavailable(f"the daemon is stopping ({event.reason or 'asked to'})")
        raise DaemonUnavailable("the daemon closed the event stream")

    async def _resync(self, client: DaemonClient) -> None:
        """Re-read everything once more, shortly after the snapshot: an event that crossed the
        snapshot's reads on the way (applied before a read that was already older) is undone."""
        await asyncio.sleep(RESYNC_AFTER_S)
        with contextlib.suppress(TraylmError):
            await self.load_all(client)

    def _refresh_status_soon(
        self, client: DaemonClient, after_s: float = STATUS_AFTER_ROUTED_S
    ) -> None:
        """Re-read the status shortly, once: requests went to the remote fallback (its count),
        the disk filled or has room, the paired boxes' models changed. Asked again while a read
        runs, it reads once more after it (that read may have begun before the change)."""
        self._status_again = True
        if self._status_task is not None and not self._status_task.done():
            return

        async def later() -> None:
            await asyncio.sleep(after_s)
            while self._status_again:
                self._status_again = False
                with contextlib.suppress(TraylmError):
                    status = await client.status()
                    self._post(StatusLoaded(freeze(status)))  # type: ignore[arg-type]

        self._status_task = asyncio.create_task(later(), name="status after remote")

    def _refresh_after(self, client: DaemonClient, event: Event) -> None:
        """Snapshots an event changes but does not carry: an engine the app has not seen (its
        version and device), the engine envs after an install, the library after a change, the
        engines after a tune (its candidates' are gone)."""
        load: Callable[[DaemonClient], Awaitable[None]] | None = None
        if isinstance(event, EngineStateChanged) and event.engine_id not in self._known:
            self._known.add(event.engine_id)
            load = self.load_engines
        elif isinstance(event, EnvInstallProgress) and event.phase in (
            "done",
            "failed",
            "cancelled",
        ):
            load = self.load_envs
        elif isinstance(event, LibraryChanged):
            load = self.load_library
        elif isinstance(event, TuneFinished):  # the tuner forgot its candidates' engines
            load = self.load_engines
        elif isinstance(event, GPUControlChanged):  # a profile applied, or a control by hand
            load = self.load_efficiency
        if load is not None:
            task = asyncio.create_task(self._quietly(load, client), name="refresh")
            self._refreshes.add(task)
            task.add_done_callback(self._refreshes.discard)

    async def _quietly(
        self, load: Callable[[DaemonClient], Awaitable[None]], client: DaemonClient
    ) -> None:
        with contextlib.suppress(TraylmError):
            await load(client)

    # ----------------------------------------------------------------- snapshot

    async def load_all(self, client: DaemonClient) -> None:
        await self.load_engines(client)
        await self.load_profiles(client)
        await self.load_settings(client)
        await self.load_gpus(client)
        await self.load_efficiency(client)
        await self.load_envs(client)
        await self.load_library(client)

    async def load_envs(self, client: DaemonClient) -> None:
        entries = tuple(
            EnvEntry(
                name=str(e["name"]),
                engine=str(e["engine"]),
                version=str(e["version"]),
                device=str(e["device"]),
                complete=bool(e["complete"]),
            )
            for e in await client.envs()
        )
        self._post(EnvsLoaded(entries))
        self._servable_soon(client)

    async def load_library(self, client: DaemonClient) -> None:
        try:
            cached = tuple(await client.local_models())
            folders = tuple(await client.local_folders())
        except ControlAPIError:  # a daemon without the hub feature: an empty library
            cached, folders = (), ()
        self._post(LibraryLoaded(cached, folders))
        self._servable_soon(client)

    async def load_gpus(self, client: DaemonClient) -> None:
        try:
            overview = await client.gpus()
        except ControlAPIError as exc:  # a daemon without GPU telemetry: the pages say so
            self._post(GPUsLoaded(None, exc.message))
            return
        self._post(GPUsLoaded(overview))

    async def load_efficiency(self, client: DaemonClient) -> None:
        try:
            profiles = await client.efficiency_profiles()
        except ControlAPIError as exc:  # an older daemon: no profiles to switch
            self._post(EfficiencyLoaded(None, exc.message))
            return
        self._post(EfficiencyLoaded(profiles))

    async def load_engines(self, client: DaemonClient) -> None:
        engines = tuple(await client.engines())
        self._known = {e.engine_id for e in engines}
        self._post(EnginesLoaded(engines))

    async def load_profiles(self, client: DaemonClient) -> None:
        data = await client.profiles()
        entries = tuple(
            ProfileEntry(str(p["name"]), bool(p["preset"]), freeze(p["profile"]))  # type: ignore[arg-type]
            for p in data["profiles"]
        )
        self._post(ProfilesLoaded(entries, tuple(str(b) for b in data.get("broken", ()))))
        self._servable_soon(client)

    def _servable_soon(self, client: DaemonClient) -> None:
        """Re-read the servable models (why each cannot start here: the daemon's answer) after
        the profiles, engine envs or library changed; one read at a time, in the background
        (the daemon may check the Hub's reachability for it), once more when asked meanwhile."""
        self._servable_again = True
        if self._servable_task is not None and not self._servable_task.done():
            return

        async def read() -> None:
            while self._servable_again:
                self._servable_again = False
                with contextlib.suppress(TraylmError):
                    self._post(ServableLoaded(tuple(await client.servable_models())))

        self._servable_task = asyncio.create_task(read(), name="servable models")

    async def load_settings(self, client: DaemonClient) -> None:
        data = await client.settings()
        settings = from_plain(Settings, data["settings"])
        self._post(SettingsLoaded(settings, freeze(data["docs"])))  # type: ignore[arg-type]
        status = await client.status()
        self._post(StatusLoaded(freeze(status)))  # type: ignore[arg-type]

    # ----------------------------------------------------------------- daemon start/restart

    def request_daemon_start(self) -> None:
        """Start a daemon on the next attempt (the user asked; the first start is automatic)."""
        if self._quitting:
            return
        self._spawn_requested = True
        if self._wake_retry is not None:
            self._wake_retry.set()

    async def shutdown_daemon(self) -> None:
        """Stop the daemon (it stops its engines first) for "Stop engines and quit": the one
        connected, else the one daemon.json names (a restart under way, a link between two
        retries); nothing is started again afterwards."""
        self._quitting = True
        self._restarting = self._spawn_requested = self._spawn_first = False
        if self._spawning is not None and not self._spawning.done():
            with contextlib.suppress(Exception):  # its failure is the start's to report
                self.spawned = await asyncio.shield(self._spawning)
        client, own = self.client, False
        if client is None:
            try:
                client, own = await DaemonClient.connect(self.paths, timeout_s=5), True
            except DaemonUnavailable:
                if self.spawned is not None:
                    self.spawned.terminate()  # one started for a restart, not serving yet
                return
        try:
            await client.shutdown()
        except DaemonUnavailable:
            pass
        finally:
            if own:
                await client.close()
        spawned = self.spawned
        if spawned is not None and spawned.exit_code() is None and spawned.pid != client.info.pid:
            spawned.terminate()  # started for a restart, not serving yet: it stops too

    async def restart_daemon(self, timeout_s: float = 60.0) -> None:
        """Shut the daemon down (its engines stop), wait until it is gone, start a new one the
        way it was started (its `traylm serve` flags)."""
        client = self.client
        if client is not None:
            self._restarting = True
            self._serve_args = client.info.serve_args
            pid = client.info.pid
            with contextlib.suppress(DaemonUnavailable):
                await client.shutdown()
            deadline = time.monotonic() + timeout_s
            while pid_alive(pid) and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
            if pid_alive(pid):
                self._restarting = False
                raise DaemonUnavailable(f"the daemon (pid {pid}) did not stop in {timeout_s:.0f} s")
        self.request_daemon_start()

    # ----------------------------------------------------------------- calls from the GUI

    async def run_call(self, call_id: int, fn: Callable[[DaemonClient], Awaitable[object]]) -> None:
        client = self.client
        if client is None:
            self._post(
                CallResult(
                    call_id,
                    error="not connected to the traylm daemon; it reconnects on its own",
                    error_code="daemon_unavailable",
                )
            )
            return
        await self._guarded(call_id, lambda: fn(client))

    async def run_gateway(
        self, call_id: int, fn: Callable[[GatewayHTTP], Awaitable[object]]
    ) -> None:
        await self._guarded(call_id, lambda: fn(self.gateway))

    async def run_link(self, call_id: int, fn: Callable[[DaemonLink], Awaitable[object]]) -> None:
        await self._guarded(call_id, lambda: fn(self))

    async def _guarded(self, call_id: int, make: Callable[[], Awaitable[object]]) -> None:
        try:
            value = await make()
        except asyncio.CancelledError:
            self._post(CallResult(call_id, cancelled=True))
            raise
        except TraylmError as exc:
            self._post(CallResult(call_id, error=exc.message, error_code=exc.code))
        except Exception as exc:  # boundary: a bug must reach the GUI as an error, not vanish
            log.exception("call %d failed", call_id)
            self._post(CallResult(call_id, error=f"internal error: {exc}", error_code="internal"))
        else:
            self._post(CallResult(call_id, value=freeze(value)))

    async def close(self) -> None:
        self.closing = True
        await self.gateway.close()
        if self.client is not None:
            await self.client.close()
            self.client = None
