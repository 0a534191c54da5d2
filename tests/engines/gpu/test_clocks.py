"""Clock locks: the range check, HelperCore's layers and restores, and the simulator's clocks.

The backend is the simulator (two RTX 4090s); the NVML calls are checked against the autospecced
binding in test_nvml.py and traylm-gpud as a real process in test_helperd.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engines.errors import GPUNotSupported, GPUPermissionDenied
from engines.gpu.clocks import ClockLockError
from engines.gpu.helper_core import HelperCore
from engines.gpu.sim import ManualClock, SimulatedBackend, sim_uuid, throughput_share

GPU0, GPU1 = sim_uuid(0), sim_uuid(1)


def locks(sim: SimulatedBackend, gpu: str) -> dict[str, list[int]]:
    found: dict[str, list[int]] = sim.control_state()[gpu]["clock_locks"]
    return found


@pytest.mark.parametrize(
    ("domain", "low", "high", "expected"),
    [
        ("sm", 100, 1800, "outside the sm clocks GPU 0 .* supports: 210-2520 MHz"),
        ("sm", 210, 9000, "outside"),
        ("memory", 405, 20000, "outside the memory clocks"),
        ("sm", 1800, 900, "lowest sm clock .* is above the highest"),
        ("core", 210, 900, "clock must be one of sm, memory"),
    ],
)
def test_a_lock_outside_the_range_is_refused_and_nothing_changes(
    sim: SimulatedBackend, core: HelperCore, domain: str, low: int, high: int, expected: str
) -> None:
    with pytest.raises(ClockLockError, match=expected):
        core.apply_clocks(GPU0, domain, low, high, persist=False, owner=1)
    assert locks(sim, GPU0) == {} and core.status()["clocks"] == []
    assert not [w for w in sim.writes if w[0].startswith("lock")]


def test_lock_shows_in_status_and_caps_the_sm_clock_and_power(
    sim: SimulatedBackend, core: HelperCore, clock: ManualClock
) -> None:
    sim.set_load(GPU0, 1.0)
    sim.set_load(GPU1, 1.0)
    clock.advance(5)
    core.apply_clocks(GPU0, "sm", 210, 1500, persist=False, owner=1)
    clock.advance(5)
    s0, s1 = sim.sample()
    assert s0.sm_clock_mhz == 1500 and s1.sm_clock_mhz == 2520
    assert s0.power_draw_mw is not None and s1.power_draw_mw is not None
    assert s0.power_draw_mw < 0.75 * s1.power_draw_mw  # power follows the clock
    assert core.status()["clocks"] == [
        {"uuid": GPU0, "domain": "sm", "mhz": [210, 1500], "persist": False}
    ]


def test_decode_follows_memory_prefill_follows_sm() -> None:
    sm_lock = {"sm": (210, 1260)}  # half the boost clock
    memory_lock = {"memory": (405, 5250)}  # half the memory clock
    assert throughput_share(sm_lock, phase="decode") > 0.95
    assert throughput_share(sm_lock, phase="prefill") == pytest.approx(0.5)
    assert throughput_share(memory_lock, phase="decode") == pytest.approx(0.5, abs=0.01)
    assert throughput_share(memory_lock, phase="prefill") > 0.9


def test_client_going_away_releases_its_lock(sim: SimulatedBackend, core: HelperCore) -> None:
    core.apply_clocks(GPU0, "sm", 210, 1500, persist=False, owner=7)
    core.apply_clocks(GPU0, "memory", 405, 5001, persist=False, owner=8)
    assert core.release(7) == 1
    assert locks(sim, GPU0) == {"memory": [405, 5001]}
    assert sim.writes[-1][:2] == ("reset_sm", GPU0)


def test_restore_all_resets_only_what_was_locked_unless_everything(
    sim: SimulatedBackend, core: HelperCore
) -> None:
    core.apply_clocks(GPU1, "sm", 210, 1500, persist=True)
    assert core.restore_all() == []
    assert locks(sim, GPU1) == {} and core.status()["clocks"] == []
    resets = [w[:2] for w in sim.writes if w[0].startswith("reset")]
    assert resets == [("reset_sm", GPU1)]
    sim.writes.clear()
    assert HelperCore(sim).restore_all(everything=True) == []
    assert len([w for w in sim.writes if w[0].startswith("reset")]) == 4


def test_persisted_lock_is_saved_and_reapplied_at_start(
    sim: SimulatedBackend, core: HelperCore, clock: ManualClock, tmp_path: Path
) -> None:
    core.apply_clocks(GPU0, "sm", 300, 1700, persist=True)
    saved = json.loads((tmp_path / "gpud" / "state.json").read_text())
    assert {"kind": "clock", "gpu": GPU0, "domain": "sm", "mhz": [300, 1700]} in saved["items"]
    fresh = SimulatedBackend(2, clock=clock, wall=clock)  # a reboot forgot the lock
    assert HelperCore(fresh, tmp_path / "gpud", clock=clock).start() == []
    assert locks(fresh, GPU0) == {"sm": [300, 1700]}


def test_driver_refusals_leave_the_previous_lock(sim: SimulatedBackend, core: HelperCore) -> None:
    core.apply_clocks(GPU0, "sm", 210, 1500, persist=False, owner=1)
    sim.inject(GPU0, clocks_not_supported=True)
    with pytest.raises(GPUNotSupported, match="cannot lock its sm clock"):
        core.apply_clocks(GPU0, "sm", 210, 1200, persist=False, owner=1)
    assert core.status()["clocks"][0]["mhz"] == [210, 1500]
    sim.inject(GPU0, clocks_not_supported=False, no_permission_writes=True)
    with pytest.raises(GPUPermissionDenied):
        core.apply_clocks(GPU0, "sm", 210, 1200, persist=False, owner=1)
    assert locks(sim, GPU0) == {"sm": [210, 1500]}


def test_a_card_without_locks_is_no_failure_for_the_stop_hook(sim: SimulatedBackend) -> None:
    sim.inject(GPU0, clocks_not_supported=True)
    sim.inject(GPU1, clocks_not_supported=True)
    assert HelperCore(sim).restore_all(everything=True) == []


def test_quick_succession_ends_in_the_last_lock(sim: SimulatedBackend, core: HelperCore) -> None:
    for top in (1200, 1800, 1500, 2100):
        core.apply_clocks(GPU0, "sm", 210, top, persist=False, owner=1)
    assert locks(sim, GPU0) == {"sm": [210, 2100]}
    core.restore_clocks("all")
    assert locks(sim, GPU0) == {} and core.status()["clocks"] == []
