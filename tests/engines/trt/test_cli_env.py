"""`traylm engines cache ...` and `traylm remote status` (the real CLI, in a thread, against the
real daemon or the files), the TensorRT-LLM/SGLang env recipes, flag-list fallback and doctor."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from engines.cli import main as cli_main
from engines.config.sections import GPUSettings
from engines.core.procs import free_loopback_port
from engines.envs.manager import RECIPES, EngineRecipe, EnvManager, _python_for, load_flags
from engines.errors import EngineEnvError
from engines.events import EngineState
from engines.events.gpu import GPUInfo
from engines.gpu.inventory import GPUInventory
from engines.gpu.sim import SimulatedBackend
from engines.trt.cache import CacheKey, EngineCache
from engines.trt.env import env_extras, gpu_architecture_check, import_facts
from tests.conftest import fast_settings
from tests.fakes.fake_trt_env import make_fake_trtllm_env, make_tiny_hf_model


def run_cli(*argv: str) -> int:
    try:
        cli_main(list(argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


async def test_cache_commands_through_the_daemon(
    daemon_factory: Any, paths: Any, tmp_path: Path, capsys: Any
) -> None:
    make_fake_trtllm_env(paths.envs_dir)
    d = await daemon_factory(
        dataclasses.replace(fast_settings(free_loopback_port()), gpu=GPUSettings(simulate_gpus=2))
    )
    model = make_tiny_hf_model(tmp_path / "tiny")
    d.write_profile("b", engine="trtllm", device="cuda", model=str(model), mode="build")
    await d.client.start("b")
    status = await d.client.wait_for_engine("b", (EngineState.READY, EngineState.FAILED), 60)
    assert status.state == EngineState.READY, status.detail
    (entry,) = await d.client.trt_cache()
    capsys.readouterr()
    assert await asyncio.to_thread(run_cli, "engines", "cache", "ls") == 0
    out = capsys.readouterr().out
    assert entry.id in out and "in use by b" in out and "trtllm 1.2.1" in out
    assert await asyncio.to_thread(run_cli, "engines", "cache", "rm", entry.id) == 1
    assert "in use by b; stop it first" in capsys.readouterr().err
    await d.client.stop("b")
    assert await asyncio.to_thread(run_cli, "engines", "cache", "rm", entry.id) == 0
    assert f"removed {entry.id}" in capsys.readouterr().out
    assert await asyncio.to_thread(run_cli, "engines", "cache", "ls", "--json") == 0
    assert json.loads(capsys.readouterr().out) == []
    assert await asyncio.to_thread(run_cli, "remote", "status") == 0
    assert "remote fallback: off" in capsys.readouterr().out


def test_cache_commands_without_a_daemon(paths: Any, capsys: Any) -> None:
    cache = EngineCache(paths.trt_engines_dir, 10**12)
    key = CacheKey({"model": "m"}, {"tensorrt_llm": "1.2.1"})
    staging = cache.begin(key)
    (staging / "engine").mkdir()
    (staging / "engine" / "config.json").write_text("{}")
    (staging / "engine" / "rank0.engine").write_bytes(b"x" * 100)
    entry = cache.commit(staging, key, model="m", build_s=2.0, extra={})
    assert run_cli("engines", "cache", "ls") == 0
    assert entry.id in capsys.readouterr().out
    assert run_cli("engines", "cache", "prune", "--stale") == 1
    assert "start it (`traylm serve`)" in capsys.readouterr().err
    assert run_cli("engines", "cache", "prune", "--budget-gib", "0") == 0
    assert "1 engine(s) removed" in capsys.readouterr().out
    assert cache.entries() == []


def test_recipes_and_python_selection() -> None:
    trt = RECIPES[("trtllm", "cuda")]
    assert trt.pythons == ("python3.12", "python3.10")
    assert trt.extra_index_urls == ("https://pypi.nvidia.com",)
    assert RECIPES[("sglang", "cuda")].requirement == "sglang=={version}"
    missing = EngineRecipe("trtllm", "cuda", "1", "x", pythons=("python3.99",))
    with pytest.raises(EngineEnvError, match=r"Python 3\.99 only.*python3\.99-venv"):
        _python_for(missing)
    assert _python_for(EngineRecipe("x", "cuda", "1", "x", pythons=("python3.99", "python3")))


def test_flag_lists_fall_back_to_the_release_line() -> None:
    assert load_flags("trtllm", "1.2.7").version == "1.2"
    assert load_flags("trtllm", "1.2.0", tool="build").engine == "trtllm-build"
    with pytest.raises(EngineEnvError, match=r"no flag allow-list for trtllm 1\.3\.0"):
        load_flags("trtllm", "1.3.0")


async def test_doctor_checks_for_a_trtllm_env(paths: Any) -> None:
    make_fake_trtllm_env(paths.envs_dir, examples=False)
    (env,) = EnvManager(paths.envs_dir).list()
    assert import_facts(env.path)["tensorrt"] == "10.13.3.9"
    extras = env_extras(GPUInventory(SimulatedBackend(2)))
    manager = EnvManager(paths.envs_dir, extras=extras)
    checks = {c.name: c for c in await manager.doctor(env)}
    assert {"GPU architecture", "OpenMPI (tensor parallel)", "engine-build scripts"} <= set(checks)
    assert not checks["engine-build scripts"].ok
    assert "install trtllm" in checks["engine-build scripts"].fix
    assert not checks["imports"].ok  # the FAKE env has no tensorrt_llm to import: doctor says so


def test_gpu_architecture_check_names_what_each_gpu_runs() -> None:
    ada = gpu_architecture_check(SimulatedBackend(1).open())
    assert ada.ok and "sm_89, Ada): FP8 (weights and KV cache), AWQ, INT8; not NVFP4" in ada.detail
    ampere = gpu_architecture_check(
        [
            GPUInfo(
                uuid="GPU-3090", index=0, name="NVIDIA GeForce RTX 3090", compute_capability="8.6"
            )
        ]
    )
    assert ampere.ok and "no FP8 (use int4_awq or int8_wo)" in ampere.detail
    assert not gpu_architecture_check([]).ok
