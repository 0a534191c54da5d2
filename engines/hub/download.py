"""Downloads: a queue of jobs, each run by a worker process (engines/hub/worker.py).

Cancel and pause kill the worker's process group at once (huggingface_hub has no cancel API).
Failed attempts are retried with exponential backoff when the cause is transient (network,
server errors, a stall, a truncated or corrupted file). A job becomes ``ready`` only after the
worker hashed every file against the Hub's sha256 (git sha1 for small files) and said ``done``;
a worker that dies for any reason (kill -9 included) leaves the job retrying, paused or failed,
never ready.

One attempt (the worker process, its stall watchdog, its messages) lives in attempt.py. The
downloads are queued jobs of the job runner (engines/core/jobs.py), ``hub.parallel_downloads``
at once, in the order they were queued or resumed.

What pause/resume keeps was measured with the installed huggingface_hub (tests/engines/hub/
test_download_faults.py::test_pause_resume_keeps_finished_files): finished files stay; the file
in progress restarts from zero, because each attempt writes its own ``<etag>.<id>.incomplete``
that a new process never reuses. ``RESUME_NOTE`` says so to the user.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from engines.config.sections import HubSettings
from engines.core.jobs import Job as RunnerJob
from engines.core.jobs import JobKind, JobStatus
from engines.errors import (
    DiskFull,
    DiskSpaceError,
    DownloadNotFound,
    HubAccessDenied,
    HubError,
    quoted,
)
from engines.events.codec import Event
from engines.events.hub import (
    DownloadProgress,
    DownloadState,
    DownloadStateChanged,
    DownloadStatus,
    LibraryChanged,
)
from engines.hub import cachefs
from engines.hub.access import HubAccess
from engines.hub.attempt import Attempt, Outcome
from engines.hub.jobs import Job
from engines.hub.names import validate_repo_id, validate_revision
from engines.hub.records import HubRecords
from engines.hub.search import fetch_listing
from engines.hub.selection import select_files
from engines.hub.verify import ExpectedFile

log = logging.getLogger(__name__)
GIB = 1 << 30
STALE_TEMP_S = 300.0


def resume_note() -> str:
    from huggingface_hub import __version__ as hf_version

    return (
        "Pause stops the download at once. Files already finished stay in the cache; the file "
        "in progress starts again from its beginning when you resume (huggingface_hub "
        f"{hf_version} writes each attempt to its own temporary file and never reuses one left "
        "by a stopped process). Short network drops during a run resume in place."
    )


class DownloadManager:
    def __init__(
        self,
        *,
        settings: Callable[[], HubSettings],
        access: Callable[[], HubAccess],
        records: HubRecords,
        publish: Callable[[Event], None],
        logs_dir: Path,
        python: str = sys.executable,
    ) -> None:
        self._settings = settings
        self._access = access
        self._records = records
        self._publish = publish
        self._logs_dir = logs_dir
        self._python = python
        self._jobs: dict[str, Job] = {}
        self.runs: JobKind[Job] = JobKind(
            "download",
            publish=publish,
            finished=self._turn_ended,  # its download.state events say how it ended
            queued=True,
            parallel=lambda: self._settings().parallel_downloads,
        )
        self._runs: dict[str, RunnerJob[Job]] = {}  # a download's turn in the runner
        self._attempts: dict[str, Attempt] = {}
        self._wakeups: dict[str, asyncio.Event] = {}
        self.resume_note = ""

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        self.resume_note = await asyncio.to_thread(resume_note)
        await asyncio.to_thread(
            self._records.interrupt_active,
            "traylm stopped during this download; resume it to continue",
        )
        rows = await asyncio.to_thread(self._records.load_downloads)
        for row in reversed(rows):
            job = Job.from_row(row)
            self._jobs[job.id] = job
        for job in self._jobs.values():
            if job.state == DownloadState.QUEUED:
                self._queue(job)

    async def stop(self) -> None:
        for job in list(self._jobs.values()):
            if job.id in self._runs:
                job.stop_reason = "shutdown"
        for run in reversed(self.runs.jobs):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.runs.cancel(run.id), 5)

    # ----------------------------------------------------------------- public operations

    def statuses(self) -> list[DownloadStatus]:
        return [j.status(self.resume_note) for j in self._jobs.values()]

    def get(self, download_id: str) -> DownloadStatus:
        return self._job(download_id).status(self.resume_note)

    async def add(
        self, repo_id: str, revision: str | None = None, *, include_code: bool = False
    ) -> DownloadStatus:
        """Plan (resolve the commit, pick the files, check the disk) and queue a download."""
        validate_repo_id(repo_id)
        revision = validate_revision(revision) or "main"
        access = self._access()
        listing = await asyncio.to_thread(fetch_listing, access, repo_id, revision)
        if listing.gated and not access.token:
            raise HubAccessDenied(access.gated_advice(repo_id))
        selection = select_files(repo_id, listing.entries, include_code=include_code)
        files = tuple(
            ExpectedFile(e.path, e.size_bytes, e.sha256, e.git_sha1) for e in selection.keep
        )
        for job in self._jobs.values():
            if job.active and job.repo_id == repo_id and job.commit_sha == listing.commit_sha:
                return job.status(self.resume_note)
        present = await asyncio.to_thread(cachefs.present_etags, access.cache_dir, repo_id, files)
        await asyncio.to_thread(self._check_disk, access, repo_id, files, present)
        job = Job(
            id=uuid.uuid4().hex[:12],
            repo_id=repo_id,
            revision=revision,
            commit_sha=listing.commit_sha,
            files=files,
            present_before=frozenset(present),
        )
        self._jobs[job.id] = job
        await self._set(job, DownloadState.QUEUED, message="waiting for its turn")
        self._queue(job)
        return job.status(self.resume_note)

    async def pause(self, download_id: str) -> DownloadStatus:
        job = self._job(download_id)
        if not job.active:
            raise HubError(f"download {download_id} is {job.state}, not running", code="conflict")
        await self._stop_job(job, "pause")
        await self._set(job, DownloadState.PAUSED, message=self.resume_note)
        return job.status(self.resume_note)

    async def resume(self, download_id: str) -> DownloadStatus:
        job = self._job(download_id)
        if job.active:
            return job.status(self.resume_note)
        if job.state == DownloadState.READY:
            raise HubError(f"{job.repo_id} is already downloaded and verified", code="conflict")
        job.attempts, job.error_code = 0, ""
        await self._set(job, DownloadState.QUEUED, message="waiting for its turn")
        self._queue(job)
        return job.status(self.resume_note)

    async def cancel(self, download_id: str) -> DownloadStatus:
        """Stop at once and remove what this download added to the cache."""
        job = self._job(download_id)
        if job.state == DownloadState.READY:
            raise HubError(
                f"{job.repo_id} is already downloaded; delete it from the library instead",
                code="conflict",
            )
        await self._stop_job(job, "cancel")
        cache = self._access().cache_dir
        await asyncio.to_thread(
            cachefs.remove_added_files,
            cache,
            job.repo_id,
            job.commit_sha,
            job.files,
            set(job.present_before),
        )
        job.done_bytes = job.files_done = 0
        await self._set(job, DownloadState.CANCELLED, message="cancelled; nothing was kept")
        return job.status(self.resume_note)

    # ----------------------------------------------------------------- scheduling

    def _job(self, download_id: str) -> Job:
        job = self._jobs.get(download_id)
        if job is None:
            raise DownloadNotFound(
                f"no download {quoted(download_id)}; `traylm models downloads` lists them"
            )
        return job

    def _queue(self, job: Job) -> None:
        """Give the download its turn in the runner (a stop kills its attempt)."""
        if job.id in self._runs:
            return

        async def run(_: RunnerJob[Job]) -> Job:
            await self._run(job)
            return job

        turn = self.runs.start(job, run)
        turn.on_cancel = lambda: self._interrupt(job.id)  # a queued one just leaves the queue
        self._runs[job.id] = turn

    def _interrupt(self, download_id: str) -> None:
        """Stop the download's worker now, and its wait before a retry; ``_run`` then ends as
        its ``stop_reason`` says."""
        self._kill(download_id)
        event = self._wakeups.get(download_id)
        if event is not None:
            event.set()

    def _turn_ended(self, status: JobStatus[Job]) -> None:
        job = status.record
        self._runs.pop(job.id, None)
        if job.state == DownloadState.QUEUED and not job.stop_reason and job.id in self._jobs:
            self._queue(job)  # resumed while its last turn was still ending

    async def _stop_job(self, job: Job, reason: str) -> None:
        job.stop_reason = reason
        turn = self._runs.get(job.id)
        if turn is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.runs.cancel(turn.id)), 10)
        job.stop_reason = ""

    def _kill(self, download_id: str) -> None:
        attempt = self._attempts.get(download_id)
        if attempt is not None:
            attempt.kill()

    async def _run(self, job: Job) -> None:
        s = self._settings()
        while True:
            job.attempts += 1
            job.rate.reset()
            await self._set(job, DownloadState.DOWNLOADING, message="")
            outcome = await self._attempt(job)
            if job.stop_reason == "cancel" or (job.stop_reason and not outcome.ok):
                return
            if outcome.ok:
                await self._finish(job)
                return
            if not outcome.retryable or job.attempts > s.retry_max:
                gave_up = f" (gave up after {job.attempts} attempts)" if outcome.retryable else ""
                await self._set(
                    job, DownloadState.FAILED, code=outcome.code, message=outcome.message + gave_up
                )
                return
            delay = min(s.retry_backoff_s * 2 ** (job.attempts - 1), s.retry_backoff_max_s)
            await self._set(
                job,
                DownloadState.RETRYING,
                code=outcome.code,
                message=f"{outcome.message}; retrying in {delay:.0f} s "
                f"(attempt {job.attempts + 1} of {s.retry_max + 1})",
            )
            wake = self._wakeups.setdefault(job.id, asyncio.Event())
            wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), delay)
            if job.stop_reason:
                return

    async def _finish(self, job: Job) -> None:
        with contextlib.suppress(DiskFull):  # the store says so once; it is verified again later
            await asyncio.to_thread(
                self._records.mark_checked, job.repo_id, job.commit_sha, job.files, ok=True
            )
        job.done_bytes, job.files_done, job.current_file = job.total_bytes, len(job.files), ""
        await self._set(
            job,
            DownloadState.READY,
            message=f"all {len(job.files)} files match the Hub's hashes "
            f"(commit {job.commit_sha[:12]})",
        )
        self._publish(
            LibraryChanged(repo_id=job.repo_id, commit_sha=job.commit_sha, reason="downloaded")
        )

    # ----------------------------------------------------------------- one attempt

    async def _attempt(self, job: Job) -> Outcome:
        access = self._access()
        try:
            await asyncio.to_thread(
                self._check_disk, access, job.repo_id, job.files, set(job.present_before)
            )
        except DiskSpaceError as exc:
            return Outcome(False, exc.code, False, exc.message)
        await asyncio.to_thread(
            cachefs.remove_stale_incomplete,
            access.cache_dir,
            job.repo_id,
            job.files,
            max(STALE_TEMP_S, self._settings().stall_timeout_s * 2),
        )
        before = await asyncio.to_thread(
            cachefs.incomplete_files, access.cache_dir, job.repo_id, job.files
        )
        attempt = Attempt(
            job,
            access,
            self._settings(),
            python=self._python,
            logs_dir=self._logs_dir,
            on_started=lambda: self._set(job, DownloadState.DOWNLOADING),
            on_progress=lambda: self._progress(job),
            on_verifying=lambda: self._publish_state(job, DownloadState.DOWNLOADING),
        )
        self._attempts[job.id] = attempt
        try:
            outcome = await attempt.run()
        finally:
            self._attempts.pop(job.id, None)
        if not outcome.ok:
            after = await asyncio.to_thread(
                cachefs.incomplete_files, access.cache_dir, job.repo_id, job.files
            )
            await asyncio.to_thread(cachefs.remove_paths, after - before)
        return outcome

    def _check_disk(
        self, access: HubAccess, repo_id: str, files: tuple[ExpectedFile, ...], present: set[str]
    ) -> None:
        needed = sum(f.size_bytes for f in files if f.etag not in present)
        if needed == 0:
            return
        keep = int(self._settings().min_free_gib * GIB)
        free = cachefs.free_bytes(access.cache_dir)
        if needed + keep > free:
            raise DiskSpaceError(
                f"{repo_id} needs {needed / GIB:.2f} GiB and {keep / GIB:.1f} GiB must stay free, "
                f"but only {free / GIB:.2f} GiB are free where the Hugging Face cache lives "
                f"({access.cache_dir}): free some space, move the cache (HF_HOME), or lower "
                "hub.min_free_gib"
            )

    # ----------------------------------------------------------------- state and events

    async def _set(
        self, job: Job, state: DownloadState, *, code: str | None = None, message: str | None = None
    ) -> None:
        previous = job.state
        job.state = state
        if code is not None or state in (DownloadState.QUEUED, DownloadState.READY):
            job.error_code = code or ""
        if message is not None:
            job.message = message
        job.updated_s = time.time()
        try:
            await asyncio.to_thread(
                self._records.save_download,
                id=job.id,
                repo_id=job.repo_id,
                revision=job.revision,
                state=state.value,
                data=job.to_row(),
            )
        except DiskFull:
            pass  # the store says so once; the job goes on in memory and in its events
        self._publish_state(job, previous)

    def _publish_state(self, job: Job, previous: DownloadState) -> None:
        self._publish(DownloadStateChanged(status=job.status(self.resume_note), previous=previous))

    def _progress(self, job: Job) -> None:
        self._publish(
            DownloadProgress(
                download_id=job.id,
                repo_id=job.repo_id,
                done_bytes=job.done_bytes,
                total_bytes=job.total_bytes,
                rate_bytes_per_s=round(job.rate.bytes_per_s, 1),
                eta_s=job.eta_s(),
                current_file=job.current_file,
                files_done=job.files_done,
                files_total=len(job.files),
            )
        )
