"""The usage log: one row per forwarded request (model, engine or remote, status, tokens, time)
in the store's ``usage`` table.

Recording is a deque append on the event loop; a background task writes the rows in batches
from a thread, so SQLite never blocks a request. If the writer falls far behind, the oldest
unwritten rows are dropped (and counted) rather than growing memory.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from dataclasses import dataclass

from engines.store import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UsageRecord:
    model: str
    engine_id: str
    route: str
    remote: bool
    status: int
    prompt_tokens: int | None
    completion_tokens: int | None
    duration_s: float


class UsageRecorder:
    def __init__(self, store: Store, *, period_s: float = 1.0, max_pending: int = 50_000) -> None:
        self._store = store
        self._period_s = period_s
        self._pending: collections.deque[UsageRecord] = collections.deque(maxlen=max_pending)
        self._task: asyncio.Task[None] | None = None
        self.written = 0
        self.dropped = 0

    def record(self, record: UsageRecord) -> None:
        if len(self._pending) == self._pending.maxlen:
            self.dropped += 1
        self._pending.append(record)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="usage-log")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.flush()

    async def flush(self) -> None:
        rows = list(self._pending)
        self._pending.clear()
        if rows:
            await asyncio.to_thread(self._write, rows)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._period_s)
            try:
                await self.flush()
            except Exception:  # boundary: a failing write must not stop the usage log
                log.exception("writing the usage log failed")

    def _write(self, rows: list[UsageRecord]) -> None:
        for r in rows:
            self._store.log_usage(
                model=r.model,
                engine_id=r.engine_id,
                route=r.route,
                remote=r.remote,
                status=r.status,
                prompt_tokens=r.prompt_tokens,
                completion_tokens=r.completion_tokens,
                duration_s=r.duration_s,
            )
        self.written += len(rows)
