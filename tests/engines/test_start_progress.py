"""A start says how far it has got: the port and pid as soon as the process exists, then each
stage the engine logs (the FAKE engine prints real vLLM start lines), as ``engine.state``
events, in ``traylm status``, and line by line in ``traylm start --wait``."""

from __future__ import annotations

import asyncio
import shlex

from engines.events import EngineState, EngineStateChanged
from tests.conftest import RunningDaemon
from tests.traylm_cli import traylm

VLLM_LINES = (
    "(Worker pid=7088) INFO 12-01 09:31:56 [cpu_model_runner.py:68] Starting to load model /m...",
    "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01, 1.0it/s]",
    "Loading safetensors checkpoint shards: 100% Completed | 2/2 [00:02<00:00, 1.0it/s]",
    "(Worker pid=7088) INFO 12-01 09:31:57 [cpu_model_runner.py:87] Warming up model for the "
    "compilation...",
)


def _profile(d: RunningDaemon, name: str = "fake", delay_s: float = 1.5) -> None:
    prints = " ".join(f"--print {shlex.quote(line)}" for line in VLLM_LINES)
    d.write_profile(
        name, model="org/" + name, served_name=name, device="cpu",
        env={"FAKE_ENGINE_ARGS": f"{prints} --startup-delay {delay_s}"},
    )  # fmt: skip


async def test_the_port_pid_and_each_stage_are_published_while_it_starts(
    daemon: RunningDaemon,
) -> None:
    _profile(daemon)
    seen: list[EngineStateChanged] = []
    with daemon.daemon.bus.subscribe(frozenset({"engine.state"})) as sub:
        await daemon.client.start("fake")
        while True:
            event = await asyncio.wait_for(sub.get(), 30)
            assert isinstance(event, EngineStateChanged)
            seen.append(event)
            if event.state in (EngineState.READY, EngineState.FAILED):
                break
    assert seen[-1].state == EngineState.READY
    starting = [e for e in seen if e.state == EngineState.STARTING]
    assert starting[0].pid is None  # "launching": no process yet
    with_pid = [e for e in starting if e.pid is not None]
    assert with_pid and with_pid[0].port == seen[-1].port  # published before it was ready
    assert [e.detail for e in starting if "weights" in e.detail or "model" in e.detail] == [
        "loading the model",
        "loading weights (1 of 2 shards)",
        "loading weights (2 of 2 shards)",
        "compiling and warming up the model",
    ]


async def test_start_wait_prints_each_stage_with_the_time(daemon: RunningDaemon) -> None:
    _profile(daemon)
    code, text = await traylm("start", "fake", "--wait", "--timeout", "60")
    assert code == 0, text
    lines = text.splitlines()
    assert lines[0] == "fake: starting (serves fake)"
    stages = [line.split("] ", 1)[1] for line in lines if line.startswith("[")]
    assert "compiling and warming up the model" in stages
    assert stages.index("loading the model") < stages.index("compiling and warming up the model")
    assert all(line[1:7].strip().replace(".", "").isdigit() for line in lines if line[:1] == "[")
    assert "ready: point apps at" in text


async def test_a_failed_start_is_gone_from_status_after_stop(daemon: RunningDaemon) -> None:
    daemon.write_profile(
        "broken", model="org/broken", served_name="broken", device="cpu",
        env={"FAKE_ENGINE_ARGS": "--print 'ValueError: no' --exit-after-print 1"},
    )  # fmt: skip
    await daemon.client.start("broken")
    failed = await daemon.client.wait_for_engine("broken", (EngineState.FAILED,), 20)
    assert "ValueError: no" in failed.detail
    with daemon.daemon.bus.subscribe(frozenset({"engine.state"})) as sub:
        code, out = await traylm("stop", "broken")
        assert code == 0 and "broken: stopped" in out
        event = await asyncio.wait_for(sub.get(), 10)  # what apps showing it hear
    assert isinstance(event, EngineStateChanged)
    assert (event.state, event.previous) == (EngineState.STOPPED, EngineState.FAILED)
    assert [e.engine_id for e in await daemon.client.engines()] == []
    code, text = await traylm("status")
    assert code == 0 and "broken" not in text


async def test_a_hub_model_not_downloaded_without_network_is_refused_at_once(
    daemon: RunningDaemon, monkeypatch, tmp_path
) -> None:
    from engines.procs import free_loopback_port
    from tests.fakes.fake_trt_env import make_tiny_hf_model

    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_loopback_port()}")  # no network
    daemon.write_profile("qwen", model="Qwen/Qwen2.5-0.5B-Instruct", device="cpu")
    code, out = await traylm("start", "qwen", "--wait")
    assert code == 1
    assert "Qwen/Qwen2.5-0.5B-Instruct (profile 'qwen') is not downloaded and the Hugging " in out
    assert "`traylm models pull Qwen/Qwen2.5-0.5B-Instruct`" in out
    assert "`traylm models add PATH`" in out
    assert await daemon.client.engines() == []  # nothing was launched to fail a minute later
    # a model folder on this computer needs no network
    folder = make_tiny_hf_model(tmp_path / "tiny")
    daemon.write_profile(
        "local", model=str(folder), served_name="local", device="cpu", env={"FAKE_ENGINE_ARGS": ""}
    )
    code, out = await traylm("start", "local", "--wait", "--timeout", "60")
    assert code == 0, out
