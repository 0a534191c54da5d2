"""Warm starts with the FAKE vLLM env (it speaks the same stdin protocol as the real warm
process): the next start of a profile runs in a process started ahead, only for exactly the
same setup, and no warm process outlives the daemon."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import psutil
import pytest

from engines.config.tomlfile import write_toml_atomic
from engines.events import EngineState
from engines.runtime.warm import WarmPool
from tests.conftest import RunningDaemon


async def ready(d: RunningDaemon, name: str = "fake") -> int:
    status = await d.client.wait_for_engine(name, (EngineState.READY, EngineState.FAILED), 30)
    assert status.state == EngineState.READY, status.detail
    assert status.pid is not None
    return status.pid


async def wait_until(check, timeout_s: float = 20) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_next_start_runs_in_the_warm_process(daemon: RunningDaemon) -> None:
    daemon.write_profile("fake", model="org/fake", served_name="fake", device="cpu")
    await daemon.client.start("fake")
    first = await ready(daemon)
    pool = daemon.daemon.warm
    assert "fake" in pool  # prepared once the engine was ready
    (warm_pid,) = pool.pids()
    assert warm_pid != first and alive(warm_pid)

    await daemon.client.stop("fake")
    assert alive(warm_pid)  # kept for the next start
    await daemon.client.start("fake")
    second = await ready(daemon)
    assert second == warm_pid  # the engine is the warm process
    status = (await daemon.client.engines())[0]
    assert [p.phase for p in status.phases][-1] == "ready" and len(status.phases) == 8
    log = (daemon.paths.logs_dir / "engines" / "fake.log").read_text()
    assert f"in warm process {warm_pid}" in log
    # it serves like any engine
    async with aiohttp.ClientSession() as http:
        body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        async with http.post(daemon.url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            assert (await resp.json())["choices"][0]["message"]["content"] == "w0 w1 w2"
    (next_pid,) = pool.pids()  # and the one after that is waiting already
    assert next_pid not in (warm_pid, first)


async def test_a_changed_setup_does_not_use_the_warm_process(daemon: RunningDaemon) -> None:
    daemon.write_profile("fake", model="org/fake", served_name="fake", device="cpu")
    await daemon.client.start("fake")
    await ready(daemon)
    (warm_pid,) = daemon.daemon.warm.pids()
    await daemon.client.stop("fake")
    # another environment for the engine: the warm process was made for the old one
    daemon.write_profile(
        "fake", model="org/fake", served_name="fake", device="cpu", env={"SOME_SETTING": "2"}
    )
    await daemon.client.start("fake")
    pid = await ready(daemon)
    assert pid != warm_pid
    await wait_until(lambda: not alive(warm_pid))


async def test_the_setting_applies_at_once_and_to_a_restart(daemon: RunningDaemon) -> None:
    daemon.write_profile("fake", model="org/fake", served_name="fake", device="cpu")
    await daemon.client.start("fake")
    await ready(daemon)
    pool = daemon.daemon.warm
    (warm_pid,) = pool.pids()
    # turned off: the process kept for the next start goes now (its RAM back), none is made
    await daemon.client.update_settings({"engines.warm_starts": 0})
    await wait_until(lambda: not alive(warm_pid))
    assert pool.pids() == []
    await daemon.client.restart("fake")
    await ready(daemon)
    assert pool.pids() == []
    # turned on again: a restart (not only a start) makes one for the next start
    await daemon.client.update_settings({"engines.warm_starts": 1})
    await daemon.client.restart("fake")
    await wait_until(lambda: len(pool.pids()) == 1)


async def test_warm_processes_stop_with_the_daemon(daemon_factory, fake_env) -> None:  # type: ignore[no-untyped-def]
    d = await daemon_factory()
    d.write_profile("fake", model="org/fake", served_name="fake", device="cpu")
    await d.client.start("fake")
    await ready(d)
    (warm_pid,) = d.daemon.warm.pids()
    d.daemon.request_stop("test")
    await wait_until(lambda: not alive(warm_pid), 30)


async def test_pool_keeps_at_most_its_limit_oldest_out(tmp_path: Path) -> None:
    pool = WarmPool(1)
    argv = (sys.executable, "-c", "import sys; sys.stdin.readline()")
    await pool.prepare("a", argv, dict(os.environ))
    (a,) = pool.pids()
    await pool.prepare("b", argv, dict(os.environ))
    assert "a" not in pool and "b" in pool
    await wait_until(lambda: not alive(a))
    # a different environment than the one it was made for: not used, and stopped
    other = {**os.environ, "X": "1"}
    assert await pool.take("b", argv, other, argv) is None
    assert "b" not in pool
    pool.limit = 0
    await pool.prepare("c", argv, dict(os.environ))
    assert pool.pids() == []
    await pool.close()


@pytest.mark.slow
def test_warm_process_exits_when_the_daemon_is_killed(
    env: dict[str, str], served: tuple[subprocess.Popen[str], int]
) -> None:
    daemon, _ = served
    write_toml_atomic(
        Path(env["TRAYLM_HOME"]) / "config" / "profiles" / "f.toml",
        {"model": "org/f", "served_name": "f", "device": "cpu"},
    )
    start = [sys.executable, "-m", "engines", "start", "f", "--wait", "--timeout", "30"]
    out = subprocess.run(start, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr

    def warm() -> list[psutil.Process]:
        return [p for p in psutil.Process(daemon.pid).children() if "--warm" in p.cmdline()]

    deadline = time.monotonic() + 20
    while not warm():
        assert time.monotonic() < deadline, "no warm process appeared"
        time.sleep(0.05)
    (proc,) = warm()
    engines = [p for p in psutil.Process(daemon.pid).children() if p.pid != proc.pid]
    daemon.send_signal(signal.SIGKILL)
    daemon.wait(10)
    proc.wait(20)  # its stdin closed with the daemon: it exits by itself, no orphan
    for p in engines:  # the engine itself is the reaper's job at the next daemon start
        p.kill()
