"""Batches run as queued jobs of the job runner (engines/core/jobs.py): each open line is sent
to the gateway's own /v1 route on this computer (so its admission, on-demand loading and
recorder apply, as for any client), a few at a time so that interactive requests go first;
each finished line is kept at once (engines/batch/store.py). A batch left open by a stopped
daemon resumes at the next start with the lines still open; a cancel keeps what finished.
A batch still open at its ``expires_at`` (the end of its completion window) sends no more
lines and ends "expired", as OpenAI's do: what finished is kept, and each line never sent goes
to the error file as ``batch_expired`` (counted failed). At the end the answers become the
output and error files, in OpenAI's batch output format."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any, Protocol

import aiohttp

from engines.batch.files import FileStore
from engines.batch.store import BatchStore
from engines.batch.validate import BatchLine, parse_input
from engines.config.live import SettingsView
from engines.core.jobs import Job, JobKind, JobState, JobStatus
from engines.core.store import Store, dumps
from engines.errors import ConfigError, GPUUnavailable, TraylmError
from engines.events.batch import BatchFinished, BatchProgress
from engines.events.codec import Event
from engines.gateway.admission import LOW_PRIORITY_HEADER

log = logging.getLogger(__name__)
Record = dict[str, Any]
LINE_TIMEOUT_S = 600.0
PROGRESS_EVERY_S = 1.0
RETRY_S = (1.0, 2.0, 5.0, 10.0, 30.0)
"""Waits before sending a line again that the gateway turned away for now (AGAIN)."""
AGAIN = (429, 502, 503, 504)
"""Answers that say "not now": a full queue, an engine that crashed or is starting again (the
supervisor restarts it), a pause; past RETRY_S the line fails with the last one's message."""
EXPIRED = {
    "code": "batch_expired",
    "message": "This request could not be executed before the completion window expired.",
}
"""The error of a line a batch never sent before its window ended (OpenAI's words)."""


PROFILE_KEY = "traylm_efficiency_profile"
"""The batch's metadata key that asks for a GPU efficiency profile while it runs (quiet, eco,
max or the user's): put on every GPU when the batch starts sending, and the profile in force
before put back when it ends (``FALLBACK`` when none was)."""
FALLBACK = "max"
"""What a batch puts back when no profile was in force before it: the cards' defaults."""


class Efficiency(Protocol):
    """The GPUs' efficiency profiles, as a batch uses them (engines/gpu/service.py)."""

    async def efficiency_targets(self, name: object) -> object:
        """Check a profile fits these GPUs (ConfigError; GPUUnavailable: no GPUs)."""
        ...

    async def apply_efficiency(self, name: object) -> list[str]: ...

    def efficiency_in_force(self) -> str | None: ...


def new_record(
    batch_id: str, file_id: str, endpoint: str, lines: list[BatchLine], meta: object
) -> Record:
    """OpenAI's Batch object, as created."""
    now = int(time.time())
    models = {line.body["model"] for line in lines}
    total = len(lines)
    return {
        "id": batch_id,
        "object": "batch",
        "endpoint": endpoint,
        "errors": None,
        "input_file_id": file_id,
        "completion_window": "24h",
        "status": "validating",
        "output_file_id": None,
        "error_file_id": None,
        "created_at": now,
        "in_progress_at": None,
        "expires_at": now + 24 * 3600,
        "finalizing_at": None,
        "completed_at": None,
        "failed_at": None,
        "expired_at": None,
        "cancelling_at": None,
        "cancelled_at": None,
        "request_counts": {"total": total, "completed": 0, "failed": 0},
        "metadata": meta if isinstance(meta, dict) else None,
        "model": models.pop() if len(models) == 1 else None,
    }


class BatchFeature:
    name = "batch"

    def __init__(
        self,
        *,
        store: Store,
        files: FileStore,
        settings: SettingsView,
        internal_key: Callable[[], str],
        publish: Callable[[Event], None],
        efficiency: Efficiency | None = None,
    ) -> None:
        """No I/O. ``efficiency``: the GPUs' profiles, for a batch that asks for one."""
        self.batches = BatchStore(store)
        self._efficiency = efficiency
        self.files = files
        self._settings = settings
        self._internal_key = internal_key
        self._stopping = False
        self._job_of: dict[str, int] = {}
        self.jobs: JobKind[Record] = JobKind(
            "batch", publish=publish, finished=_finished, queued=True
        )

    async def start(self) -> None:
        for record in await asyncio.to_thread(self.batches.unfinished):
            if record["id"] in self._job_of:  # made since the gateway began serving
                continue
            log.info("batch %s resumes", record["id"])
            self._run(record)

    async def stop(self) -> None:
        self._stopping = True  # the open lines stay open, for the next start
        await self.jobs.stop()

    async def create(self, owner: str, file_id: str, endpoint: str, meta: object) -> Record:
        """Validate the input file and queue the batch (ConfigError: nothing created)."""
        found = await asyncio.to_thread(self.files.get, file_id, owner)
        if found is None:
            raise ConfigError(f"no file {file_id[:80]!r}; upload it with POST /v1/files")
        if found.purpose != "batch":
            raise ConfigError(
                f"file {file_id} is a {found.purpose} file, not batch input; upload the input "
                "with purpose=batch"
            )
        await self._check_profile(meta)
        lines = await asyncio.to_thread(self._lines, file_id, endpoint)
        record = new_record("batch_" + secrets.token_hex(12), file_id, endpoint, lines, meta)
        await asyncio.to_thread(self.batches.save, record, owner)
        self._run(record)
        return record

    async def _check_profile(self, meta: object) -> None:
        """A profile asked for in the metadata must exist and fit these GPUs (ConfigError)."""
        name = meta.get(PROFILE_KEY) if isinstance(meta, dict) else None
        if name is None:
            return
        if self._efficiency is None:
            raise ConfigError(f"metadata {PROFILE_KEY}: this daemon has no GPU controls")
        try:
            await self._efficiency.efficiency_targets(name)
        except GPUUnavailable as exc:
            raise ConfigError(
                f"metadata {PROFILE_KEY}: efficiency profiles need NVIDIA GPUs, and there are "
                f"none here ({exc.message}); leave {PROFILE_KEY} out"
            ) from None
        except ConfigError as exc:
            raise ConfigError(f"metadata {PROFILE_KEY}: {exc.message}") from None

    async def _profile_on(self, record: Record) -> str | None:
        """Put the batch's profile on (if it asks for one); the one to put back after it."""
        meta = record.get("metadata") or {}
        name = meta.get(PROFILE_KEY) if isinstance(meta, dict) else None
        if not isinstance(name, str) or self._efficiency is None:
            return None
        try:
            before = self._efficiency.efficiency_in_force()
            await self._efficiency.apply_efficiency(name)
        except TraylmError as exc:  # the batch runs on as the GPUs are; said in the log
            log.warning(
                "batch %s: efficiency profile %s not applied: %s", record["id"], name, exc.message
            )
            return None
        log.info("batch %s: efficiency profile %s in force while it runs", record["id"], name)
        return before or FALLBACK

    async def _profile_off(self, record: Record, before: str | None) -> None:
        if before is None or self._efficiency is None:
            return
        try:
            await self._efficiency.apply_efficiency(before)
        except TraylmError as exc:
            log.warning(
                "batch %s: efficiency profile %s not put back: %s",
                record["id"],
                before,
                exc.message,
            )

    def _live(self, batch_id: str) -> Job[Record] | None:
        job_id = self._job_of.get(batch_id)
        return next((job for job in self.jobs.jobs if job.id == job_id), None)

    def get(self, batch_id: str, owner: str | None) -> Record | None:
        """The live record of a running batch, else the stored one (``owner`` None: whoever's
        it is; blocks)."""
        stored = self.batches.get(batch_id, owner)
        job = self._live(batch_id)
        return job.record if stored is not None and job is not None else stored

    def page(self, owner: str, after: str | None, limit: int) -> list[Record]:
        """The owner's batches, newest first, after the one ``after`` (blocks)."""
        rows = self.batches.page(owner, after, limit)
        return [job.record if (job := self._live(r["id"])) else r for r in rows]

    def every(self, limit: int) -> list[Record]:
        """Every owner's batches, newest first (the control API's; blocks)."""
        rows = self.batches.listed(None, limit)
        return [job.record if (job := self._live(r["id"])) else r for r in rows]

    def running(self) -> list[Record]:
        """The batches running or queued, for /api/status."""
        return [job.record for job in self.jobs.jobs]

    async def cancel(self, batch_id: str, owner: str | None) -> Record | None:
        """Stop a batch: what finished is kept in its files (None: no such batch; ``owner``
        None: whoever's it is, for the control API)."""
        if owner is None:
            owner = await asyncio.to_thread(self.batches.owner, batch_id)
        record = await asyncio.to_thread(self.get, batch_id, owner)
        if record is None or record["status"] not in ("validating", "in_progress"):
            return record
        record["status"], record["cancelling_at"] = "cancelling", int(time.time())
        await asyncio.to_thread(self.batches.save, record, owner)
        job = self._live(batch_id)
        running = job is not None and job.state is JobState.RUNNING
        if job is not None:
            await self.jobs.cancel(job.id)
        if not running:  # queued, or left by a stopped daemon: its work never ran
            await self._finalize(record, owner, "cancelled")
        return await asyncio.to_thread(self.get, batch_id, owner)

    def _lines(self, file_id: str, endpoint: str) -> list[BatchLine]:
        with self.files.path(file_id).open("rb") as raw:
            return parse_input(raw, endpoint)

    def _run(self, record: Record) -> None:
        job = self.jobs.start(record, self._work)
        self._job_of[record["id"]] = job.id

    async def _work(self, job: Job[Record]) -> Record:
        record = job.record
        owner = await asyncio.to_thread(self.batches.owner, record["id"])
        if record["status"] == "cancelling":
            return await self._finalize(record, owner, "cancelled")
        try:
            lines = await asyncio.to_thread(
                self._lines, record["input_file_id"], record["endpoint"]
            )
        except (OSError, ConfigError) as exc:  # its input file went (deleted, unreadable)
            return await self._fail(record, owner, str(exc))
        done = await asyncio.to_thread(self.batches.finished_lines, record["id"])
        counts = record["request_counts"]
        counts["completed"] = sum(1 for ok, _ in done.values() if ok)
        counts["failed"] = len(done) - counts["completed"]
        record["status"] = "in_progress"
        record["in_progress_at"] = record["in_progress_at"] or int(time.time())
        await asyncio.to_thread(self.batches.save, record, owner)
        todo = [line for line in lines if line.number not in done]
        job.report(_progress(record))
        before = await self._profile_on(record)
        try:
            await self._send_all(job, owner, todo)
        except asyncio.CancelledError:
            await self._profile_off(record, before)
            if not self._stopping:
                await self._finalize(record, owner, "cancelled")
            raise
        await self._profile_off(record, before)
        if _expired(record):
            return await self._expire(record, owner, todo)
        return await self._finalize(record, owner, "completed")

    async def _expire(self, record: Record, owner: str, todo: list[BatchLine]) -> Record:
        """End a batch past its window: each line it never answered is kept as expired."""
        expired = [
            (
                line.number,
                False,
                {
                    "id": "batch_req_" + secrets.token_hex(12),
                    "custom_id": line.custom_id,
                    "response": None,
                    "error": EXPIRED,
                },
            )
            for line in todo
        ]
        added = await asyncio.to_thread(self.batches.finish_lines, record["id"], expired)
        record["request_counts"]["failed"] += added
        log.info("batch %s expired with %s", record["id"], record["request_counts"])
        return await self._finalize(record, owner, "expired")

    async def _send_all(self, job: Job[Record], owner: str, todo: list[BatchLine]) -> None:
        """Send the open lines, gateway.batch_lines_at_once at a time (the gateway's admission
        puts interactive requests first), each kept as it finishes."""
        record = job.record
        port = self._settings.current.gateway.port
        url = f"http://127.0.0.1:{port}{record['endpoint']}"
        headers = {"Authorization": "Bearer " + self._internal_key(), LOW_PRIORITY_HEADER: "1"}
        timeout = aiohttp.ClientTimeout(total=LINE_TIMEOUT_S)
        queue = iter(todo)
        reported_s = time.monotonic()

        async def worker(http: aiohttp.ClientSession) -> None:
            nonlocal reported_s
            for line in queue:
                if _expired(record):
                    return  # the lines left are kept as expired
                ok, result = await _answer(http, url, line)
                if self._stopping:
                    return  # the gateway may be closing: the line stays open
                if await asyncio.to_thread(
                    self.batches.finish_line, record["id"], line.number, ok, result
                ):
                    record["request_counts"]["completed" if ok else "failed"] += 1
                    await asyncio.to_thread(self.batches.save, record, owner)
                if time.monotonic() - reported_s >= PROGRESS_EVERY_S:
                    reported_s = time.monotonic()
                    job.report(_progress(record))

        workers = self._settings.current.gateway.batch_lines_at_once
        connector = aiohttp.TCPConnector(limit=workers)
        async with aiohttp.ClientSession(
            timeout=timeout, headers=headers, connector=connector
        ) as http:
            await asyncio.gather(*(worker(http) for _ in range(workers)))

    async def _finalize(self, record: Record, owner: str, end: str) -> Record:
        record["status"], record["finalizing_at"] = "finalizing", int(time.time())
        done = await asyncio.to_thread(self.batches.finished_lines, record["id"])
        for ok, key in ((True, "output_file_id"), (False, "error_file_id")):
            results = [r for good, r in done.values() if good is ok]
            if results:
                record[key] = await asyncio.to_thread(
                    self._keep_file, owner, f"{record['id']}_{key[:-8]}.jsonl", results
                )
        record["status"], record[f"{end}_at"] = end, int(time.time())
        await asyncio.to_thread(self.batches.save, record, owner)
        return record

    async def _fail(self, record: Record, owner: str, why: str) -> Record:
        error = {"code": "input_unreadable", "message": why, "param": None, "line": None}
        record["errors"] = {"object": "list", "data": [error]}
        record["status"], record["failed_at"] = "failed", int(time.time())
        await asyncio.to_thread(self.batches.save, record, owner)
        return record

    def _keep_file(self, owner: str, filename: str, results: list[Record]) -> str:
        file_id, part = self.files.new_upload()
        with part.open("w", encoding="utf-8") as out:
            out.writelines(dumps(r) + "\n" for r in results)
        self.files.keep(file_id, part, owner=owner, filename=filename, purpose="batch_output")
        return file_id


async def _answer(http: aiohttp.ClientSession, url: str, line: BatchLine) -> tuple[bool, Record]:
    """One line's answer in OpenAI's batch output shape; ok when the engine answered 200. A
    line turned away for now (AGAIN) goes again."""
    result: Record = {"id": "batch_req_" + secrets.token_hex(12), "custom_id": line.custom_id}
    try:
        for wait_s in (*RETRY_S, 0.0):
            async with http.post(url, json=line.body) as resp:
                body: object = await resp.json(content_type=None)
                rid = resp.headers.get("x-request-id", "")
                status = resp.status
            if status not in AGAIN or not wait_s:
                break
            await asyncio.sleep(wait_s)
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        result["response"] = None
        result["error"] = {"code": "request_failed", "message": f"{type(exc).__name__}: {exc}"}
        return False, result
    result["response"] = {"status_code": status, "request_id": rid, "body": body}
    result["error"] = None
    if status != 200:
        message = body.get("error", {}).get("message", "") if isinstance(body, dict) else ""
        result["error"] = {"code": str(status), "message": str(message)}
    return status == 200, result


def _expired(record: Record) -> bool:
    return time.time() >= float(record["expires_at"])


def _progress(record: Record) -> BatchProgress:
    counts = record["request_counts"]
    return BatchProgress(
        batch_id=record["id"],
        status=record["status"],
        total=counts["total"],
        completed=counts["completed"],
        failed=counts["failed"],
        model=record.get("model") or "",
    )


def _finished(status: JobStatus[Record]) -> Event | None:
    """The batch's end; none when the daemon stops (it resumes at the next start)."""
    record = status.record
    if record["status"] not in ("completed", "cancelled", "failed", "expired"):
        return None
    counts = record["request_counts"]
    return BatchFinished(
        batch_id=record["id"],
        status=record["status"],
        total=counts["total"],
        completed=counts["completed"],
        failed=counts["failed"],
        detail=status.message,
    )
