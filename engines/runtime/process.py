"""The process group of one life of an engine: its leader, the descendants recorded for the
reaper (they outlive a daemon crash: engines/core/procs.py), their vitals, and its end."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import psutil

from engines.core.procs import (
    EngineRecord,
    PidRegistry,
    TrackedProcess,
    descendants,
    end_group,
    settled,
    vitals,
)
from engines.runtime.supervision import Supervision


class EngineProcess:
    """One spawned engine process and the processes it started."""

    def __init__(
        self,
        engine_id: str,
        proc: asyncio.subprocess.Process,
        *,
        pids: PidRegistry,
        supervision: Supervision,
    ) -> None:
        self.engine_id = engine_id
        self.proc = proc
        self.tracked: list[TrackedProcess] = []
        self._pids = pids
        self._supervision = supervision

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def record(self) -> None:
        """Write the leader to the pid registry (the reaper's list after a daemon crash)."""
        leader = TrackedProcess.of(self.proc.pid)
        self.tracked = []
        if leader is not None:
            self._pids.put(EngineRecord(self.engine_id, self.proc.pid, leader))

    async def track_descendants(self) -> bool:
        """Record the engine's child processes (the reaper needs them after a daemon crash).
        False when the scan failed (it is retried on the next tick)."""
        proc = self.proc
        try:
            # a scan of every process on the machine: off the loop that relays the tokens
            found = await asyncio.to_thread(descendants, proc.pid)
            known = {(p.pid, p.create_time) for p in self.tracked}
            new = [p for p in found if (p.pid, p.create_time) not in known]
            if new:
                self.tracked.extend(new)
                leader = TrackedProcess.of(proc.pid)
                if leader is not None:
                    record = EngineRecord(self.engine_id, proc.pid, leader, tuple(self.tracked))
                    await asyncio.to_thread(self._pids.put, record)
        except (OSError, psutil.Error) as exc:
            self._supervision.trouble("cannot scan the engine's processes", exc)
            return False
        return True

    async def vitals(self) -> tuple[float | None, list[int]]:
        """The leader's CPU seconds and the pids of the group stopped by a signal."""
        try:
            return await asyncio.to_thread(vitals, self.proc.pid, self.tracked)
        except (OSError, psutil.Error) as exc:
            self._supervision.trouble("cannot read the state of the engine's processes", exc)
            return None, []

    async def end(
        self, grace_s: float, alongside: Callable[[], Awaitable[None]] | None = None
    ) -> list[int]:
        """End the group (engines.core.procs.end_group), ``alongside`` awaited at the same time
        (the other ranks: one left waiting would hang); returns the pids that survived
        SIGKILL."""
        await self.track_descendants()
        ending = end_group(
            self.proc, self.tracked, grace_s=grace_s, trouble=self._supervision.trouble
        )
        if alongside is not None:
            left, _ = await asyncio.gather(ending, alongside())
        else:
            left = await ending
        if not left:
            await settled(self.proc)
        return left

    def forget(self) -> None:
        """Kill the leader if it still runs and drop it from the pid registry."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        self._pids.drop(self.engine_id)
