"""The bench worker process: ``python -m engines.bench.worker`` reads one job (JSON) on stdin,
runs it, and writes JSON lines on stdout: ``{"type": "progress", "event": ...}`` while it runs
and one ``{"type": "result", ...}`` at the end. SIGTERM or SIGINT stop it early: it cancels the
requests in flight and still writes the result of what finished (state "cancelled").

The daemon starts it (engines/bench/service.py) so that the load generator runs beside the
gateway instead of inside its event loop. Job fields: ``run_id``, ``config`` (BenchConfig),
``target`` (OpenAI base URL), ``tokenize_root`` (or null), ``api_key``, ``daemon`` ({"url",
"token", "pid", "version"}: where to read GPU telemetry, or null).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from typing import Any

from engines.bench.load import Target
from engines.bench.runner import RunOutcome, run_benchmark
from engines.client import DaemonClient, DaemonInfo
from engines.errors import TraylmError
from engines.events.bench import BenchConfig, BenchProgress, BenchState
from engines.events.codec import from_plain, to_plain

log = logging.getLogger("traylm.bench.worker")
ORPHAN_CHECK_S = 1.0


def _emit(line: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(line, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def _progress(event: BenchProgress) -> None:
    _emit({"type": "progress", "event": event.to_wire()})


async def _stop_when_orphaned(stop: asyncio.Event) -> None:
    """Stop the run if the daemon that started this worker dies (kill -9): nobody would read
    the result, and the load would go on hitting the engines."""
    parent = os.getppid()
    while not stop.is_set():
        if os.getppid() != parent:
            log.warning("the daemon is gone: stopping the benchmark")
            stop.set()
            return
        await asyncio.sleep(ORPHAN_CHECK_S)


def _client(daemon: dict[str, Any] | None) -> DaemonClient | None:
    if not daemon:
        return None
    info = DaemonInfo(
        pid=int(daemon.get("pid", 0)),
        url=str(daemon["url"]),
        port=int(daemon.get("port", 0)),
        token=str(daemon["token"]),
        version=str(daemon.get("version", "")),
        started_at_s=time.time(),
    )
    return DaemonClient(info, timeout_s=10)


async def run_job(job: dict[str, Any]) -> dict[str, Any]:
    config = from_plain(BenchConfig, job["config"])
    target = Target(
        base_url=str(job["target"]),
        model=config.model,
        api_key=str(job.get("api_key") or ""),
        timeout_s=config.request_timeout_s,
        run_id=int(job.get("run_id", 0)),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watchdog = asyncio.create_task(_stop_when_orphaned(stop))
    client = _client(job.get("daemon"))
    try:
        outcome = await run_benchmark(
            config,
            run_id=int(job.get("run_id", 0)),
            target=target,
            tokenize_root=job.get("tokenize_root"),
            telemetry=client,
            progress=_progress,
            stop=stop,
        )
    except TraylmError as exc:
        outcome = RunOutcome(BenchState.FAILED, (), "", exc.message)
    finally:
        watchdog.cancel()
        if client is not None:
            await client.close()
    _log_outcome(int(job.get("run_id", 0)), outcome)
    return {
        "type": "result",
        "state": str(outcome.state),
        "detail": outcome.detail,
        "prompt_source": outcome.prompt_source,
        "levels": to_plain(outcome.levels),
    }


def _log_outcome(run_id: int, outcome: RunOutcome) -> None:
    """The run's end in its log, with each level's failures counted by reason."""
    for level in outcome.levels:
        log.info(
            "concurrency %d: %d completed, %d failed",
            level.concurrency,
            level.completed,
            level.failed,
        )
        for message, count in level.errors.items():
            log.info("concurrency %d: %d x %s", level.concurrency, count, message)
    detail = f": {outcome.detail}" if outcome.detail else ""
    if outcome.state == BenchState.FAILED:
        log.error("run #%d failed%s", run_id, detail)
    else:
        log.info("run #%d %s%s", run_id, outcome.state, detail)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    job = json.loads(sys.stdin.read())
    try:
        result = asyncio.run(run_job(job))
    except Exception as exc:  # boundary: the daemon must get a result line whatever happened
        log.exception("the benchmark crashed")
        result = {
            "type": "result",
            "state": str(BenchState.FAILED),
            "detail": f"the benchmark worker crashed: {type(exc).__name__}: {exc}",
            "prompt_source": "",
            "levels": [],
        }
    _emit(result)


if __name__ == "__main__":
    main()
