"""Fixtures shared by every test folder: isolated traylm paths and a real in-process daemon."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from engines.client import DaemonClient
from engines.config.sections import (
    EngineSettings,
    GatewaySettings,
    OllamaSettings,
    Paths,
    Settings,
)
from engines.config.tomlfile import write_toml_atomic
from engines.core.procs import free_loopback_port
from engines.daemon import Daemon
from tests.fakes.fake_vllm_env import make_fake_vllm_env
from tests.fakes.hub_endpoint import ReachableEndpoint
from tests.timings import pytest_runtest_logreport  # noqa: F401 - a pytest hook: each test's time

# every `traylm serve` a test starts leaves Ollama's port (11434) alone unless the test gives
# one: no test binds a fixed port of the machine
os.environ.setdefault("TRAYLM_OLLAMA_PORT", "0")

LEAK_GRACE_S = 10.0  # a process a test started may take this long to go after its teardown


@pytest.fixture(autouse=True)
def no_leaked_processes(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test must not leave a process of its own running into the next tests (a leaked
    engine or CLI once failed an unrelated test under load): after its teardown, what it
    started is given a few seconds to exit, then killed, and the test errors with its name.
    The real-engine tests share session daemons on purpose and are not checked."""
    if "integration" in request.node.path.parts:
        yield
        return
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    seen = request.node.stash.get(SEEN_AFTER_CALL, [])
    left = kill_leftovers(before, LEAK_GRACE_S, seen)
    if left:
        pytest.fail(f"the test left processes running (now killed): {'; '.join(left)}")


SEEN_AFTER_CALL = pytest.StashKey[list[psutil.Process]]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """What runs below this process when the test body ends: an engine whose daemon a
    fixture then kills with SIGKILL is re-parented to init and is no child any more, but it
    is still this test's leak."""
    yield
    item.stash[SEEN_AFTER_CALL] = psutil.Process().children(recursive=True)


def kill_leftovers(
    before: set[int], grace_s: float, seen: Sequence[psutil.Process] = ()
) -> list[str]:
    """Children of this process not in ``before`` (and processes ``seen`` under it earlier,
    checked by pid and start time) still running after ``grace_s``: killed, and described."""
    me = psutil.Process()
    found = {p.pid: p for p in [*seen, *me.children(recursive=True)]}
    alive = [p for p in found.values() if p.pid not in before and _running(p)]
    deadline = time.monotonic() + grace_s
    while alive and time.monotonic() < deadline:  # polled, never reaped: their owners reap
        time.sleep(0.1)
        alive = [p for p in alive if _running(p)]
    names = [_describe(p) for p in alive]
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    return names


def _running(p: psutil.Process) -> bool:
    try:  # is_running: the same process (pid and start time), not a new one with its pid
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _describe(p: psutil.Process) -> str:
    try:
        return f"pid {p.pid} ({' '.join(p.cmdline()[:5])[:120]})"
    except psutil.Error:
        return f"pid {p.pid}"


@pytest.fixture(scope="session")
def hub_stand_in() -> Iterator[str]:
    endpoint = ReachableEndpoint().start()
    yield endpoint.url
    endpoint.stop()


@pytest.fixture(autouse=True)
def reachable_hub(hub_stand_in: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Starts of made-up repo ids ("org/fake") go on as with network (tests/fakes/
    hub_endpoint.py); tests that need the Hub set HF_ENDPOINT to the FAKE Hub themselves."""
    monkeypatch.setenv("HF_ENDPOINT", hub_stand_in)


@pytest.fixture
def paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Paths:
    """A private TRAYLM_HOME for the test (config, data, state, cache) and engine envs dir."""
    monkeypatch.setenv("TRAYLM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TRAYLM_ENVS_DIR", str(tmp_path / "envs"))
    return Paths.from_env()


@pytest.fixture
def fake_env(paths: Paths) -> Path:
    return make_fake_vllm_env(paths.envs_dir)


@pytest.fixture
def fake_cuda_env(paths: Paths) -> Path:
    """A FAKE vLLM env for CUDA: its engines run on the (simulated) GPUs; one from `fake_env`
    runs on the CPU and holds no GPU."""
    return make_fake_vllm_env(paths.envs_dir, device="cuda")


def fast_settings(port: int, **gateway: Any) -> Settings:
    """Settings tuned for tests: quick restarts and stops."""
    return Settings(
        gateway=dataclasses.replace(GatewaySettings(port=port), **gateway),
        ollama=OllamaSettings(enabled=False),  # no test binds the real 11434
        engines=EngineSettings(
            ready_timeout_s=30, stop_timeout_s=3, restart_backoff_s=0.2, restart_backoff_max_s=1
        ),
    )


@dataclass
class RunningDaemon:
    daemon: Daemon
    url: str
    client: DaemonClient
    paths: Paths
    task: asyncio.Task[None] | None = None
    """The daemon's run (done once it stopped)."""

    @property
    def port(self) -> int:
        return self.daemon.settings.gateway.port

    def write_profile(self, name: str, **fields: Any) -> None:
        write_toml_atomic(self.paths.profiles_dir / f"{name}.toml", fields)


DaemonFactory = Callable[..., Any]


@pytest.fixture
async def daemon_factory(paths: Paths) -> AsyncIterator[DaemonFactory]:
    """Start real daemons in this event loop; all are stopped (engines included) at the end."""
    running: list[tuple[Daemon, asyncio.Task[None], DaemonClient]] = []

    async def start(settings: Settings | None = None) -> RunningDaemon:
        settings = settings or fast_settings(free_loopback_port())
        daemon = Daemon(paths, settings)
        ready = asyncio.Event()
        task = asyncio.create_task(daemon.run(ready=ready, install_signal_handlers=False))
        ready_wait = asyncio.create_task(ready.wait())
        done, _ = await asyncio.wait({task, ready_wait}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            ready_wait.cancel()
            task.result()  # raises the start-up error
        client = await DaemonClient.connect(paths)
        running.append((daemon, task, client))
        url = f"http://127.0.0.1:{settings.gateway.port}"
        return RunningDaemon(daemon, url, client, paths, task)

    yield start
    for daemon, task, client in running:
        await client.close()
        daemon.request_stop("test finished")
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 30)


@pytest.fixture
async def daemon(daemon_factory: DaemonFactory, fake_env: Path) -> RunningDaemon:
    """A running daemon with the fake vLLM env installed."""
    result: RunningDaemon = await daemon_factory()
    return result
