"""Fixtures for the hub tests: a FAKE Hub on loopback (tests/fakes/hub_server.py) that the REAL
huggingface_hub client reaches through HF_ENDPOINT, a private HF cache, and a real daemon whose
hub settings retry fast."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engines.config.sections import HubSettings, Paths
from engines.core.procs import free_loopback_port
from engines.events import DownloadState, DownloadStatus
from tests.conftest import DaemonFactory, RunningDaemon, fast_settings
from tests.fakes.hub_server import FakeHub, FakeRepo, tiny_llama_repo


@pytest.fixture
def hf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private Hugging Face home: no token from the user's real login leaks into tests."""
    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_CACHE", "HF_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    return home


@pytest.fixture
def fake_hub(hf_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    hub = FakeHub(page_size=4).start()
    hub.add_repo(tiny_llama_repo())
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    yield hub
    hub.stop()


def hub_settings(**changes: Any) -> HubSettings:
    base = HubSettings(
        retry_max=3,
        retry_backoff_s=0.05,
        retry_backoff_max_s=0.2,
        stall_timeout_s=30,
        read_timeout_s=5,
        min_free_gib=0.0,
    )
    return dataclasses.replace(base, **changes)


@pytest.fixture
async def hub_daemon_factory(
    daemon_factory: DaemonFactory, fake_hub: FakeHub, paths: Paths
) -> Callable[..., Any]:
    async def start(**hub_changes: Any) -> RunningDaemon:
        settings = dataclasses.replace(
            fast_settings(free_loopback_port()), hub=hub_settings(**hub_changes)
        )
        result: RunningDaemon = await daemon_factory(settings)
        return result

    return start


@pytest.fixture
async def hub_daemon(hub_daemon_factory: Callable[..., Any]) -> RunningDaemon:
    result: RunningDaemon = await hub_daemon_factory()
    return result


async def wait_download(
    d: RunningDaemon,
    download_id: str,
    states: tuple[DownloadState, ...],
    timeout_s: float = 60,
) -> DownloadStatus:
    """Poll the control API until the download reaches one of ``states``."""

    async def poll() -> DownloadStatus:
        while True:
            status = await d.client.download(download_id)
            if status.state in states:
                return status
            await asyncio.sleep(0.05)

    return await asyncio.wait_for(poll(), timeout_s)


async def wait_for(predicate: Callable[[], Any], timeout_s: float = 30) -> None:
    async def poll() -> None:
        while not await _maybe_await(predicate()):
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), timeout_s)


async def _maybe_await(value: Any) -> Any:
    if asyncio.iscoroutine(value):
        return await value
    return value


def cache_repo(hf_home: Path, repo_id: str) -> Path:
    return hf_home / "hub" / ("models--" + repo_id.replace("/", "--"))


def big_repo(
    repo_id: str = "traylm-test/big", *, weight_bytes: int = 48 << 20, **kw: Any
) -> FakeRepo:
    return tiny_llama_repo(repo_id, weight_bytes=weight_bytes, **kw)


class EventLog:
    """Collects daemon events from the control API's SSE stream in a background task."""

    def __init__(self, d: RunningDaemon, kinds: tuple[str, ...]) -> None:
        self.events: list[Any] = []
        self._bus = d.daemon.bus
        self._subscribers_before = self._bus.subscriber_count
        self._task = asyncio.create_task(self._run(d, kinds))

    async def opened(self, timeout_s: float = 10) -> None:
        """Until the daemon has subscribed this stream (it misses no event published after)."""
        await wait_for(lambda: self._bus.subscriber_count > self._subscribers_before, timeout_s)

    async def _run(self, d: RunningDaemon, kinds: tuple[str, ...]) -> None:
        async for event in d.client.events(kinds=kinds):
            self.events.append(event)

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
