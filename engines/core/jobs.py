"""Jobs: the daemon's long pieces of work (a benchmark run, a tune, an upgrade, a download, an
engine install), each run the same way.

A ``JobKind`` holds the jobs of one kind: it starts one (``start``), refuses a second while one
runs or queues it (``queued``), knows the running one (``current``), cancels it (``cancel``),
publishes its progress as it comes (``Job.report``) and its end (the kind's ``finished``
event). A job is a coroutine over a ``Job`` handle that returns the job's final record; the
record is the feature's own frozen type (a BenchRun, a TuneJob...), so the events and the
control API keep the feature's wire shapes. ``status`` is a typed ``JobStatus`` of that record.

How a job ends decides its ``JobState``: the coroutine returns (done), is cancelled (cancelled)
or raises (failed, with the error's message); the kind's ``finished`` turns that into the
feature's event. A job that needs more than a task cancel to stop (a worker process to signal,
a restore that must not be cut) sets ``Job.on_cancel``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from engines.errors import TraylmError
from engines.events.codec import Event

log = logging.getLogger(__name__)
R = TypeVar("R")


class JobState(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


ENDED = (JobState.DONE, JobState.FAILED, JobState.CANCELLED)


@dataclasses.dataclass(frozen=True)
class JobStatus(Generic[R]):
    """One job as the outside sees it: its kind, id, state, the feature's record, and why it
    failed (``message``)."""

    kind: str
    id: int
    state: JobState
    record: R
    message: str = ""

    @property
    def ended(self) -> bool:
        return self.state in ENDED


Work = Callable[["Job[R]"], Awaitable[R]]


class Job(Generic[R]):
    """The handle a job's coroutine gets: its record (``record``, updated as it goes), its
    progress (``report``), and how a cancel reaches it (``on_cancel``)."""

    def __init__(self, kind: JobKind[R], job_id: int, record: R, work: Work[R]) -> None:
        self.kind = kind
        self.id = job_id
        self.record = record
        self.state = JobState.QUEUED
        self.message = ""
        self.progress: Event | None = None
        self.on_cancel: Callable[[], object] | None = None
        """Called instead of cancelling the task (it may return an awaitable)."""
        self._work = work
        self._task: asyncio.Task[None] | None = None
        self._ended = asyncio.Event()

    def report(self, event: Event) -> None:
        """Publish a progress event and keep it as the job's latest."""
        self.progress = event
        self.kind.publish(event)

    def interrupt(self) -> None:
        """Cancel the job's task (what a cancel does without ``on_cancel``)."""
        if self._task is not None:
            self._task.cancel()

    def status(self) -> JobStatus[R]:
        return JobStatus(self.kind.name, self.id, self.state, self.record, self.message)

    async def ended(self) -> JobStatus[R]:
        """Wait for the job's end (not cancelled by a cancel of the waiter's own)."""
        await self._ended.wait()
        return self.status()

    async def result(self) -> R:
        """The final record once the job ended; a cancel of the caller cancels the job first
        (and waits for it to end), then goes on as CancelledError."""
        try:
            await asyncio.shield(self._ended.wait())
        except asyncio.CancelledError:
            await self.kind.cancel(self.id)
            raise
        return self.record

    def _begin(self) -> None:
        self.state = JobState.RUNNING
        self._task = asyncio.create_task(self._run(), name=f"{self.kind.name} {self.id}")

    async def _run(self) -> None:
        try:
            self.record = await self._work(self)
            self.state = JobState.DONE
        except asyncio.CancelledError:
            self.state = JobState.CANCELLED
        except TraylmError as exc:
            self.state, self.message = JobState.FAILED, exc.message
        except Exception as exc:  # boundary: the job must end and say why
            log.exception("%s %d failed", self.kind.name, self.id)
            self.state, self.message = JobState.FAILED, f"{type(exc).__name__}: {exc}"
        finally:
            self.kind._ended(self)

    async def _cancel(self) -> None:
        if self._task is None:  # still queued
            self.state = JobState.CANCELLED
            self.kind._ended(self)
            return
        if self.on_cancel is not None:
            pending = self.on_cancel()
            if isinstance(pending, Awaitable):
                await pending
        else:
            self.interrupt()
        await self._ended.wait()


class JobKind(Generic[R]):
    """The jobs of one kind. ``finished``: the feature's event for a job's end (None: none);
    ``busy``: the refusal's words while one runs, for a kind that runs one at a time
    (``queued=False``); ``error``: the exception type of those refusals; ``parallel``: how many
    of a queued kind run at once."""

    def __init__(
        self,
        name: str,
        *,
        publish: Callable[[Event], None],
        finished: Callable[[JobStatus[R]], Event | None],
        busy: Callable[[JobStatus[R]], str] = lambda s: f"{s.kind} {s.id} is running",
        error: type[TraylmError] = TraylmError,
        queued: bool = False,
        parallel: Callable[[], int] = lambda: 1,
    ) -> None:
        """No I/O."""
        self.name = name
        self.publish = publish
        self._finished = finished
        self._busy = busy
        self._error = error
        self._queued = queued
        self._parallel = parallel
        self._running: list[Job[R]] = []
        self._waiting: deque[Job[R]] = deque()
        self.last: JobStatus[R] | None = None
        self.next_id = 1

    @property
    def current(self) -> Job[R] | None:
        """The running job (the first started, where several run)."""
        return self._running[0] if self._running else None

    @property
    def jobs(self) -> tuple[Job[R], ...]:
        """Running, then queued, in order."""
        return (*self._running, *self._waiting)

    def status(self) -> JobStatus[R] | None:
        job = self.current
        return job.status() if job is not None else None

    def refuse_if_running(self) -> None:
        """The kind's error, with its busy words, while a job runs (for checks made before
        ``start``, which refuses the same way)."""
        if not self._queued and self.jobs:
            raise self._error(self._busy(self.jobs[0].status()))

    def start(self, record: R, work: Work[R], *, job_id: int | None = None) -> Job[R]:
        """Run ``work`` (now, or in its turn for a queued kind); returns its handle at once.
        ``job_id``: the feature's own id (a stored run's), else the next of the kind's."""
        self.refuse_if_running()
        if job_id is None:
            job_id = self.next_id
        self.next_id = max(self.next_id, job_id + 1)
        job = Job(self, job_id, record, work)
        self._waiting.append(job)
        self._advance()
        return job

    def get(self, job_id: int | None = None) -> Job[R]:
        """A running or queued job (None: the running one), else the kind's error."""
        for job in self.jobs:
            if job_id is None or job.id == job_id:
                return job
        if job_id is None:
            raise self._error(f"no {self.name} is running")
        running = f"{self.name} {self.jobs[0].id} is" if self.jobs else "none is"
        raise self._error(f"{self.name} {job_id} is not running; {running}")

    async def cancel(self, job_id: int | None = None) -> JobStatus[R]:
        """Cancel a running or queued job (None: the running one) and wait for its end."""
        job = self.get(job_id)
        await job._cancel()
        return job.status()

    async def stop(self) -> None:
        """The daemon stops: every job of the kind is cancelled, the queued ones first."""
        for job in reversed(self.jobs):
            with contextlib.suppress(TraylmError):
                await self.cancel(job.id)

    def _advance(self) -> None:
        while self._waiting and len(self._running) < max(1, self._parallel()):
            job = self._waiting.popleft()
            self._running.append(job)
            job._begin()

    def _ended(self, job: Job[R]) -> None:
        if job in self._running:
            self._running.remove(job)
        if job in self._waiting:
            self._waiting.remove(job)
        status = job.status()
        self.last = status
        job._ended.set()
        event = self._finished(status)
        if event is not None:
            self.publish(event)
        self._advance()
