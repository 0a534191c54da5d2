"""What every engine environment step shares: the progress callback, the doctor's checks, the
metadata file's name, running a command (streamed to the progress callback, or captured), and the
engine-specific extras hook (engines/trt/env.py) the environment manager is given.

Both engines/envs/manager.py and the engine-specific steps import this module; it imports neither.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from engines.errors import EngineEnvError

log = logging.getLogger(__name__)

META_FILE = "traylm-env.json"
"""Written last, atomically, into an environment: its presence means "install finished"."""
INSTALLING_FILE = "traylm-installing.json"
"""{"pid": N} while an install runs in that folder (removed when it ends either way)."""

ProgressFn = Callable[[str, str], Awaitable[None] | None]
"""Called with (phase, line) while installing: phases are create, install, fix, probe, done."""


@dataclass(frozen=True)
class Check:
    """One line of ``traylm engines doctor``: what was checked, the answer, and the fix."""

    name: str
    ok: bool
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class EnvExtras:
    """Engine-specific steps (TensorRT-LLM, SGLang): run after pip installs the engine, and
    added to ``traylm engines doctor``. Given to EnvManager by whoever builds it."""

    doctor_checks: Callable[[Path, str], Awaitable[list[Check]]]
    """(environment folder, extras name) → checks."""
    after_install: Callable[[Path, str, ProgressFn | None], Awaitable[None]] | None = None
    """(environment folder, engine version, progress)."""


async def report(progress: ProgressFn | None, phase: str, line: str) -> None:
    log.info("%s: %s", phase, line)
    if progress is not None:
        result = progress(phase, line)
        if result is not None:
            await result


async def run_streamed(
    cmd: Sequence[str], progress: ProgressFn | None, phase: str, *, check: bool = True
) -> str:
    """Run a command, streaming its lines to ``progress``; kill it if we are cancelled."""
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONUNBUFFERED": "1"}
    proc = await asyncio.create_subprocess_exec(
        *cmd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    lines: list[str] = []
    assert proc.stdout is not None
    try:
        async for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            lines.append(line)
            if progress is not None and line and "is ignored: it is neither" not in line:
                await report(progress, phase, line)
        code = await proc.wait()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        await proc.wait()
        raise
    if check and code != 0:
        tail = "\n".join(lines[-15:])
        raise EngineEnvError(f"`{' '.join(cmd[:4])} ...` failed with exit code {code}:\n{tail}")
    return "\n".join(lines)


async def capture(cmd: Sequence[str]) -> str:
    """Run a command and return its stdout; stderr (engine import noise) only on failure."""
    proc = await asyncio.create_subprocess_exec(
        *cmd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = await proc.communicate()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        await proc.wait()
        raise
    if proc.returncode != 0:
        tail = "\n".join(err.decode(errors="replace").splitlines()[-15:])
        raise EngineEnvError(
            f"`{' '.join(cmd[:3])} ...` failed with exit code {proc.returncode}:\n{tail}"
        )
    return out.decode(errors="replace")
