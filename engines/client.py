"""Async client for the daemon's control API, used by the CLI and the desktop app.

``DaemonClient.connect()`` finds the running daemon through ``daemon.json`` in the state dir and
checks that it answers. Every method raises ``DaemonUnavailable`` when the daemon cannot be
reached and ``ControlAPIError`` (with the daemon's message, which says what to do) otherwise.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import aiohttp
import psutil

from engines import __version__, daemon_lock
from engines.config import Paths
from engines.errors import ControlAPIError, DaemonUnavailable
from engines.events.bench import BenchConfig, BenchProgress, BenchRun, BenchRunSummary
from engines.events.chat import ChatSummary, ChatTranscript
from engines.events.codec import Event, from_plain, to_plain
from engines.events.core import EngineState, EngineStatus
from engines.events.gpu import (
    FanCurve,
    FanCurveResult,
    GPUFanStatus,
    GPUHistory,
    GPUOverview,
    GPUPresets,
    GuardStatus,
    PowerLimitStatus,
)
from engines.events.hub import (
    DownloadStatus,
    FitResult,
    LocalFolder,
    LocalModel,
    ModelDetails,
    ModelSummary,
)
from engines.events.models import AttachedServer, LoadedModel, Placement, ServableModel
from engines.events.registry import from_wire
from engines.events.remote import RemoteStatus
from engines.events.trt import TRTBuildProgress, TRTCacheEntry

JSON = dict[str, Any]
DAEMON_JSON_WAIT_S = 6.0
"""How long a client waits for a running daemon to write its deleted daemon.json again."""


@dataclass(frozen=True)
class DaemonInfo:
    """The contents of daemon.json."""

    pid: int
    url: str
    port: int
    token: str
    version: str
    started_at_s: float

    @classmethod
    def read(cls, paths: Paths) -> DaemonInfo:
        try:
            data = json.loads(paths.daemon_json.read_text())
            info = cls(
                int(data["pid"]),
                str(data["url"]),
                int(data["port"]),
                str(data["token"]),
                str(data["version"]),
                float(data["started_at_s"]),
            )
        except FileNotFoundError:
            running = daemon_lock.holder(paths.daemon_lock)
            if running is not None:
                raise DaemonUnavailable(
                    f"a traylm daemon is running ({running.where}) but {paths.daemon_json} is "
                    "missing; it writes the file again within seconds: retry, or stop it with "
                    f"`kill {running.pid}`"
                ) from None
            raise DaemonUnavailable(
                "the traylm daemon is not running; start it with `traylm serve` "
                "(or open the tray app with `traylm`)"
            ) from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DaemonUnavailable(
                f"{paths.daemon_json} is unreadable ({exc}); restart the daemon with `traylm serve`"
            ) from None
        if not pid_alive(info.pid):
            raise DaemonUnavailable(
                f"the traylm daemon (pid {info.pid}) is no longer running; start it with "
                "`traylm serve`"
            )
        return info


async def find_daemon(paths: Paths, *, wait_s: float = DAEMON_JSON_WAIT_S) -> DaemonInfo:
    """The running daemon's daemon.json. While a daemon holds the lock but its daemon.json is
    missing (deleted by hand), wait up to ``wait_s`` for the daemon to write it again."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return await asyncio.to_thread(DaemonInfo.read, paths)
        except DaemonUnavailable:
            running = await asyncio.to_thread(daemon_lock.holder, paths.daemon_lock)
            if running is None or time.monotonic() >= deadline:
                raise
            await asyncio.sleep(0.2)


def pid_alive(pid: int) -> bool:
    """True while the process runs (a zombie, exited but not yet reaped, is not running)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def api_error(status: int, data: Any) -> ControlAPIError:
    """The daemon's OpenAI-shaped error body (``{"error": {"message", "type"}}``) as an
    exception; any other body still gives one that names the HTTP status."""
    err = data.get("error", {}) if isinstance(data, dict) else {}
    return ControlAPIError(
        str(err.get("message", f"HTTP {status}")),
        code=str(err.get("type", "error")),
        http_status=status,
    )


class DaemonClient:
    def __init__(self, info: DaemonInfo, *, timeout_s: float = 30.0) -> None:
        self.info = info
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=3)
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    async def connect(cls, paths: Paths | None = None, *, timeout_s: float = 30.0) -> DaemonClient:
        info = await find_daemon(paths or Paths.from_env())
        client = cls(info, timeout_s=timeout_s)
        try:
            await client.status()
        except BaseException:
            await client.close()
            raise
        return client

    @property
    def version_matches(self) -> bool:
        return self.info.version == __version__

    async def __aenter__(self) -> DaemonClient:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                base_url=self.info.url,
                timeout=self._timeout,
                headers={"Authorization": f"Bearer {self.info.token}"},
            )
        return self._session

    async def _call(
        self, method: str, path: str, *, json_body: Any = None, params: dict[str, str] | None = None
    ) -> Any:
        try:
            async with self._http().request(method, path, json=json_body, params=params) as resp:
                data = await resp.json(content_type=None)
                if resp.status >= 400:
                    raise api_error(resp.status, data)
                return data
        except (aiohttp.ClientConnectionError, TimeoutError) as exc:
            raise DaemonUnavailable(
                f"the traylm daemon at {self.info.url} does not answer ({type(exc).__name__}); "
                "is it still running? `traylm serve` starts it"
            ) from None
        except (ValueError, aiohttp.ContentTypeError) as exc:
            raise DaemonUnavailable(
                f"the daemon answered something that is not JSON ({exc})"
            ) from None

    # ----------------------------------------------------------------- status and engines

    async def status(self) -> JSON:
        data: JSON = await self._call("GET", "/api/status")
        return data

    async def engines(self) -> list[EngineStatus]:
        return [from_plain(EngineStatus, e) for e in await self._call("GET", "/api/engines")]

    async def start(self, profile: str | None = None, **adhoc: Any) -> EngineStatus:
        body = {"profile": profile} if profile else adhoc
        return from_plain(EngineStatus, await self._call("POST", "/api/engines", json_body=body))

    async def stop(self, engine_id: str) -> EngineStatus:
        return from_plain(EngineStatus, await self._call("POST", f"/api/engines/{engine_id}/stop"))

    async def restart(self, engine_id: str) -> EngineStatus:
        data = await self._call("POST", f"/api/engines/{engine_id}/restart")
        return from_plain(EngineStatus, data)

    async def logs(self, engine_id: str, tail: int = 200) -> list[str]:
        data = await self._call("GET", f"/api/engines/{engine_id}/logs", params={"tail": str(tail)})
        return [str(line) for line in data["lines"]]

    async def shutdown(self, *, close_apps: bool = False) -> None:
        """Stop the daemon (it stops its engines first); ``close_apps``: and the tray app."""
        await self._call("POST", "/api/shutdown", json_body={"close_apps": close_apps})

    # ----------------------------------------------------------------- profiles and settings

    async def profiles(self) -> JSON:
        data: JSON = await self._call("GET", "/api/profiles")
        return data

    async def profile(self, name: str) -> JSON:
        data: JSON = await self._call("GET", f"/api/profiles/{name}")
        return data

    async def save_profile(self, name: str, fields: JSON, *, dry_run: bool = False) -> JSON:
        params = {"dry_run": "1"} if dry_run else None
        data: JSON = await self._call(
            "PUT", f"/api/profiles/{name}", json_body=fields, params=params
        )
        return data

    async def delete_profile(self, name: str) -> None:
        await self._call("DELETE", f"/api/profiles/{name}")

    async def settings(self) -> JSON:
        data: JSON = await self._call("GET", "/api/settings")
        return data

    async def update_settings(self, changes: JSON) -> JSON:
        data: JSON = await self._call("PATCH", "/api/settings", json_body=changes)
        return data

    async def envs(self) -> list[JSON]:
        data: list[JSON] = await self._call("GET", "/api/envs")
        return data

    async def install_env(
        self, engine: str, *, device: str = "auto", version: str | None = None
    ) -> JSON:
        """Start an install in the daemon; follow it with ``events(kinds=("env.install",))``."""
        data: JSON = await self._call(
            "POST", "/api/envs", json_body={"engine": engine, "device": device, "version": version}
        )
        return data

    async def cancel_install(self) -> None:
        """Stop the daemon's running install (its half-made environment is removed)."""
        await self._call("POST", "/api/envs/install/cancel")

    async def env_doctor(self, name: str) -> JSON:
        data: JSON = await self._call("GET", f"/api/envs/{name}/doctor")
        return data

    # ----------------------------------------------------------------- events

    async def events(
        self, kinds: Iterable[str] | None = None, *, opened: Callable[[], None] | None = None
    ) -> AsyncIterator[Event]:
        """Yield events until the daemon closes the stream. Unknown kinds (a newer daemon) are
        skipped. ``opened`` is called once the daemon has subscribed this stream: nothing
        published after that is missed."""
        params = {"kinds": ",".join(kinds)} if kinds else None
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=3, sock_read=60)
        try:
            async with self._http().get("/api/events", params=params, timeout=timeout) as resp:
                if resp.status != 200:
                    raise ControlAPIError(
                        f"events stream refused: HTTP {resp.status}",
                        code="events",
                        http_status=resp.status,
                    )
                if opened is not None:
                    opened()
                async for raw in resp.content:
                    line = raw.decode(errors="replace").strip()
                    if not line.startswith("data:"):
                        continue
                    try:
                        yield from_wire(json.loads(line[5:]))
                    except (KeyError, ValueError, TypeError):
                        continue
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError):
            raise DaemonUnavailable(f"lost the event stream from {self.info.url}") from None

    async def wait_for_engine(
        self,
        engine_id: str,
        states: Iterable[EngineState],
        timeout_s: float,
        on_status: Callable[[EngineStatus], None] | None = None,
    ) -> EngineStatus:
        """Wait until the engine reaches one of ``states``; returns its status then.
        ``on_status`` sees every snapshot on the way (start phases, for a progress line)."""
        wanted = frozenset(states)

        async def poll() -> EngineStatus:
            while True:
                for status in await self.engines():
                    if status.engine_id != engine_id:
                        continue
                    if status.state in wanted:
                        return status
                    if on_status is not None:
                        on_status(status)
                await asyncio.sleep(0.5)

        return await asyncio.wait_for(poll(), timeout_s)

    # ----------------------------------------------------------------- models on demand
    # engines/ondemand/routes.py. Names may be a served name, an alias, a profile name or a
    # repo id. Loading is announced as ModelLoading (``model.loading``) events and its end as
    # ModelStateChanged (``model.state``): ``events(kinds=("model",))``.

    async def servable_models(self) -> list[ServableModel]:
        """Every model a request may name (the chat window's picker), loaded or not."""
        data = await self._call("GET", "/api/servable")
        return [from_plain(ServableModel, m) for m in data["models"]]

    async def catalog_problems(self) -> JSON:
        """{"ambiguous": {name: why}, "notes": [...], "broken": [...]} of the catalog."""
        data = await self._call("GET", "/api/servable")
        return {k: data[k] for k in ("ambiguous", "notes", "broken")}

    async def loaded_models(self) -> list[LoadedModel]:
        """`traylm ps`: what holds resources now (the tray menu's Unload list)."""
        return [from_plain(LoadedModel, m) for m in await self._call("GET", "/api/loaded")]

    async def load_model(
        self,
        name: str,
        *,
        gpus: Iterable[int] | None = None,
        ttl: str | float | None = None,
        pin: bool = False,
    ) -> LoadedModel:
        """Place and start a model; returns once it is starting (``wait_for_model`` waits for
        ready). ``ttl``: "10m" or seconds (0: never unload); ``pin``: never unload or evict."""
        body: JSON = {"model": name, "pin": pin}
        if gpus is not None:
            body["gpus"] = list(gpus)
        if ttl is not None:
            body["ttl"] = ttl
        return from_plain(LoadedModel, await self._call("POST", "/api/loaded", json_body=body))

    async def unload_model(self, name: str) -> JSON:
        """{"name", "engine_id", "unloaded", "deferred", "message"}: deferred while requests
        still run (it unloads when the last one ends)."""
        data: JSON = await self._call("DELETE", "/api/loaded", params={"model": name})
        return data

    async def wait_for_model(self, name: str, timeout_s: float) -> LoadedModel:
        """Wait until the model serves (its row in `traylm ps` is ready); ControlAPIError
        with the engine's diagnosis when its load failed."""

        async def poll() -> LoadedModel:
            while True:
                rows = {r.engine_id: r for r in await self.loaded_models()}
                rows |= {r.name: r for r in rows.values()}
                row = rows.get(name)
                if row is not None and row.state in ("ready", "sleeping"):
                    return row
                if row is None or row.state in ("failed", "stopped"):
                    models = {m.name: m for m in await self.servable_models()}
                    models |= {n: m for m in models.values() for n in m.names}
                    m = models.get(name)
                    if m is not None and m.state == "failed":
                        raise ControlAPIError(m.detail, code="model_load_failed", http_status=503)
                await asyncio.sleep(0.3)

        return await asyncio.wait_for(poll(), timeout_s)

    async def placement(self, name: str, gpus: Iterable[int] | None = None) -> Placement:
        """Where the planner would load ``name`` now, or exactly why it cannot."""
        params = {"model": name}
        if gpus is not None:
            params["gpus"] = ",".join(str(g) for g in gpus)
        return from_plain(Placement, await self._call("GET", "/api/placement", params=params))

    async def attached_servers(self) -> list[AttachedServer]:
        return [from_plain(AttachedServer, a) for a in await self._call("GET", "/api/attached")]

    async def attach(
        self, name: str, url: str, *, key_env: str = "", key: str = ""
    ) -> AttachedServer:
        """Route ``name`` to an OpenAI-compatible server traylm does not run. ``key_env``: the
        environment variable holding its key (the daemon reads it; ``key`` is its value from
        this process, kept in the daemon's memory only)."""
        body = {"name": name, "url": url, "key_env": key_env, "key": key}
        return from_plain(AttachedServer, await self._call("POST", "/api/attached", json_body=body))

    async def detach(self, name: str) -> AttachedServer:
        return from_plain(AttachedServer, await self._call("DELETE", f"/api/attached/{name}"))

    # ----------------------------------------------------------------- gpu
    # GPU telemetry and control (engines/gpu/routes.py). ``gpu`` is a UUID or an NVML index;
    # "all" is accepted by restore_fans and reset_power_limit. Live samples arrive as
    # GPUSampled events: ``events(kinds=("gpu",))``.

    async def gpus(self) -> GPUOverview:
        return from_plain(GPUOverview, await self._call("GET", "/api/gpus"))

    async def gpu_history(self, seconds: float = 600, points: int = 600) -> list[GPUHistory]:
        params = {"seconds": str(seconds), "points": str(points)}
        data = await self._call("GET", "/api/gpus/history", params=params)
        return [from_plain(GPUHistory, h) for h in data]

    async def gpu_presets(self) -> GPUPresets:
        return from_plain(GPUPresets, await self._call("GET", "/api/gpus/presets"))

    async def fans(self, gpu: str) -> GPUFanStatus:
        return from_plain(GPUFanStatus, await self._call("GET", f"/api/gpus/{gpu}/fans"))

    async def set_fan_curve(
        self,
        gpu: str,
        *,
        preset: str | None = None,
        curve: FanCurve | JSON | None = None,
        fans: Iterable[int] | None = None,
        persist: bool = True,
        dry_run: bool = False,
    ) -> FanCurveResult:
        """Apply a preset or a curve to a GPU's fans (all of them unless ``fans``).
        ``persist=False`` keeps it only while this daemon runs; ``dry_run`` only validates."""
        body: JSON = {"persist": persist}
        if preset is not None:
            body["preset"] = preset
        if curve is not None:
            body["curve"] = to_plain(curve)
        if fans is not None:
            body["fans"] = list(fans)
        params = {"dry_run": "1"} if dry_run else None
        data = await self._call("PUT", f"/api/gpus/{gpu}/fans", json_body=body, params=params)
        return from_plain(FanCurveResult, data)

    async def restore_fans(self, gpu: str = "all") -> list[str]:
        data = await self._call("POST", f"/api/gpus/{gpu}/fans/auto")
        return [str(u) for u in data["gpus"]]

    async def power_limit(self, gpu: str) -> PowerLimitStatus:
        return from_plain(PowerLimitStatus, await self._call("GET", f"/api/gpus/{gpu}/power"))

    async def set_power_limit(
        self,
        gpu: str,
        *,
        watts: float | None = None,
        preset: str | None = None,
        persist: bool = True,
        dry_run: bool = False,
    ) -> PowerLimitStatus:
        body: JSON = {"persist": persist}
        if watts is not None:
            body["watts"] = watts
        if preset is not None:
            body["preset"] = preset
        params = {"dry_run": "1"} if dry_run else None
        data = await self._call("PUT", f"/api/gpus/{gpu}/power", json_body=body, params=params)
        return from_plain(PowerLimitStatus, data)

    async def reset_power_limit(self, gpu: str = "all") -> list[str]:
        data = await self._call("POST", f"/api/gpus/{gpu}/power/reset")
        return [str(u) for u in data["gpus"]]

    async def guard(self) -> GuardStatus:
        return from_plain(GuardStatus, await self._call("GET", "/api/gpus/guard"))

    async def set_guard(self, changes: JSON, *, dry_run: bool = False) -> GuardStatus:
        """``changes``: guard_enabled and any gpu.guard_* threshold (without the section)."""
        params = {"dry_run": "1"} if dry_run else None
        data = await self._call("PUT", "/api/gpus/guard", json_body=changes, params=params)
        return from_plain(GuardStatus, data)

    # ----------------------------------------------------------------- hub
    # /api/models and /api/downloads

    async def hub_access(self) -> JSON:
        """Endpoint, cache folder, and whether a Hugging Face token is found and sent."""
        data: JSON = await self._call("GET", "/api/models/hub")
        return data

    async def search_models(
        self, query: str = "", *, sort: str = "downloads", quant: str | None = None, limit: int = 20
    ) -> list[ModelSummary]:
        params = {"q": query, "sort": sort, "limit": str(limit)}
        if quant:
            params["quant"] = quant
        data = await self._call("GET", "/api/models/search", params=params)
        return [from_plain(ModelSummary, m) for m in data]

    async def model_details(self, repo_id: str, revision: str | None = None) -> ModelDetails:
        params = {"revision": revision} if revision else None
        data = await self._call("GET", f"/api/models/{repo_id}", params=params)
        return from_plain(ModelDetails, data)

    async def model_fit(
        self,
        repo_id: str,
        *,
        revision: str | None = None,
        engine: str | None = None,
        gpus: int | None = None,
        context: int | None = None,
        concurrency: int = 1,
        kv_cache_dtype: str = "auto",
        device: str | None = None,
    ) -> list[FitResult]:
        """Without engine/gpus: every engine on 1 and 2 GPUs (the Models page badges);
        ``device="cpu"``: the CPU build in this computer's memory."""
        params = {"concurrency": str(concurrency), "kv_cache_dtype": kv_cache_dtype}
        for key, value in (
            ("revision", revision),
            ("engine", engine),
            ("gpus", gpus),
            ("context", context),
            ("device", device),
        ):
            if value is not None:
                params[key] = str(value)
        data = await self._call("GET", f"/api/models/{repo_id}/fit", params=params)
        return [from_plain(FitResult, r) for r in data]

    async def local_models(self) -> list[LocalModel]:
        return [from_plain(LocalModel, m) for m in await self._call("GET", "/api/models")]

    async def local_folders(self) -> list[LocalFolder]:
        """Model folders registered in the library (``traylm models add``)."""
        return [from_plain(LocalFolder, m) for m in await self._call("GET", "/api/models/local")]

    async def add_local_folder(self, path: str, name: str | None = None) -> LocalFolder:
        body: JSON = {"path": path, **({"name": name} if name else {})}
        return from_plain(
            LocalFolder, await self._call("POST", "/api/models/local", json_body=body)
        )

    async def remove_local_folder(self, name: str) -> LocalFolder:
        return from_plain(LocalFolder, await self._call("DELETE", f"/api/models/local/{name}"))

    async def verify_model(
        self, repo_id: str, revision: str | None = None, *, timeout_s: float = 3600
    ) -> list[LocalModel]:
        """Hash every file against the Hub's hashes (minutes for big models)."""
        params = {"revision": revision} if revision else None
        timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=3)
        try:
            async with self._http().post(
                f"/api/models/{repo_id}/verify", params=params, timeout=timeout
            ) as resp:
                data = await resp.json(content_type=None)
                if resp.status >= 400:
                    raise api_error(resp.status, data)
        except (aiohttp.ClientConnectionError, TimeoutError) as exc:
            raise DaemonUnavailable(f"verification of {repo_id} did not answer ({exc!r})") from None
        return [from_plain(LocalModel, m) for m in data]

    async def delete_model(self, repo_id: str, revision: str | None = None) -> JSON:
        params = {"revision": revision} if revision else None
        data: JSON = await self._call("DELETE", f"/api/models/{repo_id}", params=params)
        return data

    async def trust_model(self, repo_id: str, trust_remote_code: bool) -> JSON:
        body = {"trust_remote_code": trust_remote_code}
        data: JSON = await self._call("PUT", f"/api/models/{repo_id}/trust", json_body=body)
        return data

    async def downloads(self) -> list[DownloadStatus]:
        return [from_plain(DownloadStatus, d) for d in await self._call("GET", "/api/downloads")]

    async def download(self, download_id: str) -> DownloadStatus:
        return from_plain(DownloadStatus, await self._call("GET", f"/api/downloads/{download_id}"))

    async def pull(self, repo_id: str, revision: str | None = None) -> DownloadStatus:
        body: JSON = {"repo_id": repo_id}
        if revision:
            body["revision"] = revision
        return from_plain(
            DownloadStatus, await self._call("POST", "/api/downloads", json_body=body)
        )

    async def download_action(self, download_id: str, action: str) -> DownloadStatus:
        """``action``: pause, resume or cancel."""
        data = await self._call("POST", f"/api/downloads/{download_id}/{action}")
        return from_plain(DownloadStatus, data)

    # ----------------------------------------------------------------- TensorRT-LLM, remote
    # the TensorRT-LLM engine cache and remote fallback

    async def trt_cache(self) -> list[TRTCacheEntry]:
        """Cached TensorRT engines, least recently used first."""
        return [from_plain(TRTCacheEntry, e) for e in await self._call("GET", "/api/trt/cache")]

    async def trt_cache_remove(self, entry_id: str) -> TRTCacheEntry:
        data = await self._call("DELETE", f"/api/trt/cache/{entry_id}")
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

    async def remote_status(self) -> RemoteStatus:
        return from_plain(RemoteStatus, await self._call("GET", "/api/remote"))

    async def remote_refresh_key(self) -> RemoteStatus:
        """Make the daemon read the OS keyring again (after `traylm remote set-key`)."""
        return from_plain(RemoteStatus, await self._call("POST", "/api/remote/refresh-key"))

    # ----------------------------------------------------------------- chats
    # /api/chats

    # ----------------------------------------------------------------- bench
    # Benchmark runs (engines/bench/service.py). A run goes on in the daemon after start;
    # follow it with ``events(kinds=("bench",))``: BenchProgress while it runs, BenchFinished at
    # the end (done, failed, cancelled or interrupted), then read it with ``bench_run``.

    async def bench_runs(self, limit: int = 200) -> list[BenchRunSummary]:
        """Stored runs, newest first."""
        data = await self._call("GET", "/api/bench/runs", params={"limit": str(limit)})
        return [from_plain(BenchRunSummary, r) for r in data]

    async def bench_run(self, run_id: int) -> BenchRun:
        return from_plain(BenchRun, await self._call("GET", f"/api/bench/runs/{run_id}"))

    async def bench_start(self, config: BenchConfig, *, api_key: str = "") -> BenchRun:
        """Start a run (one at a time); ``api_key`` is for a gateway with keys and is never
        stored. Returns the run in state running."""
        body = to_plain(config)
        if api_key:
            body["api_key"] = api_key
        return from_plain(BenchRun, await self._call("POST", "/api/bench/runs", json_body=body))

    async def bench_cancel(self, run_id: int) -> BenchRunSummary:
        """Stop a running run; what finished is kept (state cancelled)."""
        data = await self._call("POST", f"/api/bench/runs/{run_id}/cancel")
        return from_plain(BenchRunSummary, data)

    async def bench_delete(self, run_id: int) -> None:
        await self._call("DELETE", f"/api/bench/runs/{run_id}")

    async def bench_current(self) -> tuple[BenchRunSummary | None, BenchProgress | None]:
        """The running run and its latest progress (None, None when none runs)."""
        data = await self._call("GET", "/api/bench/current")
        run = from_plain(BenchRunSummary, data["run"]) if data.get("run") else None
        progress = from_plain(BenchProgress, data["progress"]) if data.get("progress") else None
        return run, progress

    async def bench_report_html(self, run_ids: Iterable[int]) -> str:
        """The self-contained HTML report of one run, or a comparison of several."""
        params = {"ids": ",".join(str(i) for i in run_ids)}
        try:
            async with self._http().get("/api/bench/report", params=params) as resp:
                if resp.status != 200:
                    data = await resp.json(content_type=None)
                    raise api_error(resp.status, data)
                return await resp.text()
        except (aiohttp.ClientConnectionError, TimeoutError) as exc:
            raise DaemonUnavailable(
                f"the traylm daemon at {self.info.url} does not answer ({type(exc).__name__})"
            ) from None

    async def chats(self) -> list[ChatSummary]:
        """Stored conversations of the chat window, newest first."""
        return [from_plain(ChatSummary, c) for c in await self._call("GET", "/api/chats")]

    async def chat(self, chat_id: int) -> ChatTranscript:
        return from_plain(ChatTranscript, await self._call("GET", f"/api/chats/{chat_id}"))

    async def create_chat(
        self,
        *,
        title: str = "",
        model: str = "",
        system_prompt: str = "",
        params: dict[str, float] | None = None,
    ) -> ChatSummary:
        body = {"title": title, "model": model, "system_prompt": system_prompt}
        data = await self._call("POST", "/api/chats", json_body={**body, "params": params or {}})
        return from_plain(ChatSummary, data)

    async def update_chat(self, chat_id: int, **changes: Any) -> ChatSummary:
        """Change title, model, system_prompt or params of a conversation."""
        data = await self._call("PATCH", f"/api/chats/{chat_id}", json_body=changes)
        return from_plain(ChatSummary, data)

    async def delete_chat(self, chat_id: int) -> None:
        await self._call("DELETE", f"/api/chats/{chat_id}")

    async def add_chat_messages(
        self, chat_id: int, messages: Iterable[JSON], *, truncate_from: int | None = None
    ) -> ChatTranscript:
        """Append messages ({role, content, model?, stats?, finish_reason?}); with
        ``truncate_from`` the messages from that position on are replaced (regenerate, edit)."""
        body = {"messages": list(messages), "truncate_from": truncate_from}
        data = await self._call("POST", f"/api/chats/{chat_id}/messages", json_body=body)
        return from_plain(ChatTranscript, data)

    async def gateway_metrics(self) -> str:
        """The gateway's Prometheus text (through the control token, so API keys do not
        matter)."""
        data = await self._call("GET", "/api/metrics")
        return str(data["text"])

    async def add_api_key(self) -> str:
        """Create a gateway API key; returns it (shown once: only its SHA-256 is stored)."""
        key = "tlm-" + secrets.token_urlsafe(32)
        digest = hashlib.sha256(key.encode()).hexdigest()  # as engines.gateway.security.hash_key
        settings = await self.settings()
        current = list(settings["settings"]["gateway"]["api_key_sha256"])
        await self.update_settings({"gateway.api_key_sha256": [*current, digest]})
        return key

    async def remove_api_key(self, digest: str) -> None:
        """Remove a key by its SHA-256 digest (the daemon refuses while LAN sharing needs it)."""
        settings = await self.settings()
        current = list(settings["settings"]["gateway"]["api_key_sha256"])
        if digest not in current:
            raise ControlAPIError(
                "no such API key; the settings page lists the keys",
                code="not_found",
                http_status=404,
            )
        await self.update_settings({"gateway.api_key_sha256": [d for d in current if d != digest]})
