"""ManagedEngine with real processes (the FAKE engine in tests/fakes/openai_engine.py):
readiness, stop with a stubborn child, crash detection and restart caps, logs, orphan reaper."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import psutil
import pytest
from packaging.version import Version

from engines.config.profiles import Profile, profile_from_mapping
from engines.config.sections import EngineSettings
from engines.core.procs import PidRegistry, TrackedProcess, group_alive, reap_orphans
from engines.events import Diagnosis, EngineState, EngineStateChanged, Event
from engines.runtime import process, watch
from engines.runtime.adapters.base import EngineRuntime, FlagSet, LaunchSpec
from engines.runtime.adapters.vllm import VLLMAdapter
from engines.runtime.liveness import Health
from engines.runtime.output import last_error, strip_ansi
from engines.runtime.supervisor import ManagedEngine

FAKE = Path(__file__).parents[2] / "fakes" / "openai_engine.py"


class FakeEngineAdapter:
    """Launches the fake OpenAI engine; diagnoses with vLLM's rules."""

    name = "fake"

    def __init__(self, args: str = "") -> None:
        self.args = args

    def launch(
        self, profile: Profile, *, runtime: EngineRuntime, port: int, model: str
    ) -> LaunchSpec:
        argv = (
            sys.executable,
            str(FAKE),
            "--port",
            str(port),
            "--served-model-name",
            *profile.served_names,
            *shlex.split(self.args),
        )
        return LaunchSpec(argv=argv, env={}, served_names=profile.served_names)

    def diagnose(self, line: str) -> Diagnosis | None:
        return VLLMAdapter().diagnose(line)


RUNTIME = EngineRuntime(
    "fake",
    Version("1"),
    Path(sys.executable),
    Path(sys.executable).parent,
    "cpu",
    FlagSet("fake", "1", {}),
)


def make_engine(
    tmp_path: Path, args: str = "", events: list[Event] | None = None, **settings: float
) -> ManagedEngine:
    defaults = {
        "ready_timeout_s": 20,
        "stop_timeout_s": 2,
        "restart_backoff_s": 0.1,
        "restart_backoff_max_s": 0.4,
        "restart_max": 2,
    }
    sink: list[Event] = events if events is not None else []
    return ManagedEngine(
        "e1",
        profile=profile_from_mapping("e1", {"model": "org/m", "served_name": "m"}),
        adapter=FakeEngineAdapter(args),
        runtime=RUNTIME,
        model="org/m",
        settings=EngineSettings(**{**defaults, **settings}),  # type: ignore[arg-type]
        log_path=tmp_path / "logs" / "e1.log",
        pids=PidRegistry(tmp_path / "pids.json"),
        publish=sink.append,
    )


async def wait_state(engine: ManagedEngine, state: EngineState, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while engine.state != state:
        assert time.monotonic() < deadline, f"still {engine.state}: {engine.detail}"
        await asyncio.sleep(0.05)


async def wait_child_tracked(tmp_path: Path, pgid: int, timeout_s: float = 20) -> None:
    """Until the supervisor's tracker has recorded a process of the engine's group besides its
    leader (in engine-pids.json, where the reaper would find it after a daemon crash)."""
    registry = PidRegistry(tmp_path / "pids.json")
    deadline = time.monotonic() + timeout_s
    while True:
        record = registry.read().get("e1")
        if record is not None and any(p.pid != pgid for p in record.tracked):
            return
        assert time.monotonic() < deadline, f"no child of {pgid} tracked: {record}"
        await asyncio.sleep(0.05)


async def test_start_ready_stop(tmp_path: Path) -> None:
    events: list[Event] = []
    engine = make_engine(tmp_path, events=events)
    await engine.start()
    await engine.wait_ready(20)
    assert engine.state == EngineState.READY and engine.pid
    pid = engine.pid
    await engine.stop()
    assert engine.state == EngineState.STOPPED
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    changes = [e for e in events if isinstance(e, EngineStateChanged)]
    assert [e.state for e in changes] == [
        EngineState.STARTING,  # launching: no process yet
        EngineState.STARTING,  # spawned: its port and pid
        EngineState.READY,
        EngineState.STOPPING,
        EngineState.STOPPED,
    ]
    assert changes[0].pid is None and changes[1].pid == pid and changes[1].port == engine.port
    assert not PidRegistry(tmp_path / "pids.json").read()  # record dropped on a clean stop


async def test_stop_kills_a_child_that_ignores_sigterm(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, "--spawn-child")
    await engine.start()
    await engine.wait_ready(20)
    pgid = engine.pid
    assert pgid is not None
    await wait_child_tracked(tmp_path, pgid)
    children = psutil.Process(pgid).children()
    assert children, "the fake should have spawned its stubborn child"
    started = time.monotonic()
    await engine.stop()
    assert time.monotonic() - started < 10
    assert not group_alive(pgid)
    assert all(not psutil.pid_exists(c.pid) or c.status() == psutil.STATUS_ZOMBIE for c in children)


@pytest.mark.slow
async def test_crash_is_detected_fast_and_restarted_with_a_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/health turning 503 is a crash at the second look that sees it (within 2 s at one look
    a second). Counted in looks, not in wall-clock time: a loaded machine stretches the looks,
    not their number."""
    timeline: list[Event | Health] = []  # the engine's events and its /health answers, in order
    real_probe = watch.probe

    async def probe(http: Any, base_url: str | None, path: str, trouble: Any) -> Health:
        health = await real_probe(http, base_url, path, trouble)
        if path == "/health":
            timeline.append(health)
        return health

    monkeypatch.setattr(watch, "probe", probe)
    engine = make_engine(tmp_path, "--health-503-after 2", events=cast(list[Event], timeline))
    await engine.start()
    await wait_state(engine, EngineState.FAILED, 60)
    states = [e for e in timeline if isinstance(e, EngineStateChanged)]
    readies = [e for e in states if e.state == EngineState.READY]
    assert len(readies) == 3  # first start + restart_max (2) restarts
    assert "crashed 3 times" in engine.detail
    crashes = [e for e in states if "crashed (" in e.detail]
    assert len(crashes) == 3 and all("/health stopped answering 200" in e.detail for e in crashes)
    lives: list[list[Health]] = []  # each life's /health answers while it was ready
    watching = False
    for item in timeline:
        if isinstance(item, EngineStateChanged):
            watching = item.state == EngineState.READY
            if watching:
                lives.append([])
        elif watching:
            lives[-1].append(item)
    assert len(lives) == 3
    for life in lives:  # the crash came with the second 503 in a row, not a look later
        assert life[-2:] == [Health.BAD, Health.BAD] and Health.BAD not in life[:-2], life
    for ready in readies:  # every life's process group is gone
        assert ready.pid is not None and not group_alive(ready.pid)


async def test_leader_killed_while_its_child_holds_the_log_pipe(tmp_path: Path) -> None:
    """vLLM's engine core outlives a SIGKILLed API server and keeps stdout open; on Python 3.11
    ``proc.wait()`` would then block until the group is gone, and only the /health fallback
    would notice. The exit itself must be what is noticed."""
    events: list[Event] = []
    engine = make_engine(tmp_path, "--spawn-child", events=events, restart_max=0)
    await engine.start()
    await engine.wait_ready(20)
    assert engine.pid is not None
    pgid = engine.pid
    await wait_child_tracked(tmp_path, pgid)
    assert psutil.Process(pgid).children(), "the fake should have spawned its stubborn child"
    os.kill(pgid, signal.SIGKILL)
    await wait_state(engine, EngineState.FAILED, 30)
    crashed = [e for e in events if isinstance(e, EngineStateChanged) and "crashed (" in e.detail]
    assert crashed and "process exited with code -9" in crashed[0].detail
    assert not group_alive(pgid)  # the orphaned child went with its group


async def test_failed_start_keeps_the_diagnosis_and_is_not_retried(tmp_path: Path) -> None:
    line = (
        "ValueError: User-specified max_model_len (65536) is greater than the derived "
        "max_model_len (max_position_embeddings=32768 or model_max_length=None in model's "
        "config.json)."
    )
    engine = make_engine(tmp_path, f"--print {shlex.quote(line)} --exit-after-print 1")
    await engine.start()
    await wait_state(engine, EngineState.FAILED)
    assert engine.diagnosis is not None and engine.diagnosis.code == "model_len_above_limit"
    assert "max_model_len = 32768" in engine.detail
    assert engine.restarts == 0


async def test_ready_timeout_fails_with_advice(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, "--startup-delay 30", ready_timeout_s=1.5)
    await engine.start()
    await wait_state(engine, EngineState.FAILED)
    assert "not ready after 2 s" in engine.detail or "not ready after 1 s" in engine.detail
    assert "engines.ready_timeout_s" in engine.detail


async def test_logs_ring_file_and_ansi(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, "--print '\x1b[32mgreen\x1b[0m text' --print 'second\rthird'")
    await engine.start()
    await engine.wait_ready(20)
    await engine.stop()
    lines = engine.logs(0)
    assert "green text" in lines
    assert "second" in lines and "third" in lines  # \r splits progress-bar style lines
    text = engine.log_path.read_text()
    assert "green text" in text and "\x1b" not in text
    assert "===== argv:" in text


def test_strip_ansi_and_last_error() -> None:
    assert strip_ansi("\x1b[1;31mERR\x1b[0m \x1b]0;title\x07x") == "ERR x"
    lines = [
        "Traceback (most recent call last):",
        "  File x",
        "pydantic_core.ValidationError: 1 validation error for VllmConfig",
        "  Value error, invalid literal for int()",
        "    For further information visit https://errors.pydantic.dev/2.14/v/value_error",
    ]
    assert last_error(lines) == (
        "pydantic_core.ValidationError: 1 validation error for "
        "VllmConfig Value error, invalid literal for int()"
    )


def test_reaper_kills_orphans_and_spares_reused_pids(tmp_path: Path) -> None:
    registry = PidRegistry(tmp_path / "pids.json")
    # an "engine" whose parent (the daemon) died: leader + child in their own group
    code = (
        "import subprocess, sys, time, signal; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
        "time.sleep(600)"
    )
    leader = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not psutil.Process(leader.pid).children() and time.monotonic() < deadline:
            time.sleep(0.05)
        child = psutil.Process(leader.pid).children()[0]
        from engines.core.procs import EngineRecord

        registry.put(
            EngineRecord(
                "orphan",
                leader.pid,
                TrackedProcess.of(leader.pid),  # type: ignore[arg-type]
                (TrackedProcess(child.pid, child.create_time()),),
            )
        )
        # a record whose pid was reused by an unrelated process: must not be touched
        bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        registry.put(EngineRecord("stale", bystander.pid, TrackedProcess(bystander.pid, 1.0)))
        reaped = reap_orphans(registry, grace_s=0.5)
        assert len(reaped) == 1 and reaped[0].startswith("orphan:")
        leader.wait(5)
        assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
        assert bystander.poll() is None, "a process with a reused pid was killed"
        assert registry.read() == {}
    finally:
        for p in (leader,):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        bystander.kill()
        bystander.wait()


@pytest.mark.parametrize("registry_text", ["", "{not json", '{"x": {"pgid": "a"}}'])
def test_reaper_tolerates_a_damaged_registry(tmp_path: Path, registry_text: str) -> None:
    path = tmp_path / "pids.json"
    path.write_text(registry_text)
    assert reap_orphans(PidRegistry(path)) == []


async def test_supervision_survives_a_failing_process_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Out of descriptors, the scan of the engine's processes fails (EMFILE). The supervisor
    says so once, shows it in the status, keeps watching (a SIGKILL of the engine is noticed
    and the engine restarted) and clears the trouble once the scan works again."""
    failing = True
    real_scan = process.descendants

    def scan(pid: int) -> list[TrackedProcess]:
        if failing:
            raise OSError(errno.EMFILE, "Too many open files")
        return real_scan(pid)

    monkeypatch.setattr(process, "descendants", scan)
    caplog.set_level(logging.INFO, logger="engines.runtime.supervision")
    engine = make_engine(tmp_path)
    await engine.start()
    await engine.wait_ready(20)
    await wait_until(lambda: "cannot scan the engine's processes" in engine.status().supervision)
    assert "Too many open files" in engine.status().supervision
    pid = engine.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    await wait_until(lambda: engine.restarts == 1 and engine.state == EngineState.READY)
    assert engine.pid != pid
    failing = False
    await wait_until(lambda: engine.status().supervision == "")
    warnings = [r for r in caplog.records if "cannot scan" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]  # once, not every tick
    await engine.stop()
    assert engine.state == EngineState.STOPPED


async def wait_until(condition: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)
