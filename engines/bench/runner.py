"""One benchmark run: for each concurrency level, warm-up requests (left out), the measured
requests with progress, then the GPU telemetry over exactly the measured window.

It runs in the bench worker process (engines/bench/worker.py), not in the daemon, so that the
load generator's own work does not share the event loop with the gateway it measures.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from engines.bench.load import LoadResult, RequestSpec, Target, run_load
from engines.bench.metrics import RequestTiming, failure_reason, level_result
from engines.bench.prompts import WORKLOADS, EngineTokenizer, build_requests
from engines.bench.replay import read_workload_file
from engines.bench.telemetry import TelemetryRecorder, TelemetrySource
from engines.errors import BenchError, ConfigError
from engines.events.bench import BenchConfig, BenchLevel, BenchProgress, BenchState

log = logging.getLogger("traylm.bench.worker")  # the run's log (engines/bench/worker.py)
PROGRESS_EVERY_S = 0.5
MAX_CONCURRENCY = 4096
MAX_REQUESTS = 100_000
MAX_LOGGED_FAILURES = 200
"""Failed requests the run's log names one by one; the rest are counted at the end."""

Progress = Callable[[BenchProgress], None]


@dataclass(frozen=True)
class RunOutcome:
    state: BenchState
    levels: tuple[BenchLevel, ...]
    prompt_source: str  # "tokenize" | "approx" | "chat"
    detail: str = ""


def requests_per_level(config: BenchConfig, concurrency: int) -> int:
    return config.requests if config.requests > 0 else max(32, 4 * concurrency)


def check_config(config: BenchConfig) -> None:
    """Raise ConfigError naming the first bad field and a valid value."""
    if not config.model:
        raise ConfigError("name the model to benchmark (--model; `traylm status` lists them)")
    if config.workload == "file":
        if not config.workload_file:
            raise ConfigError("the file workload needs its file (--workload FILE)")
    elif config.workload not in WORKLOADS:
        raise ConfigError(
            f"unknown workload {config.workload!r}; use one of: {', '.join(WORKLOADS)}, "
            "or a file from `traylm requests export`"
        )
    if not 1 <= config.input_len <= 1_000_000 or not 1 <= config.output_len <= 1_000_000:
        raise ConfigError("--input-len and --output-len must be whole numbers from 1 up")
    if not config.concurrency or any(not 1 <= c <= MAX_CONCURRENCY for c in config.concurrency):
        raise ConfigError(
            f"--concurrency takes levels from 1 to {MAX_CONCURRENCY}, e.g. --concurrency 1,8,32"
        )
    if not 0 <= config.requests <= MAX_REQUESTS:
        raise ConfigError(f"--requests must be from 1 to {MAX_REQUESTS} (0: automatic)")
    if not 0 <= config.warmup <= 1000:
        raise ConfigError("--warmup must be from 0 to 1000 requests")
    if config.rate_rps < 0:
        raise ConfigError("--rate is requests per second (0: all at once)")
    if config.request_timeout_s <= 0:
        raise ConfigError("request_timeout_s must be positive")
    if config.url and not config.url.startswith(("http://", "https://")):
        raise ConfigError(f"--url {config.url!r} must start with http:// or https://")


async def run_benchmark(
    config: BenchConfig,
    *,
    run_id: int,
    target: Target,
    tokenize_root: str | None,
    telemetry: TelemetrySource | None,
    progress: Progress,
    stop: asyncio.Event,
) -> RunOutcome:
    """Run every level of ``config`` against ``target``. ``tokenize_root`` is the engine's
    server root for /tokenize (None: prompt lengths are approximate). Setting ``stop`` ends the
    run early; what finished is kept (state cancelled)."""
    check_config(config)
    recorder = TelemetryRecorder(telemetry)
    await recorder.start()
    levels: list[BenchLevel] = []
    try:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as http:
            tokenizer = None
            prompt_source = "chat" if config.workload == "chat" else "approx"
            if config.workload == "random" and tokenize_root:
                candidate = EngineTokenizer(http, tokenize_root, config.model)
                if await candidate.probe():
                    tokenizer, prompt_source = candidate, "tokenize"
            level_run = _LevelRun(config, run_id, target, http, tokenizer, recorder, progress)
            for index, concurrency in enumerate(config.concurrency):
                if stop.is_set():
                    break
                level = await level_run.run(index, concurrency, stop)
                if level is not None:
                    levels.append(level)
                if level is None or level.cancelled:
                    break
    finally:
        await recorder.stop()
    if stop.is_set():
        return RunOutcome(BenchState.CANCELLED, tuple(levels), prompt_source, "cancelled")
    if levels and not any(lv.completed for lv in levels):
        first = next((e for lv in levels for e in lv.errors), "no reply")
        return RunOutcome(
            BenchState.FAILED, tuple(levels), prompt_source, f"no request completed: {first}"
        )
    return RunOutcome(BenchState.DONE, tuple(levels), prompt_source)


class _LevelRun:
    def __init__(
        self,
        config: BenchConfig,
        run_id: int,
        target: Target,
        http: aiohttp.ClientSession,
        tokenizer: EngineTokenizer | None,
        recorder: TelemetryRecorder,
        progress: Progress,
    ) -> None:
        self.config = config
        self.run_id = run_id
        self.target = target
        self.http = http
        self.tokenizer = tokenizer
        self.recorder = recorder
        self.progress = progress
        self.logged = 0  # failed requests named in the run's log

    def _emit(self, index: int, concurrency: int, phase: str, **fields: object) -> None:
        self.progress(
            BenchProgress(
                run_id=self.run_id,
                phase=phase,
                level_index=index,
                levels_total=len(self.config.concurrency),
                concurrency=concurrency,
                **fields,  # type: ignore[arg-type]
            )
        )

    async def run(self, index: int, concurrency: int, stop: asyncio.Event) -> BenchLevel | None:
        """One level; None when a cancel came before its measured part began."""
        c = self.config
        count = requests_per_level(c, concurrency)
        self._emit(index, concurrency, "prepare", total=count)
        if c.workload == "file":  # a recorded day, as it came: no warm-up
            path = Path(c.workload_file)
            paced = not c.as_fast_as_possible
            specs = await asyncio.to_thread(read_workload_file, path, paced=paced)
            count, warm, measured = len(specs), [], specs
        else:
            specs = await build_requests(
                c.workload,
                count=count + c.warmup,
                input_len=c.input_len,
                output_len=c.output_len,
                seed=c.seed * 100_003 + index,
                tokenizer=self.tokenizer,
            )
            warm, measured = specs[: c.warmup], specs[c.warmup :]
        if warm:
            self._emit(index, concurrency, "warmup", total=len(warm))
            done = await run_load(
                self.http,
                self.target,
                warm,
                concurrency=concurrency,
                stop=stop,
                on_done=lambda t: self._log_failure(t, concurrency, "warm-up"),
            )
            if done.cancelled:
                return None
            _check_warmup(done, self.target)
        result = await self._measure(index, concurrency, measured, stop)
        self._emit(index, concurrency, "telemetry", total=count, completed=len(result.timings))
        wall = time.time() - time.perf_counter()
        start_wall, end_wall = result.start_s + wall, result.end_s + wall
        if not stop.is_set():  # a cancel does not wait for one more sample
            await self.recorder.wait_past(end_wall)
        out_tokens = sum(t.output_tokens for t in result.timings if t.ok)
        return level_result(
            result.timings,
            concurrency=concurrency,
            rate_rps=c.rate_rps,
            requests=count,
            level_start_s=result.start_s,
            duration_s=result.duration_s,
            max_concurrency_seen=result.max_in_flight,
            telemetry=self.recorder.window(start_wall, end_wall, out_tokens),
            cancelled=result.cancelled,
        )

    def _log_failure(self, timing: RequestTiming, concurrency: int, part: str) -> None:
        """A failed request in the run's log: its id in `traylm requests` and why (the first
        MAX_LOGGED_FAILURES; the end of the run counts them all by reason)."""
        if timing.ok or self.logged >= MAX_LOGGED_FAILURES:
            return
        self.logged += 1
        rid = timing.request_id or "(no answer, so no request id)"
        reason = failure_reason(timing)
        log.warning("concurrency %d, %s request %s: %s", concurrency, part, rid, reason)
        if self.logged == MAX_LOGGED_FAILURES:
            log.warning("%d failed requests named; the others are counted at the end", self.logged)

    async def _measure(
        self, index: int, concurrency: int, specs: list[RequestSpec], stop: asyncio.Event
    ) -> LoadResult:
        finished: list[RequestTiming] = []
        started = time.perf_counter()

        def report() -> None:
            elapsed = time.perf_counter() - started
            good = [t for t in finished if t.ok]
            self._emit(
                index,
                concurrency,
                "measure",
                total=len(specs),
                completed=len(good),
                failed=len(finished) - len(good),
                elapsed_s=elapsed,
                output_throughput_tps=sum(t.output_tokens for t in good) / max(elapsed, 1e-9),
            )

        async def ticker() -> None:
            while True:
                report()
                await asyncio.sleep(PROGRESS_EVERY_S)  # a progress cadence, not a wait

        def done(timing: RequestTiming) -> None:
            finished.append(timing)
            self._log_failure(timing, concurrency, "measured")

        tick = asyncio.create_task(ticker())
        try:
            return await run_load(
                self.http,
                self.target,
                specs,
                concurrency=concurrency,
                rate_rps=self.config.rate_rps,
                seed=self.config.seed + index,
                stop=stop,
                on_done=done,
            )
        finally:
            tick.cancel()
            report()


def _check_warmup(done: LoadResult, target: Target) -> None:
    if any(t.ok for t in done.timings):
        return
    error = next((t.error for t in done.timings if t.error), "the replies carried no text")
    hint = ""
    if "HTTP 401" in error:
        hint = "; the gateway needs an API key: set TRAYLM_API_KEY to a key from `traylm keys add`"
    elif "HTTP 404" in error:
        hint = f"; is {target.model!r} served at {target.base_url}? `traylm status` lists models"
    raise BenchError(f"every warm-up request failed ({error}){hint}")
