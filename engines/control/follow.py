"""The long waits of the engine commands, said as they go instead of minutes of silence:
``traylm start ... --wait`` prints each start phase the daemon reports (importing, loading
weights, compiling, KV cache, CUDA graphs, ...) and how long it has lasted;
``traylm engines install`` prints pip's steps and, every few seconds, the bytes downloaded.

The phases come as ``engine.phase`` events, subscribed before the start is asked for; a status
poll every second repeats a long phase's line and catches a terminal state if the stream breaks
(the job follower of engines/client/follow.py).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from engines.client import DaemonClient
from engines.client.follow import Followed, follow
from engines.envs.pip_progress import PipStatus
from engines.errors import TraylmError
from engines.events.codec import Event
from engines.events.core import EngineStartPhase, EngineState, EngineStateChanged, EngineStatus
from engines.runtime.phase_text import PhasePrinter

POLL_S = 1.0
BYTES_EVERY_S = 3.0  # a download progress line at most this often
DONE = (EngineState.READY, EngineState.FAILED)


async def follow_start(
    c: DaemonClient,
    start: Callable[[], Awaitable[EngineStatus]],
    *,
    timeout_s: float,
    say: Callable[[str], None],
) -> EngineStatus:
    """Run ``start`` and follow that engine until it is ready or failed (engines/client/
    follow.py); ``say`` gets a line when each start phase begins and every REPEAT_S seconds
    while one lasts (engines/runtime/phase_text.py). Raises TimeoutError after ``timeout_s``;
    Ctrl-C stops following, and the engine goes on starting."""
    printer = PhasePrinter(say)

    async def now(engine_id: str) -> EngineStatus:
        current = next((e for e in await c.engines() if e.engine_id == engine_id), None)
        if current is None:
            raise TraylmError(f"engine {engine_id!r} is gone from the daemon")
        if current.state not in DONE:  # a long phase: its time, every REPEAT_S
            printer(current)
        return current

    def show(event: Event, engine_id: str) -> None:
        if isinstance(event, EngineStartPhase) and event.engine_id == engine_id:
            printer.began(event)

    spec: Followed[EngineStatus, str] = Followed(
        kinds=("engine.state", "engine.phase"),
        job_id=lambda status: status.engine_id,
        line=lambda _e, _id: ("", False),
        ends=lambda e, engine_id: (
            isinstance(e, EngineStateChanged) and e.engine_id == engine_id and e.state in DONE
        ),
        now=now,
        running=lambda status: status.state not in DONE,
        cancel=None,
        stopping="",
        cancel_answer_s=0.0,
        poll_s=POLL_S,
        show=show,
    )

    def started(status: EngineStatus) -> None:
        say(f"{status.engine_id}: {status.state} (serves {', '.join(status.served_names)})")

    return await follow(c, spec, start, started=started, timeout_s=timeout_s)


class InstallPrinter:
    """Prints an install's lines and pip's download progress, with the elapsed time."""

    def __init__(self, started_s: float) -> None:
        self.started_s = started_s
        self._printed_s = 0.0
        self._step = ("", "")

    def _stamp(self) -> str:
        return f"[{time.monotonic() - self.started_s:6.1f}s]"

    def line(self, phase: str, text: str) -> None:
        print(f"{self._stamp()} {phase:<7} {text[:150]}", flush=True)

    def pip(self, status: PipStatus) -> None:
        """Bytes while a file downloads (the step lines come through ``line``)."""
        step = (status.step, status.package)
        now = time.monotonic()
        if status.step != "downloading" or not status.file_total_bytes:
            self._step = step
            return
        if step == self._step and now - self._printed_s < BYTES_EVERY_S:
            return
        self._step, self._printed_s = step, now
        print(
            f"{self._stamp()} install downloading {status.package[:60]}: "
            f"{_mb(status.file_done_bytes)} of {_mb(status.file_total_bytes)} "
            f"({_mb(status.done_bytes)} downloaded so far)",
            flush=True,
        )


def _mb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"
