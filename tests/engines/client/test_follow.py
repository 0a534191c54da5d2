"""The CLI's job follower (engines/client/follow.py) through the real daemon with a real job: a
benchmark run against the FAKE engine, followed by its events, by the poll alone when no event
comes, and cancelled in the daemon when the follower is (Ctrl-C). The Ctrl-C of the real CLI
process is tests/engines/bench/test_daemon.py::test_ctrl_c_in_bench_run_cancels_the_run."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from engines.bench.cli import followed
from engines.client.follow import follow
from engines.events import BenchConfig, BenchProgress, BenchRun, BenchState
from tests.conftest import RunningDaemon
from tests.engines.bench.test_daemon import sim_daemon  # noqa: F401 (a fixture)
from tests.engines.gateway.test_daemon_gateway import start_fake

pytestmark = pytest.mark.slow
SMALL = BenchConfig(model="fake", concurrency=(1,), requests=4, output_len=4, warmup=0)


async def test_follow_prints_progress_and_returns_the_run_as_it_ended(
    sim_daemon: RunningDaemon,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    d = sim_daemon
    await start_fake(d)
    said: list[int] = []
    run = await follow(
        d.client, followed(d.client), lambda: d.client.bench_start(SMALL),
        started=lambda r: said.append(r.id),
    )  # fmt: skip
    assert run.state == BenchState.DONE and said == [run.id] and run.levels
    assert "[level 1/1, concurrency 1]" in capsys.readouterr().err


async def test_follow_finds_the_end_by_polling_when_no_event_comes(
    sim_daemon: RunningDaemon,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Subscribed to a kind nothing publishes: only the status poll can see the run end."""
    d = sim_daemon
    await start_fake(d)
    spec = dataclasses.replace(followed(d.client), kinds=("no.such.kind",), poll_s=0.2)
    run = await follow(d.client, spec, lambda: d.client.bench_start(SMALL))
    assert run.state == BenchState.DONE
    assert "[level" not in capsys.readouterr().err  # no event reached it


async def test_a_cancelled_follower_cancels_the_job_in_the_daemon(
    sim_daemon: RunningDaemon,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    d = sim_daemon
    await start_fake(d, args="--token-delay 0.05")
    config = dataclasses.replace(SMALL, requests=200, output_len=40)
    with d.daemon.bus.subscribe(frozenset({"bench.progress"})) as sub:
        task: asyncio.Task[BenchRun] = asyncio.create_task(
            follow(d.client, followed(d.client), lambda: d.client.bench_start(config))
        )
        while True:  # the run measures
            event = await asyncio.wait_for(sub.get(), 60)
            if isinstance(event, BenchProgress) and event.phase == "measure":
                break
        task.cancel()  # what Ctrl-C does to the command's task
        with pytest.raises(asyncio.CancelledError):
            await task
    [run] = await d.client.bench_runs()
    assert run.state == BenchState.CANCELLED
    assert d.daemon.bench.current is None
    assert "stopping the benchmark..." in capsys.readouterr().err


async def test_a_ctrl_c_while_the_start_request_is_in_flight_cancels_what_it_starts(
    sim_daemon: RunningDaemon,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The command is cancelled before the daemon has answered its start request: the follower
    waits for the answer and cancels the run it started (it used to be left running)."""
    d = sim_daemon
    await start_fake(d, args="--token-delay 0.05")
    config = dataclasses.replace(SMALL, requests=200, output_len=40)
    asking, answer = asyncio.Event(), asyncio.Event()

    async def start() -> BenchRun:  # the daemon has started the run; its answer is on its way
        run = await d.client.bench_start(config)
        asking.set()
        await answer.wait()
        return run

    task = asyncio.create_task(follow(d.client, followed(d.client), start))
    await asyncio.wait_for(asking.wait(), 30)
    task.cancel()  # what Ctrl-C does to the command's task
    answer.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    [run] = await d.client.bench_runs()
    assert run.state == BenchState.CANCELLED
    assert d.daemon.bench.current is None
    assert "stopping the benchmark..." in capsys.readouterr().err
