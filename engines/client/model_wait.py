"""Loading a model on demand from a CLI command, said as it goes: ``traylm load NAME`` and
``traylm bench run --model NAME`` (a servable model that is not loaded yet) print each step of
the load (queued, placing, evicting, then the engine's start phases) from the daemon's
``model.loading`` events until the model serves."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable

from engines.client import DaemonClient
from engines.core.waiting import within
from engines.errors import TraylmError
from engines.events.models import LoadedModel, ModelLoading

SUBSCRIBE_WAIT_S = 10.0


async def load_and_wait(
    c: DaemonClient,
    name: str,
    *,
    timeout_s: float,
    say: Callable[[str], None] = print,
    gpus: Iterable[int] | None = None,
    ttl: str | float | None = None,
    pin: bool = False,
    wait: bool = True,
    replicas: int | None = None,
) -> LoadedModel:
    """Load ``name`` and, with ``wait``, follow it until it serves; ControlAPIError with the
    engine's diagnosis when the load fails, TimeoutError after ``timeout_s``. The events are
    subscribed before the load is asked for: the daemon answers once the model is placed, so
    its queued, placing and evicting steps have passed by then."""
    seen: asyncio.Queue[ModelLoading] = asyncio.Queue()
    opened = asyncio.Event()
    pump = asyncio.create_task(_pump(c, seen, opened)) if wait else None
    try:
        if pump is not None:
            with contextlib.suppress(TimeoutError):  # no stream: the wait below still ends it
                await within(SUBSCRIBE_WAIT_S, opened.wait())
        row = await c.load_model(name, gpus=gpus, ttl=ttl, pin=pin, replicas=replicas)
        where = f" on GPU {','.join(str(g) for g in row.gpus)}" if row.gpus else ""
        say(f"{row.name}: {row.state}{where}")
        if not wait or row.state == "ready":
            return row
        printer = asyncio.create_task(_print_progress(seen, row.engine_id, say))
        try:
            ready = await c.wait_for_model(row.engine_id, timeout_s)
        finally:
            printer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await printer
    finally:
        if pump is not None:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
    say(f"{ready.name}: ready")
    return ready


async def _pump(c: DaemonClient, seen: asyncio.Queue[ModelLoading], opened: asyncio.Event) -> None:
    with contextlib.suppress(TraylmError):  # no stream: the load is still waited for
        async for event in c.events(kinds=("model.loading",), opened=opened.set):
            if isinstance(event, ModelLoading):
                seen.put_nowait(event)


async def _print_progress(
    seen: asyncio.Queue[ModelLoading], engine_id: str, say: Callable[[str], None]
) -> None:
    """Each step of this engine's load, those from before the daemon answered first."""
    last = ""
    while True:
        event = await seen.get()
        if event.engine_id == engine_id:
            line = f"  {event.phase}: {event.detail}" if event.detail else f"  {event.phase}"
            if line != last:
                say(f"{line} ({event.elapsed_s:.0f} s)")
                last = line
