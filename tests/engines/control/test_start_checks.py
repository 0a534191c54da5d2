"""The checks a start makes before anything launches, in the order that gives the true first
reason: the GPUs, then the engine env, then the model (EngineControl.check_start, which models
on demand also reads as each servable model's ``blocked``). No daemon: an empty envs folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from engines.config.profiles import profile_from_mapping
from engines.config.sections import Settings
from engines.control.service import EngineControl
from engines.core.procs import PidRegistry
from engines.envs.manager import EnvManager
from engines.errors import EngineEnvError, GPUNotFound, HubUnavailable
from engines.runtime.supervisor import Supervisor


class FixedSettings:
    current = Settings()

    def subscribe(self, listener: object) -> None:
        pass


async def _no_trust_needed(profile_name: str, model: str) -> None:
    return None


async def _hub_unreachable(profile_name: str, model: str) -> None:
    raise HubUnavailable(f"{model} is not downloaded", brief="not downloaded")


def control(tmp_path: Path, gpus: int) -> EngineControl:
    async def gpu_count() -> int:
        return gpus

    return EngineControl(
        supervisor=Supervisor(),
        envs=EnvManager(tmp_path / "envs"),
        settings=FixedSettings(),
        logs_dir=tmp_path / "logs",
        pids=PidRegistry(tmp_path / "pids.json"),
        publish=lambda event: None,
        launch_hooks={},
        check_trust=_no_trust_needed,
        check_available=_hub_unreachable,
        gpu_count=gpu_count,
    )


async def test_no_gpu_is_the_first_reason_then_too_few_then_the_engine(tmp_path: Path) -> None:
    one = profile_from_mapping("one", {"model": "org/m", "device": "cuda"})
    two = profile_from_mapping(
        "two", {"model": "org/m", "device": "cuda", "gpus": "auto", "tensor_parallel_size": 2}
    )
    with pytest.raises(GPUNotFound) as none:
        await control(tmp_path, 0).check_start(one)  # nor engine, nor model: the GPU first
    assert none.value.brief == "needs an NVIDIA GPU (this computer has none)"
    assert none.value.message.startswith("one needs an NVIDIA GPU (this computer has none); ")
    with pytest.raises(GPUNotFound) as few:
        await control(tmp_path, 1).check_start(two)
    assert few.value.brief == "needs 2 NVIDIA GPUs (1 here)"
    with pytest.raises(EngineEnvError) as engine:
        await control(tmp_path, 2).check_start(two)
    assert engine.value.brief == ("needs the vLLM engine (CUDA build): traylm engines install vllm")
