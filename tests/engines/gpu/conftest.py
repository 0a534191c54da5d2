"""The helper's core on two simulated GPUs, driven by a manual clock (no threads, no sleeps)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engines.gpu.helper_core import HelperCore
from engines.gpu.sim import ManualClock, SimulatedBackend


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def sim(clock: ManualClock) -> SimulatedBackend:
    return SimulatedBackend(2, clock=clock, wall=clock)


@pytest.fixture
def core(sim: SimulatedBackend, clock: ManualClock, tmp_path: Path) -> HelperCore:
    core = HelperCore(sim, tmp_path / "gpud", clock=clock)
    core.start()
    return core
