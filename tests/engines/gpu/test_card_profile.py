"""Card profiles (the JSON tests/gpu/truth.py writes) read back, and the simulator taking its
card's memory from one. The fixture is HAND-WRITTEN (``measured: false``), not measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engines.errors import ConfigError
from engines.gpu.card_profile import load
from engines.gpu.sim import MEMORY_TOTAL_BYTES, SimulatedBackend

HANDWRITTEN = Path(__file__).parents[1] / "data" / "card-profile-rtx4090-handwritten.json"
MIB = 2**20


def test_the_hand_written_profile_loads_and_says_it_was_not_measured() -> None:
    card = load(HANDWRITTEN)
    assert card.name == "NVIDIA GeForce RTX 4090"
    assert card.memory_total_bytes == 24564 * MIB
    assert card.memory_reserved_bytes == 357 * MIB
    assert card.torch_total_bytes == card.memory_total_bytes - card.memory_reserved_bytes
    assert card.cuda_context_bytes == 381878272
    assert card.measured is False
    assert card.source.endswith("card-profile-rtx4090-handwritten.json")


def test_the_simulator_takes_its_cards_memory_from_a_profile() -> None:
    card = load(HANDWRITTEN)
    sim = SimulatedBackend(2, card=card)
    infos = sim.open()
    assert [i.name for i in infos] == ["NVIDIA GeForce RTX 4090 (simulated)"] * 2
    assert {i.memory_total_bytes for i in infos} == {card.memory_total_bytes}
    snap = sim.sample()[0]
    assert snap.memory_total_bytes == card.memory_total_bytes
    assert snap.memory_used_bytes is not None and snap.memory_free_bytes is not None
    # NVML v2: the reserve is in the total but neither used nor free
    assert snap.memory_free_bytes == (
        card.memory_total_bytes - card.memory_reserved_bytes - snap.memory_used_bytes
    )
    sim.hold_memory(infos[0].uuid, pid=7, used_memory_bytes=10 * 2**40, name="huge")
    full = sim.sample()[0]
    assert full.memory_free_bytes == 0
    assert full.memory_used_bytes == card.memory_total_bytes - card.memory_reserved_bytes


def test_without_a_profile_the_simulator_keeps_a_stock_card() -> None:
    backend = SimulatedBackend(1)
    snap = backend.sample()[0]
    assert snap.memory_total_bytes == MEMORY_TOTAL_BYTES
    usable = MEMORY_TOTAL_BYTES - backend.reserved_bytes  # the driver's reserve is no one's
    assert backend.reserved_bytes > 0
    assert snap.memory_free_bytes == usable - (snap.memory_used_bytes or 0)


def _write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "card.json"
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ("{not json", "is not JSON"),
        ({"kind": "something else"}, "is not a traylm card profile"),
        ({"kind": "traylm-card-profile", "version": 9, "gpus": []}, "has version 9"),
        ({"kind": "traylm-card-profile", "version": 1, "gpus": []}, "there is no GPU 0"),
        (
            {"kind": "traylm-card-profile", "version": 1, "gpus": [{"name": "x", "memory": {}}]},
            "has no memory total",
        ),
        (
            {
                "kind": "traylm-card-profile",
                "version": 1,
                "gpus": [{"memory": {"v2": {"total": 10, "reserved": 10}}}],
            },
            "is not below the total",
        ),
    ],
)
def test_a_bad_profile_says_what_is_wrong(tmp_path: Path, data: object, words: str) -> None:
    path = _write(tmp_path, data)
    with pytest.raises(ConfigError, match=words) as err:
        load(path)
    assert str(path) in str(err.value)


def test_a_missing_profile_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="tests/gpu/truth.py"):
        load(tmp_path / "absent.json")


def test_the_daemon_simulates_the_card_a_profile_names(tmp_path: Path) -> None:
    """gpu.simulate_card (`traylm serve --simulate-card FILE`) gives the daemon's GPUs the
    profile's name, memory, reserve and driver; an explicit simulated driver still wins."""
    from engines.config.sections import GPUSettings, Settings
    from engines.gpu.service import build_backend

    card = GPUSettings(simulate_gpus=2, simulate_card=str(HANDWRITTEN))
    infos = build_backend(Settings(gpu=card)).open()
    assert [i.name for i in infos] == ["NVIDIA GeForce RTX 4090 (simulated)"] * 2
    assert {i.memory_reserved_bytes for i in infos} == {374341632}
    assert {i.driver_version for i in infos} == {"580.95.05 (simulated)"}
    older = GPUSettings(simulate_gpus=1, simulate_card=str(HANDWRITTEN), simulate_driver="575")
    assert build_backend(Settings(gpu=older)).open()[0].cuda_version == "12.9"


def test_serve_refuses_a_file_that_is_no_card_profile_before_starting(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    bad = tmp_path / "card.json"
    bad.write_text('{"kind": "something else"}')
    env = {**os.environ, "TRAYLM_HOME": str(tmp_path / "home")}
    argv = [sys.executable, "-m", "engines", "serve", "--port", "0", "--simulate-gpus", "1"]
    out = subprocess.run(
        [*argv, "--simulate-card", str(bad)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert out.returncode != 0 and "is not a traylm card profile" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
