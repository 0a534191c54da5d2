"""The job runner (engines/core/jobs.py) on a real event loop and the daemon's real bus: one at
a time, queued in order, cancel mid-progress, the finished events, a job that raises."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable

import pytest

from engines.core.bus import EventBus
from engines.core.jobs import Job, JobKind, JobState, JobStatus
from engines.errors import BenchError, TraylmError
from engines.events.codec import Event


@dataclasses.dataclass(frozen=True, kw_only=True)
class Step(Event):
    """A progress event of the test kind."""

    kind = "test.step"
    job_id: int
    step: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class Ended(Event):
    """The finished event of the test kind."""

    kind = "test.ended"
    job_id: int
    state: str
    detail: str


@dataclasses.dataclass(frozen=True)
class Record:
    name: str
    steps: int = 0


def _kind(bus: EventBus, *, queued: bool = False) -> JobKind[Record]:
    return JobKind(
        "test",
        publish=bus.publish,
        finished=lambda s: Ended(job_id=s.id, state=s.state.value, detail=s.message),
        busy=lambda s: f"test {s.id} ({s.record.name}) is running; `cancel` it",
        error=BenchError,
        queued=queued,
    )


def _gated(gate: asyncio.Event, order: list[str]) -> Callable[[Job[Record]], Awaitable[Record]]:
    async def work(job: Job[Record]) -> Record:
        order.append(job.record.name)
        job.report(Step(job_id=job.id, step=1))
        job.record = dataclasses.replace(job.record, steps=1)
        await gate.wait()
        return dataclasses.replace(job.record, steps=2)

    return work


async def _next(sub_queue: asyncio.Queue[Event], kind: type[Event]) -> Event:
    while True:
        event = await sub_queue.get()
        if isinstance(event, kind):
            return event


async def test_one_at_a_time_refuses_a_second_with_the_kinds_words() -> None:
    bus, gate, order = EventBus(), asyncio.Event(), []
    kind = _kind(bus)
    first = kind.start(Record("a"), _gated(gate, order))
    with pytest.raises(BenchError, match=r"test 1 \(a\) is running; `cancel` it"):
        kind.start(Record("b"), _gated(gate, order))
    gate.set()
    status = await first.ended()
    assert status == JobStatus("test", 1, JobState.DONE, Record("a", steps=2))
    second = kind.start(Record("b"), _gated(gate, order))  # free again once it ended
    assert (await second.ended()).id == 2 and order == ["a", "b"]


async def test_a_queued_kind_runs_its_jobs_in_order_one_by_one() -> None:
    bus, gates, order = EventBus(), [asyncio.Event() for _ in range(3)], []
    kind = _kind(bus, queued=True)
    jobs = [kind.start(Record(n), _gated(g, order)) for n, g in zip("xyz", gates, strict=True)]
    await asyncio.sleep(0)
    assert [j.state for j in jobs] == [JobState.RUNNING, JobState.QUEUED, JobState.QUEUED]
    assert kind.current is jobs[0]
    for gate in reversed(gates):  # the last released first: still run in their order
        gate.set()
    ended = [await j.ended() for j in jobs]
    assert order == ["x", "y", "z"] and [s.state for s in ended] == [JobState.DONE] * 3


async def test_cancel_mid_progress_ends_it_cancelled_with_its_finished_event() -> None:
    bus, gate, order = EventBus(), asyncio.Event(), []
    kind = _kind(bus)
    with bus.subscribe(frozenset({"test"})) as sub:
        job = kind.start(Record("a"), _gated(gate, order))
        step = await _next(sub.queue, Step)
        assert step == job.progress and isinstance(step, Step) and step.job_id == job.id
        assert kind.status() == JobStatus("test", 1, JobState.RUNNING, Record("a", steps=1))
        status = await kind.cancel()
        ended = await _next(sub.queue, Ended)
    assert status.state == JobState.CANCELLED and status.record == Record("a", steps=1)
    assert isinstance(ended, Ended) and (ended.job_id, ended.state) == (1, "cancelled")
    assert kind.current is None and kind.last == status


async def test_a_queued_job_cancelled_never_runs_and_the_next_goes_on() -> None:
    bus, gate, order = EventBus(), asyncio.Event(), []
    kind = _kind(bus, queued=True)
    first = kind.start(Record("a"), _gated(gate, order))
    second = kind.start(Record("b"), _gated(gate, order))
    third = kind.start(Record("c"), _gated(gate, order))
    assert (await kind.cancel(second.id)).state == JobState.CANCELLED
    gate.set()
    await first.ended()
    await third.ended()
    assert order == ["a", "c"]


async def test_on_cancel_replaces_the_task_cancel() -> None:
    """A job that stops its own way (a worker signalled) ends as its coroutine says."""
    bus, stop = EventBus(), asyncio.Event()

    async def work(job: Job[Record]) -> Record:
        job.on_cancel = stop.set
        await stop.wait()
        return Record("stopped gently")

    kind = _kind(bus)
    kind.start(Record("a"), work)
    await asyncio.sleep(0)
    status = await kind.cancel(1)
    assert status.state == JobState.DONE and status.record == Record("stopped gently")


async def test_a_job_that_raises_ends_failed_with_its_message() -> None:
    bus = EventBus()

    async def broken(job: Job[Record]) -> Record:
        raise TraylmError("the worker did not start: no such file")

    async def crashing(job: Job[Record]) -> Record:
        raise KeyError("level")

    kind = _kind(bus, queued=True)
    with bus.subscribe(frozenset({"test.ended"})) as sub:
        first = await kind.start(Record("a"), broken).ended()
        second = await kind.start(Record("b"), crashing).ended()
        events = [await sub.get(), await sub.get()]
    assert (first.state, first.message) == (
        JobState.FAILED,
        "the worker did not start: no such file",
    )
    assert (second.state, second.message) == (JobState.FAILED, "KeyError: 'level'")
    assert [e.detail for e in events if isinstance(e, Ended)] == [first.message, second.message]


async def test_result_cancels_the_job_when_its_caller_is_cancelled() -> None:
    bus, gate, order = EventBus(), asyncio.Event(), []
    kind = _kind(bus)
    job = kind.start(Record("a"), _gated(gate, order))
    waiter = asyncio.create_task(job.result())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert job.state == JobState.CANCELLED and kind.current is None


async def test_cancel_of_nothing_says_so() -> None:
    kind = _kind(EventBus())
    with pytest.raises(BenchError, match="no test is running"):
        await kind.cancel()
    with pytest.raises(BenchError, match="test 4 is not running; none is"):
        await kind.cancel(4)


async def test_stop_cancels_running_and_queued() -> None:
    bus, gate, order = EventBus(), asyncio.Event(), []
    kind = _kind(bus, queued=True)
    jobs = [kind.start(Record(n), _gated(gate, order)) for n in "ab"]
    await asyncio.sleep(0)
    await kind.stop()
    assert [j.state for j in jobs] == [JobState.CANCELLED, JobState.CANCELLED]
    assert order == ["a"] and kind.jobs == ()
