"""The real-GPU truth script (tests/gpu/truth.py) on a machine without one: its exit, its
read-only promise, its collection run on a FAKE autospecced pynvml and on the simulator, and its
outputs read back by ReplayBackend and the card-profile loader."""

from __future__ import annotations

import ast
import ctypes.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from engines.gpu.card_profile import load
from engines.gpu.replay import ReplayBackend, TraceRecorder
from engines.gpu.sim import IDLE_W, ManualClock, SimulatedBackend
from tests.fakes.fake_pynvml import GIB, fake_pynvml
from tests.fakes.fake_torch import FakeCards, fake_torch
from tests.gpu import truth

SCRIPT = Path(truth.__file__)
ROOT = SCRIPT.parents[2]
WRITES = re.compile(r"nvml\w*(Set|Reset|Clear)|^set_(fan_speed|fan_auto|power_limit)$")


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None, reason="this machine has an NVIDIA driver"
)
def test_without_an_nvidia_gpu_it_says_so_in_one_line_and_exits_2(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("truth: no NVIDIA GPU"), done.stderr
    assert not out.exists()  # nothing half-written


def test_the_script_never_writes_fans_power_or_clocks() -> None:
    """No name, attribute or string in the source is an NVML setter or a backend write."""
    tree = ast.parse(SCRIPT.read_text(encoding="utf-8"))
    words = [
        node.attr if isinstance(node, ast.Attribute) else node.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute | ast.Name)
    ]
    words += [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]
    assert "nvmlDeviceGetTotalEnergyConsumption" in words  # the scan sees the reads
    assert [w for w in words if WRITES.search(w)] == []


def test_the_script_needs_only_the_standard_library_and_nvidia_ml_py() -> None:
    code = (
        "import sys; import tests.gpu.truth; import engines.gpu.nvml; "
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    # -S: without site's start-up hooks; the path holds this tree and nvidia-ml-py only
    path = f"{ROOT}{os.pathsep}{Path(pynvml.__file__).parent}"
    done = subprocess.run(
        [sys.executable, "-S", "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
        env={**os.environ, "PYTHONPATH": path},
    )
    allowed = set(sys.stdlib_module_names) | {"engines", "tests", "pynvml", "torch"}
    assert set(done.stdout.split()) - allowed - {"__main__"} == set()


def _fake_nvml_with_memory_v2() -> Any:
    lib = fake_pynvml(2)
    v1 = SimpleNamespace(total=24 * GIB, free=21 * GIB, used=3 * GIB)
    v2 = SimpleNamespace(total=24 * GIB, reserved=GIB // 2, free=21 * GIB, used=5 * GIB // 2)
    lib.nvmlDeviceGetMemoryInfo.side_effect = lambda h, version=None: v2 if version else v1
    return lib


def test_a_run_writes_a_profile_the_simulator_loads_and_a_replayable_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lib = _fake_nvml_with_memory_v2()
    assert truth.main(["--out", str(tmp_path), "--seconds", "0.4"], lib=lib) == 0

    profile = json.loads((tmp_path / truth.PROFILE_NAME).read_text())
    gpu = profile["gpus"][0]
    assert gpu["memory"]["v2"] == {
        "total": 24 * GIB,
        "reserved": GIB // 2,
        "free": 21 * GIB,
        "used": 5 * GIB // 2,
    }
    assert gpu["memory"]["v1"]["used"] == 3 * GIB
    assert gpu["clock_event_reasons"]["idle"] == {
        "mask": 0x24,
        "words": ["power cap", "software thermal slowdown"],
    }
    assert {p["pid"] for p in gpu["processes"]} == {4242, 4243}
    assert set(profile["sample_cost_us"]) >= {"nvmlDeviceGetPowerUsage", "sample (all GPUs)"}
    card = load(tmp_path / truth.PROFILE_NAME, gpu=1)
    assert card.measured and (card.memory_total_bytes, card.memory_reserved_bytes) == (
        24 * GIB,
        GIB // 2,
    )
    free = SimulatedBackend(1, card=card).sample()[0].memory_free_bytes
    assert free is not None and free < 24 * GIB - GIB // 2

    replay = ReplayBackend(tmp_path / truth.TRACE_NAME, retime=False, loop=False)
    assert [i.name for i in replay.open()] == ["NVIDIA GeForce RTX 4090"] * 2
    assert replay.sample()[0].energy_mj == 987_654_321
    assert not list(tmp_path.glob("*.tmp"))

    # the run itself called no setter of the fake binding
    assert [c for c in lib.mock_calls if WRITES.search(c[0])] == []
    table = capsys.readouterr().out
    assert "NVML reserved (MiB)" in table and "512.0" in table and "idle (" in table


def test_the_sampling_on_the_simulator_integrates_power_and_writes_a_1_hz_trace(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    sim = SimulatedBackend(2, clock=clock, wall=clock)
    uuid = sim.open()[0].uuid
    sim.set_load(uuid, 1.0)
    path = tmp_path / "trace.jsonl"
    with TraceRecorder(path) as recorder:
        windows = truth.measure(sim, recorder, seconds=12, sleep=clock.advance)

    loaded, idle = windows[uuid], windows[sim.open()[1].uuid]
    assert loaded.seconds == pytest.approx(12, abs=0.2)
    assert loaded.counter_j is not None and loaded.integrated_power_j is not None
    assert loaded.ratio == pytest.approx(1.0, abs=0.05)
    assert loaded.mean_power_w is not None and loaded.mean_power_w > 300
    assert idle.mean_power_w == pytest.approx(IDLE_W, abs=1)
    assert "idle" not in loaded.reasons_under_load and "idle" in idle.reasons_under_load

    replay = ReplayBackend(path, retime=False, loop=False)
    assert replay.open() == sim.open()
    frames = [replay.sample() for _ in range(13)]
    assert [round(f[0].ts_s - frames[0][0].ts_s) for f in frames] == list(range(13))
    assert frames[-1][0].energy_mj > frames[0][0].energy_mj  # type: ignore[operator]


def test_with_torch_it_measures_the_context_the_allocation_and_a_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FAKE torch and FAKE pynvml keep one set of memory books, so the script's arithmetic
    (NVML free before and after the context, its own process against torch's count) shows."""
    cards = FakeCards(2, total=24 * GIB, reserved=357 * 2**20, context=400 * 2**20)
    lib = fake_pynvml(2)
    handles = [lib.nvmlDeviceGetHandleByIndex(i) for i in range(2)]
    uuids = [lib.nvmlDeviceGetUUID(h) for h in handles]
    lib.nvmlDeviceGetMemoryInfo.side_effect = lambda h, version=None: cards.nvml_memory(
        handles.index(h), version
    )
    lib.nvmlDeviceGetComputeRunningProcesses.side_effect = lambda h: cards.nvml_processes(
        handles.index(h)
    )
    # torch's device 0 is NVML's GPU 1: the script must match them by UUID
    torch = fake_torch(cards, [u.removeprefix("GPU-") for u in uuids], order=[1, 0])
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    monkeypatch.setattr(truth, "LOAD_WARMUP_S", 0.0)

    assert truth.main(["--out", str(tmp_path), "--seconds", "0.4"], lib=lib) == 0
    profile = json.loads((tmp_path / truth.PROFILE_NAME).read_text())
    for gpu in profile["gpus"]:
        assert gpu["memory"]["torch"]["total"] == 24 * GIB - 357 * 2**20
        assert gpu["cuda_context_bytes"] == 400 * 2**20
        assert gpu["allocation"] == {
            "tensor_bytes": GIB,
            "torch_allocated_bytes": GIB,
            "torch_reserved_bytes": GIB,
            "nvml_own_process_bytes": 400 * 2**20 + GIB,
        }
    assert profile["load"].startswith("fp16 8192x8192 matmuls")
    assert torch.matmuls["matmuls"] > 0
    assert profile["torch_version"] == "2.14.0+fake"
    assert load(tmp_path / truth.PROFILE_NAME).torch_total_bytes == 24 * GIB - 357 * 2**20


def test_reads_a_card_or_binding_refuses_are_not_available(tmp_path: Path) -> None:
    """NotSupported, an older binding's TypeError, and a driver without the newer clock-event
    call (FunctionNotFound: the older throttle-reasons name is read instead)."""
    lib = _fake_nvml_with_memory_v2()
    not_supported = pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    lib.nvmlDeviceGetTotalEnergyConsumption.side_effect = not_supported
    lib.nvmlDeviceGetMemoryInfo.side_effect = TypeError("takes 1 positional argument")
    lib.nvmlDeviceGetCurrentClocksEventReasons.side_effect = pynvml.NVMLError(
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    )
    lib.nvmlDeviceGetCurrentClocksThrottleReasons.return_value = 0x1
    assert truth.main(["--out", str(tmp_path), "--seconds", "0.4"], lib=lib) == 0
    gpu = json.loads((tmp_path / truth.PROFILE_NAME).read_text())["gpus"][0]
    assert gpu["energy"]["counter_j"] is None and gpu["energy"]["counter_over_integrated"] is None
    assert gpu["memory"]["v1"] == {} and gpu["memory"]["v2"] == {}
    assert gpu["clock_event_reasons"]["idle"] == {"mask": 1, "words": ["idle"]}


@pytest.mark.parametrize("seconds", ["0", "-1", "500"])
def test_a_load_outside_the_limit_is_refused(
    seconds: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        truth.main(["--seconds", seconds], lib=fake_pynvml())
    assert exited.value.code == 2
    assert "--seconds must be above 0 and at most 120" in capsys.readouterr().err
