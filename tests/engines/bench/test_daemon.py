"""`traylm bench` through the real daemon: the bench worker process streams from the FAKE vLLM
engine (known first-token and per-token delays, so TTFT/TPOT/ITL are checkable) while the daemon
runs on two SIMULATED GPUs (`--simulate-gpus 2`: no GPU on this machine), results land in SQLite,
progress arrives as events, a run can be cancelled, reports and comparisons come out."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest

from engines.bench.cli import CANCEL_ANSWER_S
from engines.bench.compare import cell
from engines.core.procs import free_loopback_port
from engines.errors import ControlAPIError
from engines.events import (
    BenchConfig,
    BenchFinished,
    BenchProgress,
    BenchRun,
    BenchState,
    EngineState,
    Event,
    to_plain,
)
from engines.gpu.sim import SimulatedBackend, sim_uuid
from tests.conftest import RunningDaemon
from tests.engines.gateway.test_daemon_gateway import start_fake
from tests.engines.gpu.test_daemon import feature, sim_settings

pytestmark = pytest.mark.slow
FIRST_TOKEN_S, TOKEN_S = 0.2, 0.02
IDLE_W, FULL_W = 22.0, 450.0


@pytest.fixture
async def sim_daemon(daemon_factory: Any, fake_env: Path) -> RunningDaemon:
    d: RunningDaemon = await daemon_factory(sim_settings())
    return d


async def run_to_end(
    d: RunningDaemon, config: BenchConfig, *, during: Callable[[Event], Any] | None = None
) -> tuple[BenchRun, list[Event]]:
    """Start a run, collect its events until BenchFinished, return the stored run."""
    seen: list[Event] = []
    with d.daemon.bus.subscribe(frozenset({"bench"})) as sub:
        run = await d.client.bench_start(config)
        while True:
            event = await asyncio.wait_for(sub.get(), 60)
            seen.append(event)
            if during is not None:
                await during(event)
            if isinstance(event, BenchFinished) and event.summary.id == run.id:
                break
    return await d.client.bench_run(run.id), seen


async def test_run_through_the_gateway_figures_telemetry_and_storage(
    sim_daemon: RunningDaemon,
) -> None:
    d = sim_daemon
    await start_fake(d, args=f"--first-token-delay {FIRST_TOKEN_S} --token-delay {TOKEN_S}")
    backend = feature(d).backend
    assert isinstance(backend, SimulatedBackend)
    for i in (0, 1):
        backend.set_load(sim_uuid(i), 0.5)  # 22 + 0.5 × 428 = 236 W each
    config = BenchConfig(
        model="fake", concurrency=(1, 4), requests=8, output_len=10, input_len=32, name="first"
    )
    run, events = await run_to_end(d, config)

    assert run.state == BenchState.DONE, run.detail
    assert run.target == f"http://127.0.0.1:{d.port}/v1"
    assert run.engine["engine_id"] == "fake" and run.engine["engine"] == "vllm"
    assert run.prompt_source == "tokenize"  # the fake serves /tokenize, as vLLM does
    assert "AIPerf" in run.definitions
    one, four = run.levels
    for level in (one, four):
        assert (level.completed, level.failed) == (8, 0)
        assert level.output_tokens == 80 and level.output_tokens_source == "usage"
        assert level.input_tokens == 24 and level.input_tokens_source == "usage"  # fake says 3
        assert level.output_throughput_tps == pytest.approx(80 / level.duration_s)
        assert level.total_throughput_tps == pytest.approx(104 / level.duration_s)
        assert level.request_throughput_rps == pytest.approx(8 / level.duration_s)
        assert len(level.requests_detail) == 8
    # the fake waits 0.2 s before the first token, then 0.02 s between tokens
    assert 0.18 <= one.ttft.percentiles_s["50"] <= 0.35
    assert 0.018 <= one.tpot.percentiles_s["50"] <= 0.04
    assert 0.018 <= one.itl.percentiles_s["50"] <= 0.04
    assert one.itl.count == 8 * 9  # 10 chunks a request: 9 gaps each, pooled
    assert 0.36 <= one.e2el.percentiles_s["50"] <= 0.6
    assert one.max_concurrency_seen == 1 and four.max_concurrency_seen == 4
    assert one.duration_s >= 8 * (FIRST_TOKEN_S + 9 * TOKEN_S)  # one at a time
    assert four.duration_s < one.duration_s / 2

    t = one.telemetry
    assert t.available and t.simulated and "SIMULATED" in t.detail and t.samples >= 3
    assert t.energy_source == "counter" and len(t.gpus) == 2
    assert t.power_mean_w == pytest.approx(2 * (IDLE_W + 0.5 * (FULL_W - IDLE_W)), rel=0.05)
    assert t.energy_j == pytest.approx(t.power_mean_w * t.window_s, rel=1e-6)
    assert t.joules_per_token == pytest.approx(t.energy_j / 80)
    assert t.window_s == pytest.approx(one.duration_s, abs=0.05)
    assert t.temperature_peak_c is not None and t.memory_used_peak_bytes is not None

    phases = [e.phase for e in events if isinstance(e, BenchProgress)]
    assert {"prepare", "warmup", "measure", "telemetry"} <= set(phases)
    assert all(e.run_id == run.id for e in events if isinstance(e, BenchProgress))
    finished = events[-1]
    assert isinstance(finished, BenchFinished) and finished.summary.state == BenchState.DONE
    assert finished.summary.simulated and finished.summary.best_concurrency == 4

    runs = await d.client.bench_runs()
    assert [r.id for r in runs] == [run.id] and runs[0].name == "first"
    assert runs[0].best_output_throughput_tps == pytest.approx(four.output_throughput_tps)
    assert await d.client.bench_current() == (None, None)
    # the stored run is what the daemon reads back after a restart
    stored = await asyncio.to_thread(feature_runs(d).get, run.id)
    assert stored == run

    # a second run straight at the engine's own port, with the chat workload
    port = next(e.port for e in await d.client.engines() if e.engine_id == "fake")
    direct, _ = await run_to_end(
        d,
        BenchConfig(
            model="fake",
            url=f"http://127.0.0.1:{port}",
            workload="chat",
            concurrency=(4,),
            requests=8,
            output_len=10,
            name="direct",
        ),
    )
    assert direct.state == BenchState.DONE and direct.target == f"http://127.0.0.1:{port}/v1"
    assert direct.engine["engine_id"] == "fake" and direct.prompt_source == "chat"
    assert direct.levels[0].completed == 8

    # the HTML report and the comparison carry the figures
    html = await d.client.bench_report_html([run.id])
    assert cell(four.output_throughput_tps, 1) in html
    assert cell(one.telemetry.joules_per_token, 3) in html and "SIMULATED" in html
    assert "<svg" in html and "<script" not in html.lower()
    both = await d.client.bench_report_html([run.id, direct.id])
    assert "Comparison" in both and cell(direct.levels[0].output_throughput_tps, 1) in both

    code, out = await traylm("bench", "compare", str(run.id), str(direct.id))
    assert code == 0, out
    assert "concurrency 4" in out and "output tok/s" in out and "x" in out
    assert "SIMULATED" in out
    report = d.paths.state_dir / "report.html"
    code, out = await traylm("bench", "show", str(run.id), "--html", str(report))
    assert code == 0 and "run #1 'first': done" in out
    assert cell(one.output_throughput_tps, 1) in report.read_text()
    code, out = await traylm("bench", "ls")
    assert code == 0 and "first" in out and "direct" in out and "* energy from simulated" in out


def feature_runs(d: RunningDaemon) -> Any:

    return d.daemon.bench.runs


async def traylm(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "from engines.cli import main; main()",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, out.decode()


async def fake_stats(d: RunningDaemon) -> dict[str, int]:
    port = next(e.port for e in await d.client.engines() if e.engine_id == "fake")
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}/fake/stats") as r,
    ):
        data: dict[str, int] = await r.json()
        return data


async def test_cancel_mid_run_keeps_what_finished(sim_daemon: RunningDaemon) -> None:
    d = sim_daemon
    await start_fake(d, args="--token-delay 0.05")
    config = BenchConfig(model="fake", concurrency=(2, 8), requests=20, output_len=30, warmup=0)
    cancelled: list[Any] = []

    async def cancel_after_two(event: Event) -> None:
        if isinstance(event, BenchProgress) and event.completed >= 2 and not cancelled:
            with pytest.raises(ControlAPIError) as err:  # one run at a time
                await d.client.bench_start(config)
            assert err.value.http_status == 409 and "still running" in err.value.message
            assert (await d.client.status())["bench"]["id"] == event.run_id
            cancelled.append(await d.client.bench_cancel(event.run_id))

    run, _ = await run_to_end(d, config, during=cancel_after_two)
    assert cancelled and cancelled[0].state == BenchState.CANCELLED
    assert run.state == BenchState.CANCELLED and len(run.levels) == 1  # level 8 never began
    level = run.levels[0]
    assert level.cancelled and 2 <= level.completed < 20
    # the requests in flight were really cut: the engine saw its clients go away
    for _ in range(100):
        if (await fake_stats(d))["aborted"] >= 1:
            break
        await asyncio.sleep(0.05)
    assert (await fake_stats(d))["aborted"] >= 1
    with pytest.raises(ControlAPIError, match="is not running"):
        await d.client.bench_cancel(run.id)
    await d.client.bench_delete(run.id)
    assert await d.client.bench_runs() == []


async def test_bad_requests_get_one_clear_error(sim_daemon: RunningDaemon) -> None:
    d = sim_daemon
    with pytest.raises(ControlAPIError, match="'nope' is not served"):
        await d.client.bench_start(BenchConfig(model="nope"))
    with pytest.raises(ControlAPIError, match="--concurrency takes levels from 1"):
        await d.client.bench_start(BenchConfig(model="fake", concurrency=(0,)))
    with pytest.raises(ControlAPIError, match="unknown workload"):
        await d.client.bench_start(BenchConfig(model="fake", workload="sonnet"))
    dead = f"http://127.0.0.1:{free_loopback_port()}/v1"
    with pytest.raises(ControlAPIError, match="nothing usable answers at"):
        await d.client.bench_start(BenchConfig(model="fake", url=dead))
    await start_fake(d)
    port = next(e.port for e in await d.client.engines() if e.engine_id == "fake")
    with pytest.raises(ControlAPIError, match="does not serve 'other'; it serves: fake"):
        await d.client.bench_start(BenchConfig(model="other", url=f"http://127.0.0.1:{port}"))
    with pytest.raises(ControlAPIError, match="no benchmark run 42"):
        await d.client.bench_run(42)
    code, out = await traylm("bench", "run", "--model", "fake", "--concurrency", "1,x")
    assert code == 1 and "give whole numbers" in out
    assert await d.client.bench_runs() == []  # nothing half-made was stored


async def test_interrupted_by_daemon_stop_and_marked_on_next_start(
    daemon_factory: Any, fake_env: Path
) -> None:
    d: RunningDaemon = await daemon_factory(sim_settings())
    await start_fake(d, args="--token-delay 0.05")
    with d.daemon.bus.subscribe(frozenset({"bench.progress"})) as sub:
        run = await d.client.bench_start(
            BenchConfig(model="fake", concurrency=(1,), requests=50, output_len=40)
        )
        while True:
            event = await asyncio.wait_for(sub.get(), 30)
            if isinstance(event, BenchProgress) and event.phase == "measure":
                break
    bench = d.daemon.bench
    await bench.stop()  # what the daemon does on its way out
    runs = feature_runs(d)
    stored = await asyncio.to_thread(runs.get, run.id)
    assert stored.state == BenchState.INTERRUPTED and "daemon stopped" in stored.detail
    # a row a killed daemon left "running" is marked when the feature starts again
    left = await asyncio.to_thread(runs.create, BenchConfig(model="fake"), target="t", engine={})
    await bench.start()
    assert (await asyncio.to_thread(runs.get, left.id)).state == BenchState.INTERRUPTED


async def test_worker_stops_when_its_daemon_dies(sim_daemon: RunningDaemon) -> None:
    """A daemon killed with -9 leaves no benchmark hammering the engines."""
    d = sim_daemon
    await start_fake(d, args="--token-delay 0.05")
    port = next(e.port for e in await d.client.engines() if e.engine_id == "fake")
    config = BenchConfig(model="fake", concurrency=(2,), requests=200, output_len=40, warmup=0)
    job = {"run_id": 1, "config": to_plain(config), "target": f"http://127.0.0.1:{port}/v1"}
    parent = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-m', 'engines.bench.worker'],"
        " stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)\n"
        "p.stdin.write(sys.stdin.buffer.read()); p.stdin.close()\n"
        "print(p.pid, flush=True); time.sleep(600)",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert parent.stdin is not None and parent.stdout is not None
    parent.stdin.write(json.dumps(job).encode())
    parent.stdin.close()
    worker = psutil.Process(int(await asyncio.wait_for(parent.stdout.readline(), 30)))
    for _ in range(200):  # the load is on
        if (await fake_stats(d))["requests"] >= 2:
            break
        await asyncio.sleep(0.05)
    parent.kill()
    await parent.wait()
    gone, _ = await asyncio.to_thread(psutil.wait_procs, [worker], 15)
    assert gone, "the orphaned bench worker kept running"


# Deadlines for a loaded 2-core machine (the suite beside CPU hogs): the CLI must end within
# the daemon's stop grace for its worker (8 s, then SIGKILL) and its own wait for the daemon's
# answer (CANCEL_ANSWER_S), plus the time a starved process needs to run at all.
CANCEL_DEADLINE_S = CANCEL_ANSWER_S + 40


async def test_ctrl_c_in_bench_run_cancels_the_run(sim_daemon: RunningDaemon) -> None:
    d = sim_daemon
    await start_fake(d, args="--token-delay 0.05")
    with d.daemon.bus.subscribe(frozenset({"bench"})) as sub:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            "from engines.cli import main; main()",
            *("bench", "run", "--model", "fake", "--requests", "100", "--output-len", "40"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            assert proc.stdout is not None
            said = b""  # the CLI follows its run once it says so: from then on Ctrl-C cancels
            while b"started against" not in said:  # (a starved CLI says it late)
                line = await asyncio.wait_for(proc.stdout.readline(), 60)
                assert line, said.decode()
                said += line
            while True:  # and the run measures
                event = await asyncio.wait_for(sub.get(), 60)
                if isinstance(event, BenchProgress) and event.phase == "measure":
                    break
            proc.send_signal(signal.SIGINT)
            rest, _ = await asyncio.wait_for(proc.communicate(), CANCEL_DEADLINE_S)
            out = said + rest
            while True:
                event = await asyncio.wait_for(sub.get(), CANCEL_DEADLINE_S)
                if isinstance(event, BenchFinished):
                    break
        finally:  # never leave the CLI running into the next tests
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert proc.returncode == 130, out.decode()
    assert "stopping the benchmark" in out.decode()
    assert event.summary.state == BenchState.CANCELLED
    code, text = await traylm("bench", "cancel")
    assert code == 0 and "no benchmark is running" in text


async def test_bench_run_loads_a_cold_model_first(sim_daemon: RunningDaemon) -> None:
    """Models on demand: `traylm bench run --model NAME` of a servable model that is not loaded
    loads it (saying each step) and measures it once it serves."""
    d = sim_daemon
    d.write_profile(
        "cold", model="org/cold", served_name="cold", device="cpu",
        env={"FAKE_ENGINE_ARGS": "--startup-delay 1"},
    )  # fmt: skip
    assert d.daemon.supervisor.get("cold") is None
    args = ("--concurrency", "1", "--requests", "3", "--output-len", "4", "--warmup", "0")
    code, out = await traylm("bench", "run", "--model", "cold", *args)
    assert code == 0, out
    assert "cold is not loaded: loading it first" in out
    assert "  starting: " in out and "cold: ready" in out
    assert out.index("cold: ready") < out.index("benchmark run #")
    [run] = await d.client.bench_runs()
    assert run.state == BenchState.DONE and run.model == "cold"
    assert d.daemon.engine("cold").state == EngineState.READY
