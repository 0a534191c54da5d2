"""Efficiency profiles: the built-ins resolved on simulated RTX 4090s, user profiles from TOML,
and the bad input the issue names (a GPU that is gone, values outside a card's range)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engines.errors import ConfigError, GPUNotFound
from engines.events.gpu import GPUInfo
from engines.gpu.clocks import ClockLockError
from engines.gpu.efficiency import BUILTIN, load_profiles, resolve
from engines.gpu.power import PowerLimitError
from engines.gpu.sim import SimulatedBackend


@pytest.fixture
def infos() -> tuple[GPUInfo, ...]:
    return SimulatedBackend(2).open()


def test_builtins_resolve_relative_to_the_card(infos: tuple[GPUInfo, ...]) -> None:
    quiet = resolve(BUILTIN["quiet"], infos)
    assert [t.limit_mw for t in quiet] == [270_000, 270_000]  # 60 % of 450 W
    assert quiet[0].sm_lock_mhz == (210, 1512) and quiet[0].fans == "quiet"
    eco = resolve(BUILTIN["eco"], infos)
    assert eco[1].limit_mw == 337_500 and eco[1].sm_lock_mhz == (210, 1890)
    m0, _ = resolve(BUILTIN["max"], infos)
    assert (m0.limit_mw, m0.sm_lock_mhz, m0.fans) == (None, None, None)


def test_user_profile_with_per_gpu_values(tmp_path: Path, infos: tuple[GPUInfo, ...]) -> None:
    (tmp_path / "night.toml").write_text(
        'description = "night"\npower_pct = 65\nfans = "quiet"\n'
        "[gpus.1]\npower_w = 250\nsm_clock_max_mhz = 1800\n"
    )
    profiles = load_profiles(tmp_path)
    assert set(profiles) == {"quiet", "eco", "max", "night"}
    t0, t1 = resolve(profiles["night"], infos)
    assert (t0.limit_mw, t0.sm_lock_mhz) == (292_500, None)
    assert (t1.limit_mw, t1.sm_lock_mhz, t1.fans) == (250_000, (210, 1800), None)


def test_a_profile_naming_a_gone_gpu_is_refused(tmp_path: Path, infos: tuple[GPUInfo, ...]) -> None:
    (tmp_path / "three.toml").write_text("[gpus.2]\npower_w = 250\n")
    with pytest.raises(GPUNotFound, match="names GPU '2', which is not here.*GPUs: 0"):
        resolve(load_profiles(tmp_path)["three"], infos)


@pytest.mark.parametrize(
    ("text", "error", "expected"),
    [
        ("power_w = 100\n", PowerLimitError, "outside what GPU 0"),
        ("sm_clock_max_mhz = 9000\n", ClockLockError, "supports: 210-2520 MHz"),
        ("fans = 'loud'\n", ConfigError, "no fan preset 'loud'"),
    ],
)
def test_values_outside_the_card_are_refused(
    tmp_path: Path, infos: tuple[GPUInfo, ...], text: str, error: type[Exception], expected: str
) -> None:
    (tmp_path / "bad.toml").write_text(text)
    with pytest.raises(error, match=expected):
        resolve(load_profiles(tmp_path)["bad"], infos)


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("eco", "power_w = 200\n", "built-in profile"),
        ("x", "volts = 1\n", "unknown field.*volts"),
        ("x", "power_w = -3\n", "positive number"),
        ("x", "power_w = \n", "not readable TOML"),
    ],
)
def test_bad_profile_files(tmp_path: Path, name: str, text: str, expected: str) -> None:
    (tmp_path / f"{name}.toml").write_text(text)
    with pytest.raises(ConfigError, match=expected):
        load_profiles(tmp_path)
