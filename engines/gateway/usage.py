"""The usage log: one row per forwarded request (model, engine or remote, status, tokens, time)
in the store's ``usage`` table.

Recording is a deque append on the event loop; a background task writes the rows in batches
from a thread, so SQLite never blocks a request. If the writer falls far behind, the oldest
unwritten rows are dropped (and counted) rather than growing memory. While the disk is full
(``DiskFull``) the rows stay in memory, as many as ``max_pending``, and are written once there
is room; the writer then also checks every period whether space came back.

The table stays bounded: each row is small (the gateway records only names it serves, never a
client's ``model`` string as sent), and at start and once an hour rows older than
``gateway.usage_days`` and the oldest past ``gateway.usage_max_rows`` are deleted.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from dataclasses import dataclass, field

from engines.config.live import SettingsView
from engines.core.doorbell import Doorbell
from engines.core.store import Store
from engines.errors import DiskFull

log = logging.getLogger(__name__)

PRUNE_EVERY_S = 3600.0
UNKNOWN_MODEL = "(unknown)"
"""Recorded instead of a model name traylm does not serve."""
MODEL_NAME_MAX_CHARS = 256


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
    ts_s: float = field(default_factory=time.time)


class UsageRecorder:
    """The usage log: the gateway records each request (``record``, no I/O); a background task
    writes them to SQLite in batches and prunes old rows. A part of the daemon (started and
    stopped with it)."""

    name = "usage"

    def __init__(
        self,
        store: Store,
        settings: SettingsView,
        *,
        period_s: float = 1.0,
        max_pending: int = 50_000,
    ) -> None:
        self._store = store
        self._settings = settings
        self._period_s = period_s
        self._pending: collections.deque[UsageRecord] = collections.deque(maxlen=max_pending)
        self._task: asyncio.Task[None] | None = None
        self._bell = Doorbell()  # rung by record: the writer sleeps while nothing comes
        self.written = 0
        self.dropped = 0

    def record(self, record: UsageRecord) -> None:
        if len(self._pending) == self._pending.maxlen:
            self.dropped += 1
        self._pending.append(record)
        self._bell.ring()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="usage-log")

    @property
    def waiting(self) -> int:
        """Rows recorded and not written yet (many while the disk is full)."""
        return len(self._pending)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        try:
            await self.flush()
        except DiskFull:
            log.warning("%d usage rows were not written: the disk is full", len(self._pending))

    async def flush(self) -> None:
        """Write the rows recorded so far. Raises DiskFull (the rows stay, to be written)."""
        rows = list(self._pending)
        self._pending.clear()
        if not rows:
            return
        try:
            await asyncio.to_thread(self._write, rows)
        except DiskFull:
            self._keep(rows)
            raise

    def _keep(self, rows: list[UsageRecord]) -> None:
        """Put back rows a full disk refused, before those recorded meanwhile; the oldest go
        (counted) past ``max_pending``."""
        kept = [*rows, *self._pending]
        limit = self._pending.maxlen or len(kept)
        self.dropped += max(0, len(kept) - limit)
        self._pending.clear()
        self._pending.extend(kept[-limit:])

    async def _run(self) -> None:
        pruned_at = 0.0
        while True:
            if pruned_at and not self._pending and self._store.full is None:
                await self._bell.wait(PRUNE_EVERY_S)  # asleep until a request is recorded
            await asyncio.sleep(self._period_s)  # what comes meanwhile goes in this batch
            try:
                if self._store.full is not None and not self._pending:
                    await asyncio.to_thread(self._store.check_space)
                elif time.monotonic() - pruned_at >= PRUNE_EVERY_S or not pruned_at:
                    pruned_at = time.monotonic()
                    await asyncio.to_thread(self.prune, time.time())
                await self.flush()
            except DiskFull:
                pass  # the store logged it once; the rows wait for room
            except Exception:  # boundary: a failing write must not stop the usage log
                log.exception("writing the usage log failed")

    def prune(self, now_s: float) -> int:
        """Delete rows older than ``gateway.usage_days``, then the oldest past
        ``gateway.usage_max_rows``. Returns the rows deleted."""
        g = self._settings.current.gateway
        with self._store.transaction() as db:
            old = db.execute("DELETE FROM usage WHERE ts_s < ?", (now_s - g.usage_days * 86400,))
            extra = db.execute(
                "DELETE FROM usage WHERE id <= (SELECT id FROM usage ORDER BY id DESC "
                "LIMIT 1 OFFSET ?)",
                (g.usage_max_rows,),
            )
            return int(old.rowcount) + int(extra.rowcount)

    def _write(self, rows: list[UsageRecord]) -> None:
        """One transaction (one commit) per batch of requests."""
        with self._store.transaction() as db:
            db.executemany(
                "INSERT INTO usage (ts_s, model, engine_id, route, remote, status, prompt_tokens,"
                " completion_tokens, duration_s) VALUES (?,?,?,?,?,?,?,?,?)",
                [
                    (
                        r.ts_s,
                        r.model,
                        r.engine_id,
                        r.route,
                        int(r.remote),
                        r.status,
                        r.prompt_tokens,
                        r.completion_tokens,
                        r.duration_s,
                    )
                    for r in rows
                ],
            )
        self.written += len(rows)
