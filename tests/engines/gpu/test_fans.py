"""Fan-curve maths and the closed loop: HelperCore driving the simulated RTX 4090s.

The simulator runs on a ManualClock, so an hour of thermal behaviour takes milliseconds and every
run is the same. The loop under test is the one traylm-gpud runs (HelperCore.tick).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engines.errors import ConfigError, GPUError, GPUNotFound
from engines.events import FanCurve
from engines.gpu.fans import (
    FanController,
    FanCurveError,
    curve_from_mapping,
    duty_at,
    fan_ids,
    load_presets,
    preset,
    validate_curve,
)
from engines.gpu.helper_core import HelperCore
from engines.gpu.power import PowerLimitError
from engines.gpu.sim import ManualClock, SimulatedBackend, sim_uuid

GPU0, GPU1 = sim_uuid(0), sim_uuid(1)
CURVE = FanCurve(points=((40, 30), (60, 50), (80, 100)), hysteresis_c=3)


# --------------------------------------------------------------------------- curve maths


def test_interpolation_and_clamping() -> None:
    assert duty_at(CURVE, 20) == 30
    assert duty_at(CURVE, 50) == 40
    assert duty_at(CURVE, 70) == 75
    assert duty_at(CURVE, 95) == 100


@pytest.mark.parametrize(
    ("points", "expected"),
    [
        ([[40, 30]], "2 to 16 points"),
        ([[60, 30], [50, 40]], "temperatures must rise"),
        ([[40, 60], [60, 50]], "must not fall"),
        ([[40, 30], [60, 120]], "0-100 %"),
        ([[-5, 30], [60, 50]], "0-105 °C"),
        ([[40, 20], [60, 50]], "below this card's fan floor of 30 %"),
    ],
)
def test_bad_curves_are_refused_with_the_reason(points: list[list[int]], expected: str) -> None:
    curve = curve_from_mapping({"points": points})
    with pytest.raises(FanCurveError) as err:
        validate_curve(curve, min_pct=30, max_pct=100)
    assert expected in err.value.message
    assert err.value.code == "fan_curve_invalid"


def test_malformed_curve_data() -> None:
    with pytest.raises(FanCurveError, match="unknown keys speed"):
        curve_from_mapping({"points": [[40, 30], [80, 100]], "speed": 3})
    with pytest.raises(FanCurveError, match=r"point 2 .* must be \[temperature"):
        curve_from_mapping({"points": [[40, 30], "hot"]})
    with pytest.raises(FanCurveError, match="hysteresis_c must be a number"):
        curve_from_mapping({"points": [[40, 30], [80, 100]], "hysteresis_c": "2"})


def test_every_problem_is_listed_at_once() -> None:
    curve = curve_from_mapping({"points": [[60, 120], [50, 10]], "hysteresis_c": 40})
    with pytest.raises(FanCurveError) as err:
        validate_curve(curve, min_pct=30)
    text = err.value.message
    assert "0-100 %" in text and "temperatures must rise" in text and "hysteresis_c" in text


def test_warnings_for_valid_but_odd_curves() -> None:
    warnings = validate_curve(FanCurve(points=((70, 30), (90, 50))))
    assert any("never runs the fans above 50 %" in w for w in warnings)
    assert any("firmware control up to 70 °C" in w for w in warnings)


def test_presets_ship_and_are_valid_for_a_4090() -> None:
    presets = load_presets()
    assert set(presets) == {"quiet", "balanced", "performance", "full"}
    for curve in presets.values():
        validate_curve(curve, min_pct=30, max_pct=100)
    assert preset("full").points[0] == (30.0, 100.0)
    with pytest.raises(FanCurveError, match="presets: "):
        preset("turbo")


# --------------------------------------------------------------------------- controller


def test_controller_rises_at_once_and_holds_on_the_way_down() -> None:
    c = FanController(CURVE, min_pct=30, max_pct=100)
    assert c.update(35, 0) is None  # below the first point: firmware keeps the fan
    cmd = c.update(70, 1)
    assert cmd is not None and cmd.duty_pct == 75
    assert c.update(68, 2) is None  # within the hysteresis: hold 75 %
    cmd = c.update(66, 3)  # 4 °C below the temperature that set 75 %
    assert cmd is not None and cmd.duty_pct == 65
    cmd = c.update(72, 4)  # rising again: at once
    assert cmd is not None and cmd.duty_pct == 80


def test_controller_min_step_and_spin_down_delay() -> None:
    curve = FanCurve(
        points=((40, 30), (80, 100)), hysteresis_c=0, min_step_pct=5, spin_down_delay_s=10
    )
    c = FanController(curve, min_pct=30)
    assert c.update(60, 0).duty_pct == 65  # type: ignore[union-attr]
    assert c.update(61, 1) is None  # +1.75 %: under the minimum step
    assert c.update(63, 2).duty_pct == 70  # type: ignore[union-attr]
    assert c.update(50, 3) is None  # falling: the delay starts
    assert c.update(50, 12) is None
    assert c.update(50, 13).duty_pct == 48  # type: ignore[union-attr]


def test_controller_hands_back_below_the_first_point_and_reads_missing_as_hot() -> None:
    c = FanController(CURVE, min_pct=30)
    assert c.update(45, 0).duty_pct == 35  # type: ignore[union-attr]
    assert c.update(38, 1).duty_pct == 30  # type: ignore[union-attr]
    assert c.update(37.5, 2) is None  # below 40 °C, but not by the hysteresis: stay at 30 %
    cmd = c.update(36, 2)
    assert cmd is not None and cmd.duty_pct is None and "firmware" in cmd.reason
    cmd = c.update(None, 3)
    assert cmd is not None and cmd.duty_pct == 100 and "unreadable" in cmd.reason


def test_controller_clamps_to_the_card() -> None:
    c = FanController(FanCurve(points=((40, 0), (80, 100))), min_pct=30, max_pct=90)
    assert c.update(41, 0).duty_pct == 30  # type: ignore[union-attr]
    assert c.update(95, 1).duty_pct == 90  # type: ignore[union-attr]


# --------------------------------------------------------------------------- closed loop


def loop(core: HelperCore, clock: ManualClock, seconds: int) -> None:
    for _ in range(seconds):
        clock.advance(1.0)
        core.tick()


def steady_temperature(sim: SimulatedBackend, core: HelperCore | None, clock: ManualClock) -> float:
    for _ in range(600):
        clock.advance(1.0)
        if core is not None:
            core.tick()
    return sim.temperature_c(GPU0)


def test_a_curve_drives_the_fans_and_cools_better_than_firmware(
    sim: SimulatedBackend, core: HelperCore, clock: ManualClock
) -> None:
    sim.set_load(GPU0, 1.0)
    sim.set_load(GPU1, 1.0)
    core.apply_curve(GPU0, preset("performance"), None, persist=True)
    t_curve = steady_temperature(sim, core, clock)
    t_firmware = sim.temperature_c(GPU1)
    (s0, s1) = sim.sample()
    assert all(f.manual for f in s0.fans) and not any(f.manual for f in s1.fans)
    expected = round(duty_at(preset("performance"), s0.temperature_c or 0))
    assert all(abs((f.speed_pct or 0) - expected) <= 3 for f in s0.fans)
    assert t_curve < t_firmware - 3  # more air than the firmware's own curve
    status = core.status()
    assert [f["mode"] for f in status["fans"] if f["uuid"] == GPU0] == ["curve", "curve"]


def test_hysteresis_holds_then_hand_back_below_the_first_point(
    sim: SimulatedBackend, core: HelperCore, clock: ManualClock
) -> None:
    sim.set_load(GPU0, 1.0)
    core.apply_curve(GPU0, preset("balanced"), None, persist=False, owner=1)
    loop(core, clock, 300)
    hot_duty = core.status()["fans"][0]["duty_pct"]
    assert hot_duty is not None and hot_duty > 60
    sim.set_load(GPU0, 0.0)
    writes_before = len(sim.writes)
    clock.advance(1.0)
    core.tick()  # one degree or so cooler: inside the hysteresis, nothing is sent
    assert core.status()["fans"][0]["duty_pct"] == hot_duty
    assert len(sim.writes) == writes_before
    loop(core, clock, 900)  # cools to idle: below 45 - 2 °C the firmware gets the fans back
    s0 = sim.sample()[0]
    assert s0.temperature_c is not None and s0.temperature_c < 43
    assert not any(f.manual for f in s0.fans)
    assert ("fan_auto", GPU0, 0, None) in sim.writes
    assert core.status()["fans"][0]["duty_pct"] is None  # curve still in force, firmware has it


def test_temperature_read_failure_hands_fans_back(
    sim: SimulatedBackend, core: HelperCore, clock: ManualClock
) -> None:
    core.apply_curve(GPU0, preset("full"), None, persist=True)
    assert all(f.manual for f in sim.sample()[0].fans)
    sim.inject(GPU0, not_supported=frozenset({"temperature_c"}))
    loop(core, clock, 1)
    assert not any(f.manual for f in sim.sample()[0].fans)
    assert any("temperature unreadable" in w for w in core.warnings)
    sim.inject(GPU0, not_supported=frozenset())
    loop(core, clock, 1)
    assert all(f.manual for f in sim.sample()[0].fans)  # the curve resumes


def test_lost_gpu_is_dropped(sim: SimulatedBackend, core: HelperCore, clock: ManualClock) -> None:
    core.apply_curve(GPU0, preset("full"), None, persist=True)
    sim.inject(GPU0, lost=True)
    loop(core, clock, 1)
    assert any("lost" in w for w in core.warnings)
    with pytest.raises(GPUNotFound, match="lost"):
        core.apply_power(GPU0, 300_000, persist=True)
    assert core.restore_all() == []  # the lost GPU is not touched


def test_foreign_manual_fan_is_reported_and_taken_over_on_request(
    sim: SimulatedBackend, core: HelperCore, clock: ManualClock
) -> None:
    sim.inject(GPU1, foreign_manual=frozenset({1}))
    loop(core, clock, 1)
    fans = {(f["uuid"], f["fan"]): f["mode"] for f in core.status()["fans"]}
    assert fans[(GPU1, 1)] == "foreign" and fans[(GPU1, 0)] == "auto"
    assert any("another program controls it" in w for w in core.status()["warnings"])
    result = core.apply_curve(GPU1, preset("quiet"), (1,), persist=True)
    assert any("taken it over" in w for w in result["warnings"])
    loop(core, clock, 1)
    assert not any("another program" in w for w in core.status()["warnings"])  # it is ours now


def test_leases_are_released_and_persisted_settings_stay(
    sim: SimulatedBackend, core: HelperCore, clock: ManualClock
) -> None:
    core.apply_power(GPU0, 350_000, persist=True)
    core.apply_power(GPU0, 300_000, persist=False, owner=7)
    core.apply_power(GPU0, 250_000, persist=False, source="guard", owner=7)
    core.apply_curve(GPU1, preset("full"), None, persist=False, owner=7)
    assert sim.control_state()[GPU0]["power_limit_mw"] == 250_000
    core.restore_power(GPU0, "guard")
    assert sim.control_state()[GPU0]["power_limit_mw"] == 300_000
    assert core.release(7) == 3  # lease power + two fans
    assert sim.control_state()[GPU0]["power_limit_mw"] == 350_000  # the saved limit
    assert not any(f["manual"] for f in sim.control_state()[GPU1]["fans"])
    core.restore_power(GPU0)
    assert sim.control_state()[GPU0]["power_limit_mw"] == 450_000


def test_persisted_settings_come_back_after_a_reboot(tmp_path: Path, clock: ManualClock) -> None:
    first = HelperCore(SimulatedBackend(2, clock=clock, wall=clock), tmp_path / "gpud", clock=clock)
    first.start()
    first.apply_power(GPU1, 300_000, persist=True)
    first.apply_curve(GPU0, preset("full"), (0,), persist=True)
    first.apply_curve(GPU0, preset("quiet"), (1,), persist=False, owner=3)  # not saved
    rebooted = SimulatedBackend(2, clock=clock, wall=clock)  # the driver forgot everything
    assert rebooted.control_state()[GPU1]["power_limit_mw"] == 450_000
    second = HelperCore(rebooted, tmp_path / "gpud", clock=clock)
    assert second.start() == []
    state = rebooted.control_state()
    assert state[GPU1]["power_limit_mw"] == 300_000
    assert state[GPU0]["fans"][0]["manual"] and not state[GPU0]["fans"][1]["manual"]


def test_resume_from_suspend_reapplies(
    sim: SimulatedBackend, core: HelperCore, clock: ManualClock
) -> None:
    core.apply_power(GPU0, 300_000, persist=True)
    core.tick(clock_gap_s=100.0)
    core.tick(clock_gap_s=100.1)
    writes = [w for w in sim.writes if w[0] == "power_limit"]
    assert len(writes) == 1
    core.tick(clock_gap_s=3700.0)  # an hour asleep
    writes = [w for w in sim.writes if w[0] == "power_limit"]
    assert writes[-1] == ("power_limit", GPU0, -1, 300_000) and len(writes) == 2


def test_unvalidated_values_never_reach_the_gpu(sim: SimulatedBackend, core: HelperCore) -> None:
    with pytest.raises(PowerLimitError, match="150-600 W"):
        core.apply_power(GPU0, 100_000, persist=True)
    with pytest.raises(FanCurveError, match="fan floor"):
        core.apply_curve(GPU0, FanCurve(points=((40, 10), (80, 100))), None, persist=True)
    with pytest.raises(GPUError, match="no fan 5"):
        core.apply_curve(GPU0, preset("quiet"), (5,), persist=True)
    with pytest.raises(GPUNotFound):
        core.apply_power("GPU-99999999-0000-0000-0000-000000000000", 300_000, persist=True)
    assert sim.writes == []


def test_refused_write_rolls_back(sim: SimulatedBackend, core: HelperCore) -> None:
    sim.inject(GPU0, no_permission_writes=True)
    with pytest.raises(GPUError, match="root"):
        core.apply_power(GPU0, 300_000, persist=True)
    with pytest.raises(GPUError, match="root"):
        core.apply_curve(GPU0, preset("full"), None, persist=True)
    assert core.status()["power"] == []
    assert {f["mode"] for f in core.status()["fans"]} == {"auto"}


def test_restore_all_gives_everything_back(sim: SimulatedBackend, core: HelperCore) -> None:
    core.apply_power(GPU0, 300_000, persist=True)
    core.apply_curve(GPU1, preset("full"), None, persist=True)
    assert core.restore_all() == []
    state = sim.control_state()
    assert state[GPU0]["power_limit_mw"] == 450_000
    assert not any(f["manual"] for g in state.values() for f in g["fans"])


def test_the_daemon_and_the_helper_check_fan_numbers_alike(tmp_path: Path) -> None:
    """One check of the fans a request names: the daemon refuses a fan the card lacks as a
    ConfigError, and traylm-gpud (which checks again as root) with the same words."""
    sim = SimulatedBackend(1)
    [info] = sim.infos()
    assert fan_ids(None, info) == (0, 1) and fan_ids([1], info) == (1,)
    with pytest.raises(ConfigError) as daemon_said:
        fan_ids([7], info)
    with pytest.raises(GPUError) as helper_said:
        HelperCore(sim, tmp_path / "gpud").apply_curve(GPU0, CURVE, (7,), persist=False)
    assert daemon_said.value.message == helper_said.value.message
    assert daemon_said.value.message == "GPU 0 has fans 0-1; there is no fan 7"
    with pytest.raises(ConfigError, match="distinct fan numbers"):
        fan_ids([0, 0], info)
