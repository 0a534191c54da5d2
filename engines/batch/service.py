"""Batches run as queued jobs of the job runner (engines/core/jobs.py): each open line is sent
to the gateway's own /v1 route on this computer (so its admission, on-demand loading and
recorder apply, as for any client), a few at a time so that interactive requests go first;
each finished line is kept at once (engines/batch/store.py). A batch left open by a stopped
daemon resumes at the next start with the lines still open; a cancel keeps what finished.
At the end the answers become the output and error files, in OpenAI's batch output format."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from engines.batch.files import FileStore
from engines.batch.store import BatchStore
from engines.batch.validate import BatchLine, parse_input
from engines.config.live import SettingsView
from engines.core.jobs import Job, JobKind, JobStatus
from engines.core.store import Store, dumps
from engines.errors import ConfigError
from engines.events.codec import Event

log = logging.getLogger(__name__)
Record = dict[str, Any]
LINES_AT_ONCE = 4
"""Lines of a batch in flight at once: a small share of an engine, so interactive requests
keep most of it (the gateway's admission queues the rest)."""
LINE_TIMEOUT_S = 600.0


def new_record(batch_id: str, file_id: str, endpoint: str, total: int, meta: object) -> Record:
    """OpenAI's Batch object, as created."""
    now = int(time.time())
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
    ) -> None:
        """No I/O."""
        self.batches = BatchStore(store)
        self.files = files
        self._settings = settings
        self._internal_key = internal_key
        self._stopping = False
        self._job_of: dict[str, int] = {}
        self.jobs: JobKind[Record] = JobKind(
            "batch", publish=publish, finished=_no_event, queued=True
        )

    async def start(self) -> None:
        for record in await asyncio.to_thread(self.batches.unfinished):
            log.info("batch %s resumes", record["id"])
            self._run(record)

    async def stop(self) -> None:
        self._stopping = True  # the open lines stay open, for the next start
        await self.jobs.stop()

    async def create(self, owner: str, file_id: str, endpoint: str, meta: object) -> Record:
        """Validate the input file and queue the batch (ConfigError: nothing created)."""
        if await asyncio.to_thread(self.files.get, file_id, owner) is None:
            raise ConfigError(f"no file {file_id[:80]!r}; upload it with POST /v1/files")
        lines = await asyncio.to_thread(self._lines, file_id, endpoint)
        record = new_record("batch_" + secrets.token_hex(12), file_id, endpoint, len(lines), meta)
        await asyncio.to_thread(self.batches.save, record, owner)
        self._run(record)
        return record

    def get(self, batch_id: str, owner: str) -> Record | None:
        """The live record of a running batch, else the stored one (blocks)."""
        stored = self.batches.get(batch_id, owner)
        job_id = self._job_of.get(batch_id)
        for job in self.jobs.jobs:
            if stored is not None and job.id == job_id:
                return job.record
        return stored

    async def cancel(self, batch_id: str, owner: str) -> Record | None:
        record = await asyncio.to_thread(self.get, batch_id, owner)
        if record is None or record["status"] not in ("validating", "in_progress"):
            return record
        record["status"], record["cancelling_at"] = "cancelling", int(time.time())
        await asyncio.to_thread(self.batches.save, record, owner)
        job_id = self._job_of.get(batch_id)
        if job_id is not None and any(j.id == job_id for j in self.jobs.jobs):
            await self.jobs.cancel(job_id)
        else:
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
        lines = await asyncio.to_thread(self._lines, record["input_file_id"], record["endpoint"])
        done = await asyncio.to_thread(self.batches.finished_lines, record["id"])
        counts = record["request_counts"]
        counts["completed"] = sum(1 for ok, _ in done.values() if ok)
        counts["failed"] = len(done) - counts["completed"]
        record["status"] = "in_progress"
        record["in_progress_at"] = record["in_progress_at"] or int(time.time())
        await asyncio.to_thread(self.batches.save, record, owner)
        todo = [line for line in lines if line.number not in done]
        try:
            await self._send_all(record, owner, todo)
        except asyncio.CancelledError:
            if not self._stopping:
                await self._finalize(record, owner, "cancelled")
            raise
        return await self._finalize(record, owner, "completed")

    async def _send_all(self, record: Record, owner: str, todo: list[BatchLine]) -> None:
        gate = asyncio.Semaphore(LINES_AT_ONCE)
        port = self._settings.current.gateway.port
        url = f"http://127.0.0.1:{port}{record['endpoint']}"
        headers = {"Authorization": "Bearer " + self._internal_key()}
        timeout = aiohttp.ClientTimeout(total=LINE_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout, headers=headers) as http:

            async def one(line: BatchLine) -> None:
                async with gate:
                    ok, result = await _answer(http, url, line)
                if self._stopping:
                    return  # the gateway may be closing: the line stays open
                if await asyncio.to_thread(
                    self.batches.finish_line, record["id"], line.number, ok, result
                ):
                    record["request_counts"]["completed" if ok else "failed"] += 1
                    await asyncio.to_thread(self.batches.save, record, owner)

            await asyncio.gather(*(one(line) for line in todo))

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

    def _keep_file(self, owner: str, filename: str, results: list[Record]) -> str:
        file_id, part = self.files.new_upload()
        with part.open("w", encoding="utf-8") as out:
            out.writelines(dumps(r) + "\n" for r in results)
        self.files.keep(file_id, part, owner=owner, filename=filename, purpose="batch_output")
        return file_id


async def _answer(http: aiohttp.ClientSession, url: str, line: BatchLine) -> tuple[bool, Record]:
    """One line's answer in OpenAI's batch output shape; ok when the engine answered 200."""
    result: Record = {"id": "batch_req_" + secrets.token_hex(12), "custom_id": line.custom_id}
    try:
        async with http.post(url, json=line.body) as resp:
            body: object = await resp.json(content_type=None)
            rid = resp.headers.get("x-request-id", "")
            status = resp.status
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


def _no_event(_: JobStatus[Record]) -> Event | None:
    return None
