"""A quantization checked against the card it will run on: vLLM's mxfp4 runs from compute
capability 8.0 (its Mxfp4Config.get_min_capability is 80), so an Ada card takes it and a Turing
card is refused before launch; NVFP4 stays Blackwell-only. Through the adapter, and through the
real daemon, whose start checks read the compute capability from its GPU inventory (simulated
RTX 4090s, or a replayed trace of a Turing card)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from engines.config.profiles import profile_from_mapping
from engines.config.sections import GPUSettings
from engines.core.procs import free_loopback_port
from engines.errors import ConfigError, ControlAPIError
from engines.gpu.replay import TraceRecorder
from engines.gpu.sim import SimulatedBackend
from engines.runtime.adapters.vllm import VLLMAdapter
from tests.conftest import RunningDaemon, fast_settings
from tests.engines.runtime.adapters.test_vllm import runtime

ADA = SimulatedBackend(1).infos()[0].compute_capability


def launch(quantization: str, cc: str, device: str = "cuda") -> list[str]:
    p = profile_from_mapping("p", {"model": "org/m", "quantization": quantization})
    made = dataclasses.replace(runtime(device), compute_capability=cc)
    return list(VLLMAdapter().launch(p, runtime=made, port=1, model="org/m").argv)


def test_mxfp4_from_compute_capability_8_0() -> None:
    assert ADA == "8.9"
    argv = launch("mxfp4", ADA)
    assert argv[argv.index("--quantization") + 1] == "mxfp4"
    launch("mxfp4", "8.0")
    launch("mxfp4", "")  # unknown card: vLLM's own check says it at start
    with pytest.raises(ConfigError, match=r"'mxfp4' needs compute capability 8\.0.*is 7\.5"):
        launch("mxfp4", "7.5")


def test_nvfp4_stays_blackwell_only() -> None:
    for cc in (ADA, ""):
        for name in ("nvfp4", "modelopt_fp4"):
            with pytest.raises(ConfigError, match="needs a Blackwell GPU"):
                launch(name, cc)
    launch("modelopt_fp4", "10.0")  # vLLM's name for NVFP4 checkpoints
    with pytest.raises(ConfigError, match="'nvfp4' is not a name vllm 0.32.0 knows"):
        launch("nvfp4", "10.0")  # not one of vLLM's quantization methods, whatever the card


def turing_trace(path: Path) -> Path:
    """A replayed trace of two GPUs that say they are Turing (7.5) cards."""
    sim = SimulatedBackend(2)
    infos = tuple(dataclasses.replace(i, compute_capability="7.5") for i in sim.infos())
    with TraceRecorder(path) as rec:
        rec.header(sim, infos)
        rec.write(sim.sample(slow=True))
        rec.write(sim.sample(slow=True))
    return path


async def command(d: RunningDaemon, quantization: str) -> Any:
    d.write_profile("q", engine="vllm", device="cuda", model="org/q", quantization=quantization)
    return await d.client.command("q")


async def test_the_daemon_checks_mxfp4_against_its_gpus(
    daemon_factory: Any, fake_cuda_env: Path, tmp_path: Path
) -> None:
    base = fast_settings(free_loopback_port())
    ada = await daemon_factory(dataclasses.replace(base, gpu=GPUSettings(simulate_gpus=2)))
    found = await command(ada, "mxfp4")
    assert "mxfp4" in found["argv"]
    with pytest.raises(ControlAPIError, match="needs a Blackwell GPU"):
        await command(ada, "nvfp4")
    ada.daemon.request_stop("next daemon")
    await ada.task
    trace = turing_trace(tmp_path / "turing.jsonl")
    replayed = GPUSettings(replay_file=str(trace))
    turing = await daemon_factory(dataclasses.replace(base, gpu=replayed))
    with pytest.raises(ControlAPIError, match=r"needs compute capability 8\.0.*is 7\.5"):
        await command(turing, "mxfp4")
