"""Following a daemon job from a CLI command, the same way for every kind (`traylm bench run`,
`traylm tune`, `traylm engines upgrade`): the job's events are subscribed before the job is
started, each progress event becomes a line on stderr, a status poll every ``poll_s`` catches
the end if the stream missed it (or never opened), and Ctrl-C cancels the job in the daemon,
says so, and goes on as the CancelledError that ends the command.

Waits go through ``core.waiting.within``: on Python 3.11 ``asyncio.wait_for`` can swallow a
cancel (the Ctrl-C) that lands with an event; ``within`` never does.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from engines.client.daemon_client import DaemonClient
from engines.core.waiting import within
from engines.errors import TraylmError
from engines.events.codec import Event

J = TypeVar("J")
K = TypeVar("K", int, str)  # a job's id: a run's number, a download's name
SUBSCRIBE_WAIT_S = 10.0
PLAIN_EVERY_S = 5.0  # off a terminal, a line that changes often at most this often


@dataclasses.dataclass(frozen=True)
class Followed(Generic[J, K]):
    """What following one kind of job takes. ``J``: the job's record as the client reads it;
    ``K``: its id.

    ``line``: an event's progress line for the job ("" for none; ``frequent`` lines are kept
    on one line of a terminal, and thinned out elsewhere); ``ends``: whether the event is the
    job's end; ``now``: the job as the daemon has it now (None: it is gone); ``running``:
    whether a record is still running; ``cancel``: what Ctrl-C does to the job in the daemon
    (a cancel; a download's pause); ``show``: draws an event itself instead of ``line`` (a
    download's bar)."""

    kinds: tuple[str, ...]
    job_id: Callable[[J], K]
    line: Callable[[Event, K], tuple[str, bool]]
    ends: Callable[[Event, K], bool]
    now: Callable[[K], Awaitable[J | None]]
    running: Callable[[J], bool]
    cancel: Callable[[K], Awaitable[object]] | None  # None: Ctrl-C only stops following
    stopping: str  # said on Ctrl-C, e.g. "stopping the benchmark..."; {id}: the job's id
    cancel_answer_s: float
    poll_s: float = 5.0
    disown: str = ""  # said when the cancel is not confirmed in time
    show: Callable[[Event, K], None] | None = None


class ProgressPrinter:
    """Lines on stderr: on a terminal a frequent line overwrites the last one; elsewhere a
    frequent line is printed when it changed and at most every PLAIN_EVERY_S."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self._open = False  # a frequent line waits for its newline on the terminal
        self._last = ""
        self._next_s = 0.0

    def __call__(self, line: str, *, frequent: bool = False) -> None:
        if frequent and self.tty:
            print(f"\r{line:<100}", end="", file=sys.stderr, flush=True)
            self._open = True
            return
        if frequent and (line == self._last or time.monotonic() < self._next_s):
            return
        self.close()
        print(line, file=sys.stderr, flush=True)
        self._last = line
        if frequent:
            self._next_s = time.monotonic() + PLAIN_EVERY_S

    def close(self) -> None:
        if self._open:
            print(file=sys.stderr)
            self._open = False


async def follow(
    c: DaemonClient,
    spec: Followed[J, K],
    start: Callable[[], Awaitable[J]],
    *,
    started: Callable[[J], None] = lambda _: None,
    timeout_s: float | None = None,
) -> J:
    """Start the job (``start``), follow it to its end and return it as it ended; ``started``
    says what was started. Ctrl-C cancels the job (within ``spec.cancel_answer_s``), also when
    it lands while the start request is still in flight.
    TimeoutError when it has not ended ``timeout_s`` after it started (None: no limit)."""
    queue: asyncio.Queue[Event] = asyncio.Queue()
    opened = asyncio.Event()

    async def pump() -> None:
        with contextlib.suppress(TraylmError):  # no stream: the poll still follows
            async for event in c.events(kinds=spec.kinds, opened=opened.set):
                queue.put_nowait(event)

    pump_task = asyncio.create_task(pump(), name="job events")
    printer = ProgressPrinter()
    try:
        with contextlib.suppress(TimeoutError):
            await within(SUBSCRIBE_WAIT_S, opened.wait())
        asked = asyncio.ensure_future(start())
        try:
            job = await asyncio.shield(asked)
        except asyncio.CancelledError:  # Ctrl-C before the daemon answered: what it starts
            await _cancel_once_started(spec, asked, printer)  # is cancelled once it has an id
            raise
        started(job)
        if not spec.running(job):
            return job
        job_id = spec.job_id(job)
        try:
            return await within(timeout_s, _until_ended(spec, job_id, queue, printer))
        except asyncio.CancelledError:  # Ctrl-C: the job is cancelled in the daemon
            await _cancel(spec, job_id, printer)
            raise
    finally:
        printer.close()
        pump_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pump_task


async def _cancel_once_started(
    spec: Followed[J, K], asked: asyncio.Future[J], printer: ProgressPrinter
) -> None:
    """A Ctrl-C landed while the start request was in flight: wait for its answer (at most
    ``spec.cancel_answer_s``) and cancel the job it started, so none is left running."""
    try:
        job = await within(spec.cancel_answer_s, asyncio.shield(asked))
    except TimeoutError:
        asked.cancel()
        if spec.disown:
            print(spec.disown, file=sys.stderr)
        return
    except TraylmError:
        return  # nothing was started
    if spec.running(job):
        await _cancel(spec, spec.job_id(job), printer)


async def _cancel(spec: Followed[J, K], job_id: K, printer: ProgressPrinter) -> None:
    """Ctrl-C: say so and cancel the job in the daemon (within ``spec.cancel_answer_s``)."""
    printer.close()
    if spec.stopping:
        print(f"\n{spec.stopping.format(id=job_id)}", file=sys.stderr, flush=True)
    if spec.cancel is None:
        return
    try:
        await within(spec.cancel_answer_s, spec.cancel(job_id))
    except (TraylmError, TimeoutError):
        if spec.disown:
            print(spec.disown, file=sys.stderr)


async def _until_ended(
    spec: Followed[J, K], job_id: K, queue: asyncio.Queue[Event], printer: ProgressPrinter
) -> J:
    while True:
        try:
            event: Event | None = await within(spec.poll_s, queue.get())
        except TimeoutError:
            event = None
        if event is not None and not spec.ends(event, job_id):
            if spec.show is not None:
                spec.show(event, job_id)
                continue
            line, frequent = spec.line(event, job_id)
            if line:
                printer(line, frequent=frequent)
            continue
        job = await spec.now(job_id)  # the end, or a poll
        if job is None:
            raise TraylmError(f"the daemon no longer knows job {job_id} (was it restarted?)")
        if not spec.running(job):
            return job
