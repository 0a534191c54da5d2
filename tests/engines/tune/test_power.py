"""The GPU power limit as a tuner candidate, on SIMULATED GPUs (no GPU here) with FAKE CUDA
engines: the limit is set on the candidate's GPUs only while it is measured, in traylm-gpud's
``tune`` layer, and what the user had before (here a persisted limit) is back after each run, at
the end, on cancel mid-measurement and when the daemon's connection to the helper goes away."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from engines.errors import ControlAPIError
from engines.events import EngineState, TuneConfig, TuneFinished, TuneProgress, TuneState
from engines.gpu.helper_core import HelperCore
from engines.gpu.sim import ManualClock, SimulatedBackend, sim_uuid
from tests.conftest import RunningDaemon
from tests.engines.gpu.test_daemon import feature, sim_settings
from tests.engines.tune.test_daemon import TOKEN_S, nothing_of_the_tune_left, tune_to_end
from tests.fakes.fake_vllm_env import make_fake_vllm_env

GPU0, GPU1 = sim_uuid(0), sim_uuid(1)
USERS_MW = 400_000  # the user's own persisted limit on GPU 0


def test_the_tuners_layer_is_over_the_users_under_the_guards_and_goes_with_its_client(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    sim = SimulatedBackend(2, clock=clock, wall=clock)
    core = HelperCore(sim, tmp_path / "gpud", clock=clock)
    core.start()
    core.apply_power(GPU0, USERS_MW, persist=True)
    core.apply_power(GPU0, 315_000, persist=False, source="tune", owner=5)
    assert sim.control_state()[GPU0]["power_limit_mw"] == 315_000
    assert core.status()["power"][0]["source"] == "tune"
    core.apply_power(GPU0, 250_000, persist=False, source="guard", owner=5)
    core.restore_power(GPU0, "guard")
    assert sim.control_state()[GPU0]["power_limit_mw"] == 315_000
    core.restore_power(GPU0, "tune")  # the user's persisted limit, not the default
    assert sim.control_state()[GPU0]["power_limit_mw"] == USERS_MW
    core.apply_power(GPU0, 315_000, persist=False, source="tune", owner=5)
    assert core.release(5) == 1  # the daemon died mid-tune
    assert sim.control_state()[GPU0]["power_limit_mw"] == USERS_MW


async def power_daemon(daemon_factory: Any) -> RunningDaemon:
    """Two simulated GPUs at full load (so a cap bites), GPU 0 at the user's persisted limit,
    and a FAKE CUDA vLLM profile ``chat`` running."""
    d: RunningDaemon = await daemon_factory(sim_settings())
    make_fake_vllm_env(d.paths.envs_dir, device="cuda")
    d.write_profile("chat", model="org/chat", served_name="chat", device="cuda", gpus=[0],
                    env={"FAKE_ENGINE_ARGS": f"--token-delay {TOKEN_S}"})  # fmt: skip
    sim = feature(d).backend
    for uuid in (GPU0, GPU1):
        sim.set_load(uuid, 1.0)  # type: ignore[attr-defined]
    await d.client.set_power_limit("0", watts=USERS_MW / 1000, persist=True)
    await d.client.start("chat")
    status = await d.client.wait_for_engine("chat", (EngineState.READY, EngineState.FAILED), 60)
    assert status.state == EngineState.READY, status.detail
    return d


def limits(d: RunningDaemon) -> tuple[int, int]:
    state = feature(d).backend.control_state()  # type: ignore[attr-defined]
    return state[GPU0]["power_limit_mw"], state[GPU1]["power_limit_mw"]


async def run_watching(d: RunningDaemon, config: TuneConfig, *, cancel: str = "") -> set[Any]:
    """Run a tune to its end; the GPU limits seen while each candidate was measured, as
    (candidate, GPU 0 mW, GPU 1 mW). ``cancel``: cancel at that candidate's measurement."""
    seen: set[Any] = set()
    measuring = ""

    async def watch() -> None:
        while True:
            engine = d.daemon.supervisor.get("tune-chat")
            if measuring and engine is not None and engine.state == EngineState.READY:
                seen.add((measuring, *limits(d)))
            await asyncio.sleep(0.05)  # sampling the simulated driver's state

    watcher = asyncio.create_task(watch())
    try:
        with d.daemon.bus.subscribe(frozenset({"tune"})) as sub:
            job = await d.client.tune_start(config)
            while True:
                event = await asyncio.wait_for(sub.get(), 120)
                if isinstance(event, TuneProgress):
                    measuring = event.candidate if event.phase == "measure" else ""
                    if cancel and measuring == cancel:
                        await asyncio.sleep(0.3)  # measured a while under the limit
                        assert (await d.client.tune_cancel()).state == TuneState.CANCELLED
                if isinstance(event, TuneFinished) and event.job_id == job.id:
                    break
    finally:
        watcher.cancel()
    return seen


@pytest.mark.slow
async def test_a_power_candidate_caps_its_gpu_while_measured_and_lowers_joules_per_token(
    daemon_factory: Any, fake_env: Path
) -> None:
    d = await power_daemon(daemon_factory)
    profile = (d.paths.profiles_dir / "chat.toml").read_bytes()
    config = TuneConfig(model="chat", concurrency=2, requests=8, only=("power-70",),
                        goal="efficiency", budget_s=600, apply=True)  # fmt: skip
    seen = await run_watching(d, config)
    job = await d.client.tune_current()
    assert job is not None and job.state == TuneState.DONE, job
    # 70 % of the 450 W default on GPU 0 (the profile's), GPU 1 untouched; the user's 400 W
    # while the profile as it is ran
    assert seen == {("default", USERS_MW, 450_000), ("power-70", 315_000, 450_000)}, seen
    rows = {r.key: r for r in job.rows}
    assert job.simulated
    assert rows["power-70"].verdict == "better", rows  # fewer J/token, outside the band
    assert rows["power-70"].ratios["joules_per_token"] < 1
    assert "GPU power limit 70 % of the default" in rows["power-70"].changes
    await nothing_of_the_tune_left(d, {"chat"})
    # applied: the card's persisted limit (no profile holds one), the profile file untouched
    assert job.recommended == "power-70" and job.applied, job.detail
    assert "--apply makes it the GPUs' persisted limit" in job.recommendation
    assert "persisted power limit is now 70 %" in job.detail
    assert limits(d) == (315_000, 450_000)
    assert (await d.client.power_limit("0")).controlled_by == "user"
    assert (d.paths.profiles_dir / "chat.toml").read_bytes() == profile
    detail = await d.client.tune_undo("chat")
    assert f"{GPU0} to 400 W" in detail, detail
    assert limits(d) == (USERS_MW, 450_000)
    with pytest.raises(ControlAPIError, match="nothing to undo"):
        await d.client.tune_undo("chat")


@pytest.mark.slow
async def test_cancel_while_a_power_candidate_is_measured_restores_the_users_limit(
    daemon_factory: Any, fake_env: Path
) -> None:
    d = await power_daemon(daemon_factory)
    config = TuneConfig(model="chat", concurrency=2, requests=40, only=("power-85",),
                        budget_s=600)  # fmt: skip
    seen = await run_watching(d, config, cancel="power-85")
    assert ("power-85", 382_500, 450_000) in seen
    job = await d.client.tune_current()
    assert job is not None and job.state == TuneState.CANCELLED
    assert limits(d) == (USERS_MW, 450_000)
    await nothing_of_the_tune_left(d, {"chat"})


@pytest.mark.slow
async def test_the_daemon_stopping_mid_measurement_lifts_the_limit(
    daemon_factory: Any, fake_env: Path
) -> None:
    d = await power_daemon(daemon_factory)
    config = TuneConfig(model="chat", concurrency=2, requests=40, only=("power-70",),
                        budget_s=600)  # fmt: skip
    with d.daemon.bus.subscribe(frozenset({"tune"})) as sub:
        await d.client.tune_start(config)
        while True:
            event = await asyncio.wait_for(sub.get(), 120)
            measuring = isinstance(event, TuneProgress) and event.phase == "measure"
            if measuring and event.candidate == "power-70":
                break
    assert limits(d)[0] == 315_000
    await d.daemon.tune.stop()  # the daemon's stop: the tune feature goes first
    assert limits(d) == (USERS_MW, 450_000)


@pytest.mark.slow
async def test_without_traylm_gpud_the_power_candidates_are_dropped_saying_why(
    daemon_factory: Any, fake_env: Path
) -> None:
    d = await power_daemon(daemon_factory)
    gpu = feature(d)
    assert gpu.local_helper is not None and gpu.helper is not None
    await gpu.local_helper.stop()  # as if traylm-gpud were not installed
    assert not (await gpu.helper.refresh()).available
    with pytest.raises(ControlAPIError, match=r"power limit 70 %: setting a power limit needs "):
        await d.client.tune_start(TuneConfig(model="chat", only=("power-70",), budget_s=600))
    config = TuneConfig(model="chat", concurrency=2, requests=4, budget_s=600)
    job = await tune_to_end(d, config, cancel_at="measure")
    assert any(x.startswith("power limit 85 %: setting a power limit needs traylm-gpud")
               for x in job.dropped), job.dropped  # fmt: skip
    await nothing_of_the_tune_left(d, {"chat"})
