"""Run a TensorRT engine build: each step a subprocess in its own process group, its output
streamed line by line (so engine diagnoses apply to it), progress events with the step, the
elapsed time and an ETA from past builds of similar size.

Cancel (the start being stopped) kills the step's whole process group (ModelOpt and
trtllm-build start workers) and the caller removes the partial output.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engines.core.procs import group_alive, signal_group
from engines.errors import EngineError
from engines.events.trt import TRTBuildProgress
from engines.runtime.output import read_lines
from engines.trt.plan import BuildPlan, BuildStep

log = logging.getLogger(__name__)

PROGRESS_PERIOD_S = 1.0
KILL_GRACE_S = 3.0
SIMILAR_SIZE_RATIO = 2.0

LogSink = Callable[[str], None]
ProgressSink = Callable[[TRTBuildProgress], None]


@dataclass(frozen=True)
class BuildReport:
    step_s: Mapping[str, float]
    total_s: float


class ETAModel:
    """Seconds per weight byte of each step, from past builds; "similar size" first."""

    def __init__(self, history: Sequence[Mapping[str, Any]], weights_bytes: int) -> None:
        records = [r for r in history if float(r.get("weights_bytes", 0)) > 0]
        similar = [
            r
            for r in records
            if 1 / SIMILAR_SIZE_RATIO
            <= float(r["weights_bytes"]) / max(weights_bytes, 1)
            <= SIMILAR_SIZE_RATIO
        ]
        rates: dict[str, list[float]] = {}
        for record in similar or records:
            for step, seconds in dict(record.get("steps", {})).items():
                rates.setdefault(str(step), []).append(
                    float(seconds) / float(record["weights_bytes"])
                )
        self.rates = {step: statistics.median(values) for step, values in rates.items()}
        self.weights_bytes = weights_bytes

    def remaining_s(self, steps: Sequence[str], index: int, step_elapsed_s: float) -> float | None:
        """Time left from step ``index`` (0-based) on, or None if a step was never timed."""
        total = 0.0
        for i, name in enumerate(steps[index:], start=index):
            rate = self.rates.get(name)
            if rate is None:
                return None
            estimate = rate * self.weights_bytes
            total += max(estimate - step_elapsed_s, 0.0) if i == index else estimate
        return total


async def run_build(
    plan: BuildPlan,
    *,
    engine_id: str,
    cache_id: str,
    env: Mapping[str, str],
    cwd: Path,
    emit: LogSink,
    progress: ProgressSink,
    eta: ETAModel,
) -> BuildReport:
    """Run every step; raises EngineError when one fails (its output says why). Cancelling
    kills the running step's process group before the CancelledError propagates."""
    names = [s.name for s in plan.steps]
    started = time.monotonic()
    step_s: dict[str, float] = {}

    def report(state: str, index: int, step_started: float, detail: str = "") -> None:
        now = time.monotonic()
        remaining = eta.remaining_s(names, index, now - step_started) if state == "running" else 0.0
        progress(
            TRTBuildProgress(
                engine_id=engine_id,
                cache_id=cache_id,
                state=state,
                step=names[index] if index < len(names) else "",
                step_index=min(index + 1, len(names)),
                steps_total=len(names),
                elapsed_s=round(now - started, 2),
                eta_s=None if remaining is None else round(remaining, 1),
                detail=detail,
            )
        )

    index = 0
    step_started = started
    try:
        for index, step in enumerate(plan.steps):
            step_started = time.monotonic()
            emit(
                f"traylm: build step {index + 1}/{len(names)} ({step.name}): {' '.join(step.argv)}"
            )
            report("running", index, step_started)
            tick = functools.partial(report, "running", index, step_started)
            code = await _run_step(step, env=env, cwd=cwd, emit=emit, tick=tick)
            step_s[step.name] = time.monotonic() - step_started
            if code != 0:
                raise EngineError(
                    f"the TensorRT engine build failed in step {step.name} (exit code {code})"
                )
    except asyncio.CancelledError:
        report("cancelled", index, step_started, "stopped while building")
        raise
    except EngineError as exc:
        report("failed", index, step_started, exc.message)
        raise
    total = time.monotonic() - started
    report("done", len(names) - 1, step_started, f"built in {total:.0f} s")
    return BuildReport(step_s, total)


async def _run_step(
    step: BuildStep, *, env: Mapping[str, str], cwd: Path, emit: LogSink, tick: Callable[[], None]
) -> int:
    full_env = {**os.environ, **env}
    full_env.pop("PYTHONPATH", None)  # the engine env must not see traylm's packages
    try:
        proc = await asyncio.create_subprocess_exec(
            *step.argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=full_env,
            cwd=cwd,
            start_new_session=True,
        )
    except OSError as exc:
        raise EngineError(
            f"cannot run {step.argv[0]} ({exc.strerror}); reinstall TensorRT-LLM with "
            "`traylm engines install trtllm`"
        ) from None
    ticker = asyncio.create_task(_tick(tick))
    try:
        assert proc.stdout is not None
        await read_lines(proc.stdout, emit)
        return await proc.wait()
    except BaseException:
        await kill_group(proc)
        raise
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker


async def _tick(tick: Callable[[], None]) -> None:
    while True:
        await asyncio.sleep(PROGRESS_PERIOD_S)
        tick()


async def kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM the step's process group, then SIGKILL; wait until none of it is left."""
    pgid = proc.pid
    signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + KILL_GRACE_S
    while time.monotonic() < deadline and await asyncio.to_thread(group_alive, pgid):  # noqa: ASYNC110 - other processes
        await asyncio.sleep(0.1)
    signal_group(pgid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.shield(proc.wait())
    log.info("build step (group %d) stopped", pgid)
