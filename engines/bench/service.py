"""``BenchFeature``: benchmark runs started through the control API, one at a time.

Control API (token-protected like the rest of /api):
    GET    /api/bench/runs[?limit=N]        BenchRunSummary list, newest first
    POST   /api/bench/runs                  BenchConfig fields (+ optional "api_key", never
                                            stored) → 202 BenchRun (state running)
    GET    /api/bench/runs/{id}             BenchRun (levels, figures, telemetry)
    DELETE /api/bench/runs/{id}             {"deleted": id} (refused while it runs)
    POST   /api/bench/runs/{id}/cancel      stops it; → BenchRunSummary (state cancelled)
    GET    /api/bench/current               {"run": BenchRunSummary|null,
                                             "progress": BenchProgress|null}
    GET    /api/bench/report?ids=1,2        self-contained HTML report (text/html)
Events: bench.progress (BenchProgress), bench.finished (BenchFinished). /api/status gains
"bench" (the running run's summary, or null).

A run is a worker process (engines/bench/worker.py) that sends the load and reads GPU telemetry
back from this daemon; this feature checks the request, resolves where the requests go, stores the
run and relays the worker's progress as events. Runs are jobs of one kind (engines/core/jobs.py),
one at a time; a cancel signals the worker, which keeps what finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import urlsplit

import aiohttp

from engines import __version__
from engines.bench.metrics import DEFINITIONS
from engines.bench.runner import check_config
from engines.bench.runs import RunStore, summary
from engines.config.live import SettingsView
from engines.core.http import dataclass_body
from engines.core.jobs import Job, JobKind, JobState, JobStatus
from engines.core.store import Store
from engines.errors import BenchError, ConfigError, DiskFull, quoted
from engines.events.bench import (
    BenchConfig,
    BenchFinished,
    BenchLevel,
    BenchProgress,
    BenchRun,
    BenchRunSummary,
    BenchState,
)
from engines.events.codec import Event, from_plain, to_plain
from engines.events.core import EngineState
from engines.events.registry import from_wire
from engines.runtime.supervisor import RoutingView

if TYPE_CHECKING:
    from engines.runtime.supervisor import ManagedEngine

log = logging.getLogger(__name__)
STOP_GRACE_S = 8.0  # under the daemon's 10 s per feature stop
WORKER_LINE_LIMIT = 64 * 1024 * 1024


@dataclasses.dataclass
class _Worker:
    run: BenchRun
    proc: asyncio.subprocess.Process
    log_path: Path
    stop_state: BenchState | None = None  # set by a cancel or the daemon stopping


class BenchFeature:
    name = "bench"

    def __init__(
        self,
        *,
        store: Store,
        engines: RoutingView,
        settings: SettingsView,
        control_token: str,
        logs_dir: Path,
        publish: Callable[[Event], None],
        internal_key: Callable[[], str] = str,
        note_failed: Callable[[Mapping[str, str]], Awaitable[None]] | None = None,
    ) -> None:
        """No I/O. ``internal_key``: the gateway's credential for the daemon's own
        measurements (``run_to_end``), which never need the user's API key.
        ``control_token``: handed to the worker, which reads GPU telemetry back
        from the daemon's control API during the run. ``note_failed``: the flight recorder's
        ``note_errors``, given each failed request's reason (request id → reason) at the end."""
        self.runs = RunStore(store)
        self._engines = engines
        self._settings = settings
        self._token = control_token
        self._internal_key = internal_key
        self._note_failed = note_failed
        self._logs_dir = logs_dir
        self.jobs: JobKind[BenchRun] = JobKind(
            "benchmark run",
            publish=publish,
            finished=_finished,
            busy=lambda s: (
                f"benchmark run {s.id} is still running; wait for it, or stop it "
                f"with `traylm bench cancel {s.id}`"
            ),
            error=BenchError,
        )
        self._worker: _Worker | None = None
        self._starting = asyncio.Lock()

    def status(self) -> BenchRunSummary | None:
        """The running run's summary, or None (/api/status "bench")."""
        run = self.current
        return summary(run) if run is not None else None

    @property
    def progress(self) -> BenchProgress | None:
        job = self.jobs.current
        return job.progress if job is not None and isinstance(job.progress, BenchProgress) else None

    async def start(self) -> None:
        count = await asyncio.to_thread(self.runs.mark_interrupted)
        if count:
            log.info("%d benchmark run(s) were left running by a stopped daemon", count)

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.stop_state = BenchState.INTERRUPTED
        await self.jobs.stop()

    @property
    def current(self) -> BenchRun | None:
        job = self.jobs.current
        return job.record if job is not None else None

    # ----------------------------------------------------------------- start

    async def start_run(self, config: BenchConfig, *, api_key: str = "") -> BenchRun:
        """Check, resolve the target, store the run and start the worker (returns at once)."""
        check_config(config)
        async with self._starting:
            self.jobs.refuse_if_running()
            target, tokenize_root, engine = self._resolve(config)
            await _preflight(target, config.model, api_key)
            run = await asyncio.to_thread(self.runs.create, config, target=target, engine=engine)
            run = dataclasses.replace(
                run, definitions=DEFINITIONS, log_path=str(self._log_path(run.id))
            )
            port = self._settings.current.gateway.port
            job_spec = {
                "run_id": run.id,
                "config": to_plain(config),
                "target": target,
                "tokenize_root": tokenize_root,
                "api_key": api_key,
                "daemon": {
                    "url": f"http://127.0.0.1:{port}",
                    "port": port,
                    "token": self._token,
                    "version": __version__,
                },
            }
            try:
                worker = await self._spawn(run, job_spec)
            except OSError as exc:
                failed = dataclasses.replace(
                    run,
                    state=BenchState.FAILED,
                    finished_s=time.time(),
                    detail=f"the benchmark worker did not start: {exc}",
                )
                await asyncio.to_thread(self.runs.save, failed)
                raise BenchError(failed.detail) from None
            self._worker = worker
            job = self.jobs.start(run, lambda job: self._watch(job, worker), job_id=run.id)
            job.on_cancel = lambda: self._end(worker, BenchState.CANCELLED)
            return run

    async def run_to_end(self, config: BenchConfig) -> BenchRun:
        """Start a run and return it once it ended (stored). Cancelling the caller cancels
        the run (its worker stopped, what finished kept) before the CancelledError goes on:
        the tuner measures its candidates through this."""
        run = await self.start_run(config, api_key=self._internal_key())
        return await self.jobs.get(run.id).result()

    def _resolve(self, config: BenchConfig) -> tuple[str, str | None, dict[str, str]]:
        """(OpenAI base URL, server root for /tokenize or None, engine facts)."""
        if not config.url:
            engine = self._engines.route(config.model)
            if engine is None:
                served = sorted({n for n, _ in self._engines.served_models()})
                listing = ", ".join(served) or "none (start one with `traylm start PROFILE`)"
                raise BenchError(
                    f"the model {quoted(config.model)} is not served; served: {listing}"
                )
            if engine.state != EngineState.READY:
                raise BenchError(
                    f"the engine for {quoted(config.model)} is {engine.state}; benchmark it once "
                    "`traylm status` shows it ready"
                )
            target = f"http://127.0.0.1:{self._settings.current.gateway.port}/v1"
            return target, engine.base_url, _engine_facts(engine)
        url = config.url.rstrip("/")
        if not url.endswith("/v1"):
            url += "/v1"
        root = url.removesuffix("/v1")
        parts = urlsplit(url)
        facts: dict[str, str] = {}
        for engine in self._engines.engines.values():
            local = parts.hostname in ("127.0.0.1", "localhost", "::1")
            if local and engine.port is not None and engine.port == parts.port:
                facts = _engine_facts(engine)
        return url, root, facts

    def _log_path(self, run_id: int) -> Path:
        return self._logs_dir / "bench" / f"run-{run_id}.log"

    async def _spawn(self, run: BenchRun, job_spec: dict[str, Any]) -> _Worker:
        log_path = self._log_path(run.id)
        log_fh = await asyncio.to_thread(_open_log, log_path)
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "engines.bench.worker",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log_fh,
                limit=WORKER_LINE_LIMIT,
                start_new_session=True,
            )
        finally:
            log_fh.close()
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(job_spec).encode())
        await proc.stdin.drain()
        proc.stdin.close()
        return _Worker(run, proc, log_path)

    # ----------------------------------------------------------------- while it runs

    async def _watch(self, job: Job[BenchRun], worker: _Worker) -> BenchRun:
        result: dict[str, Any] | None = None
        assert worker.proc.stdout is not None
        try:
            async for raw in worker.proc.stdout:
                try:
                    line = json.loads(raw)
                except ValueError:
                    continue
                if line.get("type") == "progress":
                    event = from_wire(line["event"])
                    if isinstance(event, BenchProgress):
                        job.report(event)
                elif line.get("type") == "result":
                    result = line
        finally:
            code = await worker.proc.wait()
        final = self._final(worker, result, code)
        await self._note_failures(final)
        try:
            await asyncio.to_thread(self.runs.save, final)
        except DiskFull as exc:
            log.warning("benchmark run %d finished but was not stored: %s", final.id, exc.message)
        except Exception:  # boundary: a storage failure must not leave the run "running"
            log.exception("could not store benchmark run %d", final.id)
        self._worker = None
        return final

    async def _note_failures(self, run: BenchRun) -> None:
        """Each failed request's reason onto its row in the flight recorder."""
        reasons = {
            r.request_id: f"benchmark run #{run.id}: {r.error}"
            for level in run.levels
            for r in level.requests_detail
            if r.error and r.request_id
        }
        if self._note_failed is None or not reasons:
            return
        try:
            await self._note_failed(reasons)
        except Exception:  # boundary: the run is stored whatever the recorder did
            log.exception("could not note benchmark run %d's failures in the recorder", run.id)

    def _final(self, job: _Worker, result: dict[str, Any] | None, code: int) -> BenchRun:
        if result is None:
            state = job.stop_state or BenchState.FAILED
            detail = (
                "stopped" if job.stop_state else f"the benchmark worker exited with code {code}"
            )
            return dataclasses.replace(
                job.run,
                state=state,
                finished_s=time.time(),
                detail=f"{detail}; its log: {job.log_path}",
            )
        state = BenchState(result["state"])
        if state == BenchState.CANCELLED and job.stop_state is not None:
            state = job.stop_state
        levels = tuple(from_plain(BenchLevel, lv) for lv in result.get("levels", []))
        detail = str(result.get("detail", ""))
        if state == BenchState.INTERRUPTED:
            detail = "the daemon stopped during the run"
        return dataclasses.replace(
            job.run,
            state=state,
            finished_s=time.time(),
            detail=detail,
            prompt_source=str(result.get("prompt_source", "")),
            levels=levels,
        )

    # ----------------------------------------------------------------- cancel

    async def cancel(self, run_id: int) -> BenchRun:
        return (await self.jobs.cancel(run_id)).record

    async def _end(self, worker: _Worker, state: BenchState) -> None:
        """SIGTERM the worker (it keeps what finished), SIGKILL after a grace period."""
        worker.stop_state = worker.stop_state or state
        with contextlib.suppress(ProcessLookupError):
            worker.proc.terminate()
        try:
            await asyncio.wait_for(worker.proc.wait(), STOP_GRACE_S)
        except TimeoutError:
            log.warning("the benchmark worker ignored SIGTERM; killing it")
            with contextlib.suppress(ProcessLookupError):
                worker.proc.kill()

    def check_not_running(self, run_id: int) -> None:
        current = self.current
        if current is not None and current.id == run_id:
            raise BenchError(f"run {run_id} is running; cancel it first")


def _finished(status: JobStatus[BenchRun]) -> BenchFinished:
    """The run's end: as stored, or as the job ended when it could not say."""
    run = status.record
    if run.state == BenchState.RUNNING:
        failed = status.state == JobState.FAILED
        state = BenchState.FAILED if failed else BenchState.CANCELLED
        run = dataclasses.replace(
            run, state=state, finished_s=time.time(), detail=status.message or "cancelled"
        )
    return BenchFinished(summary=summary(run))


def _open_log(path: Path) -> IO[bytes]:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.open("ab")


def _engine_facts(engine: ManagedEngine) -> dict[str, str]:
    status = engine.status()
    return {
        "engine_id": status.engine_id,
        "engine": status.engine,
        "version": status.version,
        "device": status.device,
        "profile": status.profile,
    }


async def _preflight(target: str, model: str, api_key: str) -> None:
    """One clear error before anything is stored: nothing answers, a key is needed, or the
    model is not among the ones the target serves."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    timeout = aiohttp.ClientTimeout(total=10, sock_connect=3)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as http,
            http.get(target + "/models", headers=headers) as resp,
        ):
            if resp.status == 401:
                raise BenchError(
                    f"{target} needs an API key: set TRAYLM_API_KEY to a key from "
                    "`traylm keys add` (or the engine's --api-key)"
                )
            if resp.status != 200:
                raise BenchError(f"GET {target}/models answered HTTP {resp.status}")
            data = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise BenchError(
            f"nothing usable answers at {target} ({type(exc).__name__}); check --url"
        ) from None
    ids = [str(m.get("id")) for m in data.get("data", []) if isinstance(m, dict)]
    if model not in ids:
        raise BenchError(
            f"{target} does not serve {quoted(model)}; it serves: {', '.join(ids) or 'nothing'}"
        )


def config_from_body(body: dict[str, Any]) -> tuple[BenchConfig, str]:
    """(BenchConfig, api key) from a POST body; ConfigError names a bad field."""
    api_key = body.pop("api_key", None) or ""
    if not isinstance(api_key, str):
        raise ConfigError("api_key must be text")
    return dataclass_body(BenchConfig(model=""), body), api_key
