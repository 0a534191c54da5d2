"""`traylm bench run --profiles`: the real CLI against the real daemon on two SIMULATED GPUs
(`--simulate-gpus 2`: no GPU on this machine) with the FAKE vLLM engine. Each profile is applied
through traylm-gpud (the simulated helper), the same benchmark runs under each, the table comes
out, and the profile in force before is back at the end, after a Ctrl-C too."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from engines.bench import profiles
from engines.core.procs import free_loopback_port
from engines.errors import ControlAPIError
from engines.events import BenchFinished, BenchProgress, BenchState, Event
from engines.events.gpu import GPUControlChanged
from engines.gpu.sim import sim_uuid
from tests.conftest import RunningDaemon, fast_settings
from tests.engines.bench.test_daemon import CANCEL_DEADLINE_S, traylm
from tests.engines.gateway.test_daemon_gateway import start_fake
from tests.engines.gpu.test_daemon import sim_settings

SMALL = ("--concurrency", "1", "--requests", "3", "--output-len", "4", "--warmup", "0")
GPU0 = sim_uuid(0)
CLI = (sys.executable, "-c", "from engines.cli import main; main()")


@pytest.fixture
async def sim_daemon(daemon_factory: Any, fake_env: Path) -> RunningDaemon:
    d: RunningDaemon = await daemon_factory(sim_settings())
    return d


async def traylm_split(*args: str) -> tuple[int, str, str]:
    """The real CLI: exit code, stdout, stderr apart (stdout is the JSON)."""
    proc = await asyncio.create_subprocess_exec(
        *CLI, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 300)
    return proc.returncode or 0, out.decode(), err.decode()


@pytest.mark.slow
async def test_three_profiles_three_rows_and_the_profile_before_is_back(
    sim_daemon: RunningDaemon,
) -> None:
    d = sim_daemon
    await start_fake(d)
    await d.client.set_efficiency_profile("eco")
    applied: list[str] = []  # the profiles applied, in order, as the daemon announced them
    started: list[int] = []
    with d.daemon.bus.subscribe(frozenset({"gpu.control", "bench"})) as sub:

        async def watch() -> None:
            while True:
                e: Event = await sub.get()
                if isinstance(e, GPUControlChanged) and e.what == "profile" and e.uuid == GPU0:
                    applied.append(e.detail.removeprefix("efficiency profile "))
                if isinstance(e, BenchProgress) and e.run_id not in started:
                    started.append(e.run_id)
                    applied.append(f"run {e.run_id}")

        watcher = asyncio.create_task(watch())
        try:
            code, out, err = await traylm_split(
                "bench", "run", "--model", "fake", "--profiles", "quiet,eco,max", *SMALL,
                "--repeat", "2", "--seed", "7", "--json",
            )  # fmt: skip
        finally:
            watcher.cancel()
    assert code == 0, err
    data = json.loads(out)
    assert [r["profile"] for r in data["runs"]] == ["quiet", "eco", "max"] * 2
    assert [r["round"] for r in data["runs"]] == [0, 0, 0, 1, 1, 1]
    ids = [r["run_id"] for r in data["runs"]]
    # each run measured under its own profile: the profile switch came before the run started
    assert applied == [x for p, i in zip(["quiet", "eco", "max"] * 2, ids, strict=True)
                           for x in (p, f"run {i}")] + ["eco"]  # fmt: skip
    stored = {r.id: r for r in await d.client.bench_runs()}
    assert sorted(stored) == sorted(ids)
    assert [stored[i].name for i in ids] == [f"profile {p}" for p in ["quiet", "eco", "max"] * 2]
    assert all(stored[i].state == BenchState.DONE for i in ids)
    runs = [await d.client.bench_run(i) for i in ids]
    assert len({(r.config.seed, r.config.requests, r.config.output_len) for r in runs}) == 1
    assert runs[0].config.seed == 7

    assert [(r["profile"], r["concurrency"], r["runs"]) for r in data["table"]] == [
        ("quiet", 1, 2), ("eco", 1, 2), ("max", 1, 2),
    ]  # fmt: skip
    for row in data["table"]:
        assert set(row["figures"]) == {k for k, _, _ in profiles.COLUMNS}, row
        assert set(row["band"]) == set(row["figures"]) and min(row["band"].values()) >= 0.02
        assert row["simulated"]
    assert data["simulated"] and data["profile_before"] == data["profile_after"] == "eco"
    assert (await d.client.gpus()).profile == "eco"
    assert "efficiency profile eco is back in force" in err

    # the same runs as the text table: a row each, the band, labelled simulated
    pruns = [profiles.ProfileRun(p, i // 3, r) for i, (p, r) in
             enumerate(zip(["quiet", "eco", "max"] * 2, runs, strict=True))]  # fmt: skip
    text = profiles.format_table(profiles.rows(pruns, ["quiet", "eco", "max"]), pruns, 2)
    assert "SIMULATED GPUs" in text and "noise band" in text
    lines = text.splitlines()
    for name in ("quiet", "eco", "max"):
        [line] = [x for x in lines if x.strip().startswith(name + " ")]
        assert line.count("±") == len(profiles.COLUMNS) and line.endswith("SIM")


async def test_an_unknown_profile_is_refused_before_anything_runs(
    sim_daemon: RunningDaemon,
) -> None:
    d = sim_daemon
    code, out = await traylm("bench", "run", "--model", "fake", "--profiles", "eco,turbo", *SMALL)
    assert code == 1
    assert out.strip() == "traylm: no efficiency profile 'turbo'; profiles: quiet, eco, max"
    assert await d.client.bench_runs() == []
    assert (await d.client.gpus()).profile is None  # eco, the known one, was not applied


async def test_a_broken_profile_file_stops_only_a_run_that_asks_for_it(
    sim_daemon: RunningDaemon,
) -> None:
    d = sim_daemon
    folder = d.paths.config_dir / "efficiency"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "far.toml").write_text("power = [broken\n")
    code, out = await traylm("bench", "run", "--model", "fake", "--profiles", "eco,far", *SMALL)
    assert code == 1 and "far.toml" in out and len(out.strip().splitlines()) == 1, out
    code, out = await traylm("bench", "run", "--model", "fake", "--profiles", "eco,turbo", *SMALL)
    assert out.strip() == "traylm: no efficiency profile 'turbo'; profiles: quiet, eco, max"
    assert (await d.client.gpus()).profile is None and await d.client.bench_runs() == []


async def test_an_unknown_model_is_refused_before_a_profile_is_applied(
    sim_daemon: RunningDaemon,
) -> None:
    d = sim_daemon
    code, out = await traylm("bench", "run", "--model", "nope", "--profiles", "quiet", *SMALL)
    assert code == 1 and out.startswith("traylm: the model 'nope' is not served here"), out
    assert len(out.strip().splitlines()) == 1
    assert (await d.client.gpus()).profile is None and await d.client.bench_runs() == []


async def test_without_gpus_profiles_say_they_need_them(daemon_factory: Any) -> None:
    d: RunningDaemon = await daemon_factory(
        fast_settings(free_loopback_port())
    )  # no NVML here, no simulation
    assert not (await d.client.gpus()).gpus
    code, out = await traylm("bench", "run", "--model", "fake", "--profiles", "eco", *SMALL)
    assert code == 1 and len(out.strip().splitlines()) == 1, out
    assert "efficiency profiles need NVIDIA GPUs" in out and "--simulate-gpus" in out
    assert await d.client.bench_runs() == []


async def interrupt_mid_run(d: RunningDaemon, times: int) -> tuple[int, str]:
    """`bench run --profiles quiet,max` under eco, ``times`` SIGINTs at once while quiet's run
    measures; the exit code and the CLI's output, once the run in the daemon has ended."""
    await start_fake(d, args="--token-delay 0.05")
    await d.client.set_efficiency_profile("eco")
    with d.daemon.bus.subscribe(frozenset({"bench"})) as sub:
        proc = await asyncio.create_subprocess_exec(
            *CLI,
            *("bench", "run", "--model", "fake", "--profiles", "quiet,max", "--repeat", "1"),
            *("--requests", "100", "--output-len", "40"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            assert proc.stdout is not None
            said = b""  # once the run is followed, Ctrl-C cancels it
            while b"started against" not in said:
                line = await asyncio.wait_for(proc.stdout.readline(), 60)
                assert line, said.decode()
                said += line
            while True:  # and it measures, under quiet
                event = await asyncio.wait_for(sub.get(), 60)
                if isinstance(event, BenchProgress) and event.phase == "measure":
                    run_id = event.run_id
                    break
            assert (await d.client.gpus()).profile == "quiet"
            # one at a time, each once the CLI has answered the last: pending SIGINTs merge
            for answer in (b"stopping the benchmark", b"Ctrl-C again leaves")[: times - 1]:
                proc.send_signal(signal.SIGINT)
                while answer not in said:
                    line = await asyncio.wait_for(proc.stdout.readline(), CANCEL_DEADLINE_S)
                    assert line, said.decode()
                    said += line
            proc.send_signal(signal.SIGINT)
            rest, _ = await asyncio.wait_for(proc.communicate(), CANCEL_DEADLINE_S)
            out = (said + rest).decode()
            if times > 2:  # the CLI left before the daemon confirmed: the run may go on
                with contextlib.suppress(ControlAPIError):  # already cancelled
                    await d.client.bench_cancel(run_id)
            while True:
                event = await asyncio.wait_for(sub.get(), CANCEL_DEADLINE_S)
                if isinstance(event, BenchFinished):
                    break
        finally:  # never leave the CLI running into the next tests
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out


@pytest.mark.slow
async def test_ctrl_c_mid_way_puts_the_profile_before_back(sim_daemon: RunningDaemon) -> None:
    d = sim_daemon
    code, out = await interrupt_mid_run(d, 2)  # impatient: the second must not skip the restore
    assert code == 130, out
    assert "stopping the benchmark" in out
    assert "putting back efficiency profile eco first" in out
    assert "efficiency profile eco is back in force" in out
    assert "Traceback" not in out
    assert (await d.client.gpus()).profile == "eco"
    assert [r.state for r in await d.client.bench_runs()] == [BenchState.CANCELLED]  # no max run


@pytest.mark.slow
async def test_a_third_ctrl_c_leaves_and_says_on_which_profile(sim_daemon: RunningDaemon) -> None:
    d = sim_daemon
    code, out = await interrupt_mid_run(d, 3)
    assert code == 130, out
    assert "the GPUs are left on efficiency profile quiet: `traylm power profile eco`" in out
    assert "is back in force" not in out and "Traceback" not in out
    assert (await d.client.gpus()).profile == "quiet"  # as it said
    assert [r.state for r in await d.client.bench_runs()] == [BenchState.CANCELLED]
