"""What the first-run setup proposes comes from the daemon (GET /api/setup/proposals): the
presets this computer's GPUs can start, each with the planner's placement, or the CPU starters
without an NVIDIA GPU (simulated GPUs run nothing). Real daemon; a FAKE autospecced pynvml
stands in for RTX 4090s."""

from __future__ import annotations

import sys
import tomllib

import pytest

from engines.config.sections import resources_dir
from engines.gpu.nvml import NVMLBackend
from tests.conftest import DaemonFactory, RunningDaemon
from tests.engines.ondemand.conftest import settings
from tests.fakes.fake_pynvml import fake_pynvml

STARTERS = [
    s["name"] for s in tomllib.loads((resources_dir() / "starters.toml").read_text())["cpu"]
]


async def test_without_a_gpu_the_cpu_starters(od: RunningDaemon) -> None:
    proposals = await od.client.setup_proposals()
    assert [p.name for p in proposals] == STARTERS
    first = proposals[0]
    assert (first.kind, first.device, first.placement) == ("starter", "cpu", None)
    assert first.profile["model"] == first.repo_id == "Qwen/Qwen2.5-0.5B-Instruct"
    assert first.profile["served_name"] == first.name


async def test_simulated_gpus_run_nothing_so_the_cpu_starters(
    daemon_factory: DaemonFactory, fake_env: object
) -> None:
    d = await daemon_factory(settings(gpus=2))
    assert [p.name for p in await d.client.setup_proposals()] == STARTERS


@pytest.mark.parametrize("gpus", [1, 2])
async def test_on_rtx_4090s_the_presets_those_gpus_start_with_their_placement(
    daemon_factory: DaemonFactory, fake_env: object, monkeypatch: pytest.MonkeyPatch, gpus: int
) -> None:
    lib = fake_pynvml(gpus)
    monkeypatch.setitem(sys.modules, "pynvml", lib)
    monkeypatch.setattr("engines.gpu.service.build_backend", lambda s: NVMLBackend(lib))
    d = await daemon_factory(settings())
    proposals = {p.name: p for p in await d.client.setup_proposals()}
    expected = ["llama-3.1-8b-1gpu"]
    if gpus == 2:  # a TP 2 preset needs two GPUs
        expected += ["llama-3.3-70b-awq-tp2", "qwen2.5-32b-awq-tp2"]
    assert sorted(proposals) == expected
    for name, proposal in proposals.items():  # the planner's answer, as `traylm load` gets it
        assert (proposal.kind, proposal.device) == ("preset", "cuda")
        assert proposal.placement == await d.client.placement(name)
    wide = proposals.get("llama-3.3-70b-awq-tp2")
    assert wide is None or wide.profile["tensor_parallel_size"] == 2
