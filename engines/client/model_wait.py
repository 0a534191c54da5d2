"""Loading a model on demand from a CLI command, said as it goes: ``traylm load NAME`` and
``traylm bench run --model NAME`` (a servable model that is not loaded yet) print each step of
the load (queued, placing, evicting, then the engine's start phases) from the daemon's
``model.loading`` events until the model serves."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable

from engines.client import DaemonClient
from engines.events.models import LoadedModel, ModelLoading


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
    engine's diagnosis when the load fails, TimeoutError after ``timeout_s``."""
    row = await c.load_model(name, gpus=gpus, ttl=ttl, pin=pin, replicas=replicas)
    where = f" on GPU {','.join(str(g) for g in row.gpus)}" if row.gpus else ""
    say(f"{row.name}: {row.state}{where}")
    if not wait or row.state == "ready":
        return row
    printer = asyncio.create_task(_print_progress(c, row.engine_id, say))
    try:
        ready = await c.wait_for_model(row.engine_id, timeout_s)
    finally:
        printer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await printer
    say(f"{ready.name}: ready")
    return ready


async def _print_progress(c: DaemonClient, engine_id: str, say: Callable[[str], None]) -> None:
    last = ""
    async for event in c.events(kinds=("model.loading",)):
        if isinstance(event, ModelLoading) and event.engine_id == engine_id:
            line = f"  {event.phase}: {event.detail}" if event.detail else f"  {event.phase}"
            if line != last:
                say(f"{line} ({event.elapsed_s:.0f} s)")
                last = line
