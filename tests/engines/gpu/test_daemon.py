"""The GPU feature inside a real daemon: /api/gpus routes through DaemonClient, events, /metrics,
the in-process traylm-gpud on the simulator, the thermal guard acting on a (FAKE vLLM) engine,
energy per token from that engine's token counter, and read-only operation without a GPU or
without the helper."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from engines.config.sections import EnergySettings, GPUSettings, Settings, load_settings
from engines.core.procs import free_loopback_port
from engines.errors import ControlAPIError
from engines.events import (
    EngineState,
    GPUEnergyUpdated,
    GPUGuardAction,
    GPUSampled,
    GPUState,
    Notice,
)
from engines.gpu.nvml import NVMLBackend
from engines.gpu.service import GPUFeature
from engines.gpu.sim import SimulatedBackend, sim_uuid
from tests.conftest import RunningDaemon, fast_settings
from tests.engines.gateway.test_daemon_gateway import start_fake
from tests.fakes.fake_pynvml import UUID as NVML_UUID
from tests.fakes.fake_pynvml import fake_pynvml

GPU0, GPU1 = sim_uuid(0), sim_uuid(1)


def sim_settings(**gpu: Any) -> Settings:
    base = fast_settings(free_loopback_port())
    values = {"simulate_gpus": 2, "sample_interval_s": 0.2, "history_resolution_s": 1.0, **gpu}
    return dataclasses.replace(base, gpu=GPUSettings(**values), energy=EnergySettings(window_s=5.0))


def feature(d: RunningDaemon) -> GPUFeature:
    return d.daemon.gpu


async def until(check: Callable[[], Any], timeout_s: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


@pytest.fixture
async def sim_daemon(daemon_factory, fake_env, fake_cuda_env) -> RunningDaemon:  # type: ignore[no-untyped-def]
    d: RunningDaemon = await daemon_factory(sim_settings())
    await until(lambda: feature(d).sampler.latest and feature(d).helper_status().available)
    return d


async def test_overview_events_history_and_metrics(sim_daemon: RunningDaemon) -> None:
    c = sim_daemon.client
    o = await c.gpus()
    assert o.backend == "simulated" and o.simulated and o.state == GPUState.OK
    assert [e.info.uuid for e in o.gpus] == [GPU0, GPU1]
    assert all(e.info.simulated and e.snapshot and e.snapshot.simulated for e in o.gpus)
    assert o.helper.available and o.helper.simulated and "in-process" in o.helper.detail
    assert o.psu is not None and o.psu.psu_watts == 1600
    events = c.events(kinds=("gpu.sample",))
    event = await asyncio.wait_for(anext(events), 10)
    assert isinstance(event, GPUSampled) and event.simulated and len(event.gpus) == 2
    await events.aclose()
    await until(lambda: len(feature(sim_daemon).sampler.ring) >= 5)
    history = await c.gpu_history(seconds=60, points=100)
    assert [h.uuid for h in history] == [GPU0, GPU1]
    assert len(history[0].ts_s) >= 5 and history[0].temperature_c[-1] is not None
    assert history[0].simulated
    async with aiohttp.ClientSession() as http, http.get(sim_daemon.url + "/metrics") as r:
        text = await r.text()
    assert f'traylm_gpu_temperature_celsius{{gpu="0",simulated="true",uuid="{GPU0}"}}' in text
    assert "traylm_gpu_fan_speed_ratio" in text and "traylm_gpu_energy_joules_total" in text
    # downsampled rows land in SQLite (history_resolution_s = 1 here)
    await until(
        lambda: sim_daemon.daemon.store.query("SELECT COUNT(*) AS n FROM telemetry")[0]["n"] >= 2
    )


async def test_fan_curves_through_the_api(sim_daemon: RunningDaemon) -> None:
    c = sim_daemon.client
    presets = await c.gpu_presets()
    assert set(presets.fans) == {"quiet", "balanced", "performance", "full"}
    assert presets.power["efficient"].watts == 300 and presets.power["stock"].watts is None
    with pytest.raises(ControlAPIError) as err:
        await c.set_fan_curve("0", curve={"points": [[60, 40], [50, 50]]}, dry_run=True)
    assert err.value.http_status == 400 and err.value.code == "fan_curve_invalid"
    assert "temperatures must rise" in err.value.message
    with pytest.raises(ControlAPIError, match="fan floor of 30 %"):
        await c.set_fan_curve("0", curve={"points": [[40, 10], [80, 100]]})
    with pytest.raises(ControlAPIError) as err:
        await c.set_fan_curve("7", preset="quiet")
    assert err.value.http_status == 404 and "GPUs: 0" in err.value.message
    dry = await c.set_fan_curve("0", preset="quiet", dry_run=True)
    assert not dry.applied and dry.fans == (0, 1) and dry.preview[0] == (30.0, 0.0)
    assert all(ctl.mode == "auto" for ctl in (await c.fans("0")).controls)
    done = await c.set_fan_curve(GPU0, preset="full", fans=[1])
    assert done.applied and done.persist
    status = await c.fans("0")
    assert [(x.fan, x.mode) for x in status.controls] == [(0, "auto"), (1, "curve")]
    await until(lambda: feature(sim_daemon).sampler.latest[0].fans[1].manual)
    await until(lambda: (feature(sim_daemon).sampler.latest[0].fans[1].speed_pct or 0) > 50)
    assert await c.restore_fans("all") == [GPU0, GPU1]
    assert {x.mode for x in (await c.fans("0")).controls} == {"auto"}
    await until(lambda: not feature(sim_daemon).sampler.latest[0].fans[1].manual)


async def test_power_limits_through_the_api(sim_daemon: RunningDaemon) -> None:
    c = sim_daemon.client
    with pytest.raises(ControlAPIError) as err:
        await c.set_power_limit("1", watts=100)
    assert err.value.code == "power_limit_invalid" and "150-600 W" in err.value.message
    with pytest.raises(ControlAPIError, match="presets: balanced, efficient, stock"):
        await c.set_power_limit("1", preset="eco")
    dry = await c.set_power_limit("1", preset="efficient", dry_run=True)
    assert dry.requested_mw == 300_000 and not dry.applied
    done = await c.set_power_limit("1", preset="efficient")
    assert done.applied
    await until(lambda: feature(sim_daemon).sampler.latest[1].power_limit_mw == 300_000)
    assert (await c.power_limit("1")).controlled_by == "user"
    assert await c.reset_power_limit("1") == [GPU1]
    await until(lambda: feature(sim_daemon).sampler.latest[1].power_limit_mw == 450_000)


async def test_efficiency_profile_through_the_api(sim_daemon: RunningDaemon) -> None:
    c = sim_daemon.client
    with pytest.raises(
        ControlAPIError, match="no efficiency profile .turbo.; profiles: quiet, eco, max"
    ):
        await c.set_efficiency_profile("turbo")
    assert len(await c.set_efficiency_profile("eco")) == 2
    await until(lambda: feature(sim_daemon).sampler.latest[1].power_limit_mw == 337_500)
    overview = await c.gpus()
    assert overview.profile == "eco"
    assert {(k.domain, k.max_mhz) for k in overview.helper.clocks} == {("sm", 1890)}
    assert len(await c.set_efficiency_profile("max")) == 2
    await until(lambda: feature(sim_daemon).sampler.latest[1].power_limit_mw == 450_000)
    assert (await c.gpus()).helper.clocks == ()


async def test_efficiency_profiles_listed_with_the_one_in_force_per_gpu(
    sim_daemon: RunningDaemon,
) -> None:
    c = sim_daemon.client
    folder = sim_daemon.paths.config_dir / "efficiency"
    folder.mkdir(parents=True)
    (folder / "night.toml").write_text('description = "night"\npower_pct = 70\n')
    (folder / "far.toml").write_text("[gpus.5]\npower_w = 300\n")  # a GPU that is gone
    (folder / "typo.toml").write_text("power_pct = 70\nfanz = 'quiet'\n")
    listed = await c.efficiency_profiles()
    assert [p.name for p in listed.profiles] == ["quiet", "eco", "max", "far", "night"]
    assert listed.profiles[1].description.startswith("75 % power") and listed.profiles[1].builtin
    assert listed.in_force == {} and listed.simulated
    # a broken file is said, and leaves the other profiles usable
    assert len(listed.problems) == 1 and "typo.toml: unknown field(s) fanz" in listed.problems[0]
    with pytest.raises(ControlAPIError, match="'typo' cannot be used: .*unknown field"):
        await c.set_efficiency_profile("typo")
    await c.set_efficiency_profile("eco")
    assert (await c.efficiency_profiles()).in_force == {GPU0: "eco", GPU1: "eco"}
    # a profile naming a GPU that is gone is refused before anything is written
    with pytest.raises(ControlAPIError, match="names GPU '5', which is not here"):
        await c.set_efficiency_profile("far")
    assert (await c.efficiency_profiles()).in_force == {GPU0: "eco", GPU1: "eco"}
    await until(lambda: feature(sim_daemon).sampler.latest[1].power_limit_mw == 337_500)
    # a control changed by hand: the profile no longer holds on that GPU
    await c.set_power_limit(GPU0, watts=300)
    assert (await c.efficiency_profiles()).in_force == {GPU1: "eco"}
    assert (await c.gpus()).profile is None


async def test_guard_thresholds_get_and_put(sim_daemon: RunningDaemon) -> None:
    c = sim_daemon.client
    g = await c.guard()
    assert g.enabled and g.thresholds["guard_stop_margin_c"] == 2.0
    with pytest.raises(ControlAPIError, match="must not exceed guard_power_margin_c"):
        await c.set_guard({"guard_pause_margin_c": 9})
    with pytest.raises(ControlAPIError, match="unknown fields guard_magic"):
        await c.set_guard({"guard_magic": 1})
    dry = await c.set_guard({"guard_step_s": 2}, dry_run=True)
    assert dry.thresholds["guard_step_s"] == 2.0
    assert sim_daemon.daemon.settings.gpu.guard_step_s == 10.0
    await c.set_guard({"guard_step_s": 3, "guard_power_pct": 80})
    assert sim_daemon.daemon.settings.gpu.guard_step_s == 3.0
    saved = load_settings(sim_daemon.paths.config_file)
    assert saved.gpu.guard_power_pct == 80.0


async def test_guard_lowers_power_then_pauses_then_stops_the_engine(
    daemon_factory,  # type: ignore[no-untyped-def]
    fake_cuda_env,  # type: ignore[no-untyped-def]
) -> None:
    d: RunningDaemon = await daemon_factory(sim_settings(guard_step_s=0.5))
    f = feature(d)
    await until(lambda: f.sampler.latest and f.helper_status().available)
    await start_fake(d, "hot", gpus=[0], device="cuda")
    sim = f.backend
    assert isinstance(sim, SimulatedBackend)
    actions: list[GPUGuardAction] = []
    notices: list[Notice] = []
    with d.daemon.bus.subscribe(frozenset({"gpu.guard", "notice"})) as sub:
        sim.inject(GPU0, force_temperature_c=95)  # a cooling failure: the sensor reads 95 °C
        while not actions or actions[-1].action != "stop_engine":
            event = await asyncio.wait_for(sub.get(), 20)
            if isinstance(event, Notice):
                notices.append(event)
                continue
            assert isinstance(event, GPUGuardAction)
            actions.append(event)
            if event.action == "lower_power":
                assert sim.control_state()[GPU0]["power_limit_mw"] == 315_000  # 70 % of 450 W
                assert sim.control_state()[GPU1]["power_limit_mw"] == 450_000
            if event.action == "pause":
                async with (
                    aiohttp.ClientSession() as http,
                    http.post(d.url + "/v1/chat/completions", json={"model": "hot"}) as r,
                ):
                    body = await r.json()
                    assert r.status == 503 and r.headers["Retry-After"] == "30"
                    assert "thermal guard" in body["error"]["message"]
        assert [a.action for a in actions] == ["notice", "lower_power", "pause", "stop_engine"]
        assert all(a.ok and a.simulated and a.uuid == GPU0 for a in actions)
        assert "stopped engine(s) hot on GPU 0" in actions[-1].detail
        assert (await d.client.engines())[0].state == EngineState.STOPPED
        assert any(n.source == "gpu.guard" and "lowered to 315 W" in n.message for n in notices)
        guard = await d.client.guard()
        assert [a.action for a in guard.actions] == [a.action for a in actions]
        sim.inject(GPU0, force_temperature_c=None)  # the real (simulated) reading: ~31 °C
        while True:
            event = await asyncio.wait_for(sub.get(), 20)
            if isinstance(event, GPUGuardAction):
                break
    assert event.action == "stand_down" and event.ok
    assert "accepts requests again" in event.detail and "power limit is back" in event.detail
    assert d.daemon.ctx is not None and d.daemon.ctx.pause is None
    assert sim.control_state()[GPU0]["power_limit_mw"] == 450_000


@pytest.mark.slow
async def test_energy_per_token_of_a_running_engine(daemon_factory, fake_cuda_env) -> None:  # type: ignore[no-untyped-def]
    d: RunningDaemon = await daemon_factory(sim_settings())
    f = feature(d)
    await until(lambda: f.sampler.latest)
    await start_fake(d, "gen", gpus=[0, 1], device="cuda")
    stop = asyncio.Event()

    async def load() -> None:
        async with aiohttp.ClientSession() as http:
            while not stop.is_set():
                body = {"model": "gen", "messages": [], "max_tokens": 40}
                async with http.post(d.url + "/v1/chat/completions", json=body) as r:
                    assert r.status == 200
                await asyncio.sleep(0.05)

    loader = asyncio.create_task(load())
    try:
        with d.daemon.bus.subscribe(frozenset({"gpu.energy"})) as sub:
            while True:
                event = await asyncio.wait_for(sub.get(), 30)
                assert isinstance(event, GPUEnergyUpdated)
                if event.energy.tokens > 0:
                    break
    finally:
        stop.set()
        await loader
    e = event.energy
    assert e.engine_id == "gen" and e.gpus == (GPU0, GPU1) and e.simulated
    assert e.window_s >= 5.0
    assert e.joules_per_token == pytest.approx(e.energy_j / e.tokens)
    # two simulated cards: at least their 2 x 22 W idle, more while traffic makes them work
    assert e.power_w >= 44.0 * 0.85
    assert e.power_w == pytest.approx(e.energy_j / e.window_s, rel=0.05)
    assert e.cost_per_mtok == pytest.approx(e.joules_per_token / 3.6 * 0.30)
    overview = await d.client.gpus()
    assert [x.engine_id for x in overview.energy] == ["gen"]
    snap = f.sampler.latest[0]
    processes = snap.processes or ()
    assert any(p.engine_id == "gen" for p in processes)  # the engine's pid is labelled


async def test_no_gpu_here_keeps_everything_working_read_only(daemon: RunningDaemon) -> None:
    """This machine has no NVIDIA driver: the real NVMLBackend says so, with the fix."""
    f = feature(daemon)
    assert isinstance(f.backend, NVMLBackend)
    await until(lambda: f.sampler.state == GPUState.UNAVAILABLE and f.sampler.message != "starting")
    overview = await daemon.client.gpus()
    assert overview.state == GPUState.UNAVAILABLE and not overview.simulated
    assert "no NVIDIA GPU found" in overview.message and "--simulate-gpus" in overview.message
    assert not overview.helper.available and "install-gpud.sh" in overview.helper.install_hint
    with pytest.raises(ControlAPIError) as err:
        await daemon.client.set_power_limit("0", watts=300)
    assert err.value.code == "gpu_unavailable" and "no NVIDIA GPU found" in err.value.message
    assert (await daemon.client.status())["version"]  # the rest of the daemon is fine


async def test_gpus_without_the_helper_are_read_only(
    daemon_factory,  # type: ignore[no-untyped-def]
    fake_env,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
    tmp_path,  # type: ignore[no-untyped-def]
) -> None:
    """Real NVMLBackend code (on the FAKE autospecced pynvml) and no traylm-gpud installed."""
    lib = fake_pynvml()
    monkeypatch.setattr("engines.gpu.service.build_backend", lambda s: NVMLBackend(lib))
    settings = dataclasses.replace(
        fast_settings(free_loopback_port()),
        gpu=GPUSettings(sample_interval_s=0.2, helper_socket=str(tmp_path / "none.sock")),
    )
    d: RunningDaemon = await daemon_factory(settings)
    f = feature(d)
    await until(lambda: f.sampler.latest and f.helper_status().detail != "not checked yet")
    o = await d.client.gpus()
    assert o.state == GPUState.OK and not o.simulated and o.gpus[0].info.uuid == NVML_UUID
    assert not o.helper.available and "traylm-gpud is not running" in o.helper.detail
    dry = await d.client.set_fan_curve("0", preset="quiet", dry_run=True)
    assert not dry.applied  # validation works without the helper
    with pytest.raises(ControlAPIError) as err:
        await d.client.set_fan_curve("0", preset="quiet")
    assert err.value.http_status == 409 and err.value.code == "helper_unavailable"
    assert "install-gpud.sh" in err.value.message
    lib.nvmlDeviceSetFanSpeed_v2.assert_not_called()


@pytest.mark.slow
async def test_cli_against_the_daemon_and_without_one(sim_daemon: RunningDaemon, tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def traylm(*args: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            "from engines.cli import main; main()",
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        return proc.returncode or 0, out.decode()

    code, out = await traylm("gpus")
    assert code == 0 and "[SIMULATED]" in out and "in-process" in out
    code, out = await traylm("fans", "set", "quiet", "--gpu", "1", "--dry-run")
    assert code == 0 and "would apply quiet on fans [0, 1]" in out
    code, out = await traylm("power", "set", "90")
    assert code == 1 and "90 W is outside what GPU 0" in out
    code, out = await traylm("power", "profile")
    assert code == 0 and "efficiency profiles [SIMULATED GPUs]:" in out
    assert "  eco    75 % power" in out and "none in force" in out
    await sim_daemon.client.set_efficiency_profile("quiet")
    code, out = await traylm("power", "profile")
    assert code == 0 and "cool and silent, slower prefill  [in force on GPU 0, 1]" in out
    code, out = await traylm("guard")
    assert code == 0 and "guard_stop_margin_c = 2" in out
    trace = tmp_path / "t.jsonl"
    code, out = await traylm(
        "gpus", "record", str(trace), "--simulate", "2", "--seconds", "1", "--interval", "0.5"
    )
    assert code == 0 and "wrote 2 samples" in out
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    assert [x["kind"] for x in lines] == ["header", "sample", "sample"] and lines[0]["simulated"]


@pytest.mark.slow
async def test_simulated_load_follows_gateway_traffic(sim_daemon: RunningDaemon) -> None:
    """With --simulate-gpus the GPUs an engine runs on get busy while it serves requests (so a
    demo looks alive); a load set by hand is left alone."""
    f = feature(sim_daemon)
    assert isinstance(f.backend, SimulatedBackend)
    await start_fake(sim_daemon, args="--token-delay 0.05", gpus=[0], device="cuda")
    f.backend.set_load(GPU1, 0.5)  # by hand: traffic never overrides it

    async def gpu(uuid: str) -> Any:
        return next(
            e.snapshot for e in (await sim_daemon.client.gpus()).gpus if e.info.uuid == uuid
        )

    async with aiohttp.ClientSession() as http:
        body = {"model": "fake", "messages": [], "max_tokens": 400, "stream": True}
        streams = [
            await http.post(sim_daemon.url + "/v1/chat/completions", json=body) for _ in range(4)
        ]
        try:
            deadline = time.monotonic() + 20
            while (snap := await gpu(GPU0)).utilization_gpu_pct < 80:
                assert time.monotonic() < deadline, snap
                await asyncio.sleep(0.2)
            assert snap.memory_used_bytes > 20 << 30  # the engine holds its memory
        finally:
            for resp in streams:
                resp.close()
    deadline = time.monotonic() + 20
    while (await gpu(GPU0)).utilization_gpu_pct > 10:  # idle engine again
        assert time.monotonic() < deadline
        await asyncio.sleep(0.2)
    assert (await gpu(GPU1)).utilization_gpu_pct == 50


async def test_print_command_of_a_tp2_preset_on_simulated_4090s(sim_daemon: RunningDaemon) -> None:
    """`traylm start PRESET --print-command` on two simulated RTX 4090s: the command line and
    the environment a start would run (NCCL P2P off, custom all-reduce off, the CUDA devices),
    and nothing starts."""
    from tests.traylm_cli import traylm

    code, out = await traylm("start", "qwen2.5-32b-awq-tp2", "--print-command")
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].startswith("# qwen2.5-32b-awq-tp2: vllm ") and "(cuda)" in lines[0]
    assert "NCCL_P2P_DISABLE=1 \\" in lines
    assert "CUDA_VISIBLE_DEVICES=0,1 \\" in lines
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID \\" in lines
    command = lines[-1]
    assert "--tensor-parallel-size 2" in command
    assert "--disable-custom-all-reduce" in command
    assert "--gpu-memory-utilization 0.9" in command
    assert await sim_daemon.client.engines() == []  # nothing was started
