"""One count of planned measurements, through the real daemon and the FAKE vLLM engine: a budget
that holds only some of the candidates leaves the others out from the start, the progress
events' steps and the job's ``planned`` say the same number, and at the end the measurements
made, the rows and the "not measured" lines add up to every candidate."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from engines.events import TuneConfig, TuneFinished, TuneProgress, TuneState
from tests.conftest import RunningDaemon
from tests.engines.gateway.test_daemon_gateway import start_fake
from tests.engines.tune.test_daemon import TOKEN_S

pytestmark = pytest.mark.slow


async def test_the_planned_count_is_one_number_and_adds_up(
    daemon_factory: Any, fake_env: Path
) -> None:
    d: RunningDaemon = await daemon_factory()
    await start_fake(d, "chat", args=f"--token-delay {TOKEN_S}", max_num_seqs=2)
    config = TuneConfig(model="chat", concurrency=2, requests=2, budget_s=75)
    steps: list[tuple[str, int, int]] = []  # (phase, steps, the job's planned then)
    with d.daemon.bus.subscribe(frozenset({"tune"})) as sub:
        job = await d.client.tune_start(config)
        while True:
            event = await asyncio.wait_for(sub.get(), 120)
            if isinstance(event, TuneProgress) and event.phase != "restore":
                planned = d.daemon.tune.current.planned  # type: ignore[union-attr]
                steps.append((event.phase, event.steps, planned))
            if isinstance(event, TuneFinished) and event.job_id == job.id:
                break
    final = await d.client.tune_current()
    assert final is not None and final.state == TuneState.DONE, final.detail
    all_candidates = len(final.rows) + sum("over the time budget" in line for line in final.dropped)
    first_phase, first_steps, _ = steps[0]
    assert first_phase == "start" and first_steps < 2 * all_candidates  # fitted from the start
    assert all(s == p for _, s, p in steps[1:]), steps  # the event and the job agree
    assert final.planned == len(final.measures) == steps[-1][1]
    assert len(final.rows) * 2 == final.planned  # every candidate measured ran twice
