"""Applying a tune's recommendation after it ended (POST /api/tune/apply: the dashboard's Apply,
once the table has been read) through the real daemon and FAKE vLLM engines: refused with a
reason while nothing finished, written with the previous profile kept for undo, listed among
the profiles that undo can put back, and the very same bytes back after undo."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engines.errors import ControlAPIError
from engines.events import TuneConfig, TuneState
from tests.conftest import RunningDaemon
from tests.engines.gateway.test_daemon_gateway import start_fake
from tests.engines.tune.test_daemon import TOKEN_S, profile_file, tune_to_end

pytestmark = pytest.mark.slow


async def test_apply_after_the_end_keeps_the_previous_for_undo(
    daemon_factory: Any, fake_env: Path
) -> None:
    d: RunningDaemon = await daemon_factory()
    await start_fake(d, "chat", args=f"--token-delay {TOKEN_S}", max_num_seqs=2)
    with pytest.raises(ControlAPIError, match="no finished tune to apply"):
        await d.client.tune_apply()
    before = profile_file(d).read_bytes()
    config = TuneConfig(model="chat", concurrency=8, requests=8, only=("max-num-seqs-32",))
    job = await tune_to_end(d, config)
    assert job.state == TuneState.DONE and job.recommended == "max-num-seqs-32", job
    assert not job.applied and profile_file(d).read_bytes() == before
    assert await d.client.tune_previous() == ()
    applied = await d.client.tune_apply()
    assert applied.applied and "traylm tune --undo chat" in applied.detail
    assert "max_num_seqs = 32" in profile_file(d).read_text()
    assert await d.client.tune_previous() == ("chat",)
    current = await d.client.tune_current()
    assert current is not None and current.applied
    await d.client.tune_undo("chat")
    assert profile_file(d).read_bytes() == before
    assert await d.client.tune_previous() == ()
    current = await d.client.tune_current()
    assert current is not None and not current.applied  # the tune's word follows the undo
    assert current.detail.startswith("applied, then undone")
