"""The start of one life of an engine: its process spawned (a warm one taken when there is one:
engines/runtime/warm.py), the wait until it is ready, and the warm process for its next start.

Ready means: the process is alive AND ``GET /health`` is 200 AND ``GET /v1/models`` is 200,
probed every 50 ms (a refused connection costs little), so a request waiting for a cold model
is relayed within a probe period of the engine listening."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import aiohttp

from engines.core.procs import exit_code
from engines.events.core import Diagnosis
from engines.runtime.adapters.base import LaunchSpec
from engines.runtime.liveness import Health
from engines.runtime.log import EngineLog
from engines.runtime.ports import Ranks
from engines.runtime.probe import probe
from engines.runtime.process import EngineProcess
from engines.runtime.spawn import argv_text, engine_env, start_process, write_run_files
from engines.runtime.supervision import Supervision
from engines.runtime.warm import WarmPool

log = logging.getLogger(__name__)

HEALTH_PERIOD_S = 0.05  # readiness probe while starting
DESCENDANTS_PERIOD_S = 0.5  # the process-tree scan while starting (it reads every process)


async def spawn(
    spec: LaunchSpec, *, engine_id: str, run_dir: Path, warm: WarmPool | None, engine_log: EngineLog
) -> asyncio.subprocess.Process:
    """Start the engine's process (or take its warm one) with the log opened for it. Raises
    OSError when no process could be started."""
    spec = write_run_files(spec, run_dir)
    argv = argv_text(spec.argv)
    env = engine_env(spec)
    taken = None
    if warm is not None and spec.warm_argv:
        taken = await warm.take(engine_id, spec.warm_argv, env, spec.argv)
    note = [f"===== traylm: in warm process {taken.pid} (imports done ahead)"] if taken else []
    engine_log.open([f"===== argv: {argv}", *note])
    return taken or await start_process(spec.argv, env)


async def prepare_warm(spec: LaunchSpec, *, engine_id: str, warm: WarmPool | None) -> None:
    """Start the process for this engine's next start now (it is ready: nothing to slow)."""
    if warm is None or not spec.warm_argv:
        return
    try:
        await warm.prepare(engine_id, spec.warm_argv, engine_env(spec))
    except OSError as exc:  # only a later start gets slower: say so, go on serving
        log.warning("engine %s: no warm process for the next start: %s", engine_id, exc)


async def wait_until_ready(
    process: EngineProcess,
    spec: LaunchSpec,
    *,
    base_url: str | None,
    timeout_s: float,
    ranks: Ranks | None,
    engine_log: EngineLog,
    supervision: Supervision,
) -> bool:
    """True once the engine is ready; False when its process ended, a rank ended or
    ``timeout_s`` passed (the log's diagnosis then says why when nothing else did)."""
    deadline = time.monotonic() + timeout_s
    trouble = supervision.trouble
    scanned = 0.0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
        while time.monotonic() < deadline:
            if process.returncode is not None:
                return False
            if ranks is not None and (why := ranks.problem()):
                engine_log.diagnosis = Diagnosis(
                    code="rank_ended",
                    summary=why,
                    advice="Every rank was ended; the engine logs on each box show why.",
                )
                return False
            if (
                await probe(http, base_url, spec.health_path, trouble) == Health.OK
                and await probe(http, base_url, spec.models_path, trouble) == Health.OK
            ):
                return process.returncode is None
            if time.monotonic() - scanned >= DESCENDANTS_PERIOD_S:
                await process.track_descendants()
                scanned = time.monotonic()
            await exit_code(process.proc, HEALTH_PERIOD_S)
    engine_log.diagnosis = engine_log.diagnosis or Diagnosis(
        code="ready_timeout",
        summary=f"not ready after {timeout_s:.0f} s",
        advice="The engine log shows how far it got; raise engines.ready_timeout_s for very "
        "large models or first-time compiles.",
    )
    return False
