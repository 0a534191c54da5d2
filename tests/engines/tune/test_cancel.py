"""A cancel at once after `traylm tune` starts, while the tune stops the engine serving the
model: that stop is finished, not left half-done, and the engine comes back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engines.events import EngineState, TuneConfig, TuneState
from tests.conftest import RunningDaemon
from tests.engines.gateway.test_daemon_gateway import start_fake
from tests.engines.tune.test_daemon import nothing_of_the_tune_left


@pytest.mark.slow
async def test_a_cancel_while_the_users_engine_stops_restores_it(
    daemon_factory: Any, fake_env: Path
) -> None:
    d: RunningDaemon = await daemon_factory()
    await start_fake(d, "chat", args="--token-delay 0.005")
    await d.client.tune_start(TuneConfig(model="chat", only=("max-num-seqs-4",)))
    job = await d.client.tune_cancel()  # the tune is stopping chat now
    assert job.state == TuneState.CANCELLED and job.detail == "cancelled", job.detail
    status = await d.client.wait_for_engine("chat", (EngineState.READY, EngineState.FAILED), 30)
    assert status.state == EngineState.READY, status.detail
    await nothing_of_the_tune_left(d, {"chat"})
