"""Waiting for an engine process to exit (engines.core.procs.exit_code): real child processes, on
asyncio's loop and on uvloop (the daemon's). The wait is woken by the exit itself, so a long
wait costs the loop no wake-ups: an idle daemon does not spin for its engines."""

from __future__ import annotations

import asyncio
import selectors
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from engines.core.procs import exit_code

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


def run(coro: Coroutine[Any, Any, Any], loop: str) -> Any:
    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        return runner.run(coro)


async def child(code: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, stdin=asyncio.subprocess.PIPE
    )


async def exits_when_told(exit_with: int) -> int | None:
    """A child that exits with ``exit_with`` once its stdin closes; waited with a long
    timeout, so only its exit ends the wait."""
    proc = await child(f"import sys; sys.stdin.read(); sys.exit({exit_with})")
    assert proc.stdin is not None
    waiting = asyncio.create_task(exit_code(proc, 120.0))
    await asyncio.sleep(0)
    assert not waiting.done()
    proc.stdin.close()
    code = await waiting
    await proc.wait()
    return code


async def killed() -> int | None:
    proc = await child("import time; time.sleep(120)")
    waiting = asyncio.create_task(exit_code(proc, 120.0))
    await asyncio.sleep(0)
    proc.send_signal(signal.SIGKILL)
    code = await waiting
    await proc.wait()
    return code


async def still_running(timeout_s: float) -> tuple[int | None, int | None]:
    proc = await child("import sys; sys.stdin.read()")
    assert proc.stdin is not None
    try:
        return await exit_code(proc, timeout_s), proc.returncode
    finally:
        proc.stdin.close()
        await proc.wait()


@pytest.mark.parametrize("loop", LOOPS)
def test_the_exit_code_comes_when_the_process_exits(loop: str) -> None:
    assert run(exits_when_told(3), loop) == 3
    assert run(exits_when_told(0), loop) == 0


@pytest.mark.parametrize("loop", LOOPS)
def test_a_killed_process_gives_the_signal_as_asyncio_does(loop: str) -> None:
    assert run(killed(), loop) == -signal.SIGKILL


@pytest.mark.parametrize("loop", LOOPS)
def test_a_process_still_running_gives_none_after_the_timeout(loop: str) -> None:
    assert run(still_running(0.3), loop) == (None, None)


async def exited_already() -> tuple[int | None, int | None]:
    proc = await child("pass")
    await proc.wait()  # reaped: no pidfd can be opened for it any more
    return await exit_code(proc, 5.0), proc.returncode


def test_a_process_reaped_already_gives_its_code_at_once() -> None:
    assert run(exited_already(), "asyncio") == (0, 0)


class CountingSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """The loop's real selector, counting how often the loop woke up."""

    wakeups = 0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        CountingSelector.wakeups += 1
        return super().select(timeout)  # type: ignore[no-any-return]


def test_a_long_wait_does_not_wake_the_loop_over_and_over() -> None:
    """An engine's exit is watched for as long as it runs: the wait must be woken by the exit,
    not by a timer (a 50 ms poll woke an idle daemon 20 times a second per engine)."""
    loop = asyncio.SelectorEventLoop(CountingSelector())
    try:
        CountingSelector.wakeups = 0

        async def wait_a_second() -> tuple[int, int | None]:
            proc = await child("import sys; sys.stdin.read()")
            assert proc.stdin is not None
            try:
                before = CountingSelector.wakeups
                code = await exit_code(proc, 1.0)
                return CountingSelector.wakeups - before, code
            finally:
                proc.stdin.close()
                await proc.wait()

        wakeups, code = loop.run_until_complete(wait_a_second())
    finally:
        loop.close()
    assert code is None
    assert wakeups <= 4, f"the loop woke {wakeups} times while waiting one second for an exit"
