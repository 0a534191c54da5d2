"""The control API of one model across boxes on a real daemon: saving a profile with `boxes`
says that vLLM's traffic between the boxes is unencrypted, and the preflight route names
what is wrong (no boxes listed; a box that is not paired)."""

from __future__ import annotations

import pytest

from engines.errors import TraylmError
from tests.conftest import RunningDaemon


async def test_turning_it_on_warns_and_the_check_names_the_fix(daemon_factory) -> None:  # type: ignore[no-untyped-def]
    d: RunningDaemon = await daemon_factory()
    fields = {"model": "/m/tiny", "device": "cpu", "boxes": ["box-b"], "pipeline_parallel_size": 2}
    saved = await d.client.save_profile("big", fields)
    [warning] = saved["warnings"]
    assert "unencrypted and unauthenticated" in warning and "private network" in warning
    plain = await d.client.save_profile("small", {"model": "/m/tiny", "device": "cpu"})
    assert plain["warnings"] == []

    with pytest.raises(TraylmError, match="runs on this box only; list the paired boxes"):
        await d.client.spread_check("small")
