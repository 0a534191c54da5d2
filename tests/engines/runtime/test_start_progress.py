"""A start says how far it has got: the port and pid as soon as the process exists (an
``engine.state`` event), then each phase the engine logs (the FAKE engine prints real vLLM start
lines) as ``engine.phase`` events and in ``traylm status``; `traylm start --wait` is tested in
test_start_phases.py. A failed start goes away on stop; a start that cannot succeed offline is
refused at once."""

from __future__ import annotations

import asyncio

from engines.events import EngineStartPhase, EngineState, EngineStateChanged
from engines.events.codec import Event
from engines.runtime.adapters.vllm_start import PHASES
from tests.conftest import RunningDaemon
from tests.traylm_cli import traylm


async def test_the_port_pid_and_each_phase_are_published_while_it_starts(
    daemon: RunningDaemon,
) -> None:
    daemon.write_profile(
        "fake", model="org/fake", served_name="fake", device="cpu",
        env={"FAKE_ENGINE_ARGS": "--startup-delay 1.5"},
    )  # fmt: skip
    seen: list[Event] = []
    with daemon.daemon.bus.subscribe(frozenset({"engine.state", "engine.phase"})) as sub:
        await daemon.client.start("fake")
        while True:
            event = await asyncio.wait_for(sub.get(), 30)
            seen.append(event)
            if isinstance(event, EngineStateChanged) and event.state in (
                EngineState.READY,
                EngineState.FAILED,
            ):
                break
    changes = [e for e in seen if isinstance(e, EngineStateChanged)]
    assert changes[-1].state == EngineState.READY
    starting = [e for e in changes if e.state == EngineState.STARTING]
    assert starting[0].pid is None  # "launching": no process yet
    with_pid = [e for e in starting if e.pid is not None]
    assert with_pid and with_pid[0].port == changes[-1].port  # published before it was ready
    phases = [e for e in seen if isinstance(e, EngineStartPhase)]
    labels = [e.label for e in phases]
    assert labels.index("loading weights") < labels.index("compiling the model")
    assert phases[-1].phase == "ready"
    assert seen.index(with_pid[0]) < seen.index(phases[-1])  # the pid came long before ready


async def test_status_names_the_phase_while_it_starts(daemon: RunningDaemon) -> None:
    daemon.write_profile(
        "slow", model="org/slow", served_name="slow", device="cpu",
        env={"FAKE_ENGINE_ARGS": "--startup-delay 30"},
    )  # fmt: skip
    with daemon.daemon.bus.subscribe(frozenset({"engine.phase"})) as sub:
        await daemon.client.start("slow")
        while (await asyncio.wait_for(sub.get(), 30)).phase != "config":
            pass
    code, text = await traylm("status")
    assert code == 0, text
    labels = [r.label for r in PHASES if r.phase not in ("import", "ready")]
    assert "slow" in text and any(f"      {label} (" in text for label in labels), text
    await daemon.client.stop("slow")


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
    from engines.core.procs import free_loopback_port
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
