"""Fixtures for the desktop tests: a REAL daemon on its own thread
(tests/desktop/threaded_daemon.py), the FAKE vLLM env, the FAKE Hub, and the tray app built on
them."""

from __future__ import annotations

import os

# Widgets run offscreen unless a test asks for a real X server (the `tray` tests use Xvfb).
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from desktop.app import DesktopApp
from desktop.daemon.messages import LinkState
from engines.config.sections import HubSettings, Paths
from engines.core.procs import free_loopback_port
from tests.conftest import fast_settings
from tests.desktop.threaded_daemon import ThreadedDaemon, sim_settings
from tests.fakes.hub_server import FakeHub, tiny_llama_repo

__all__ = ["AppFactory", "ThreadedDaemon", "fast_hub", "sim_settings"]


def _live_top_levels() -> set[int]:
    """The top-level widgets alive now, once the deletions already asked for have run."""
    from PySide6.QtCore import QCoreApplication, QEvent
    from PySide6.QtWidgets import QApplication

    if QApplication.instance() is None:
        return set()
    for _ in range(3):  # a deletion may ask for more (a window's menus, its dialogs)
        QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
        QCoreApplication.processEvents()
    return {id(w) for w in QApplication.topLevelWidgets()}


@pytest.fixture(autouse=True)
def no_leaked_widgets(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test closes and deletes what it opened: a window left alive is restyled, polled
    and repainted by every later test (the theme tests took 35 s each behind 1,400 of them)."""
    before = _live_top_levels()
    yield
    left = _live_top_levels() - before
    if not left:
        return
    from PySide6.QtWidgets import QApplication

    widgets = [w for w in QApplication.topLevelWidgets() if id(w) in left]
    names = ", ".join(sorted({type(w).__name__ for w in widgets}))
    for widget in widgets:  # so that one leak does not slow or fail the tests after it
        widget.close()
        widget.deleteLater()
    _live_top_levels()
    pytest.fail(f"{request.node.name} left top-level widgets alive: {names}")


@pytest.fixture(autouse=True)
def private_desktop_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing a test does may touch the real ~/.config (autostart) or HF token."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_TOKEN_PATH", raising=False)


@pytest.fixture
def daemon_thread(paths: Paths, fake_env: Path) -> Iterator[ThreadedDaemon]:
    d = ThreadedDaemon(paths, fast_settings(free_loopback_port())).start()
    yield d
    d.stop()


@pytest.fixture
def sim_daemon_thread(
    paths: Paths, fake_env: Path, fake_cuda_env: Path
) -> Iterator[ThreadedDaemon]:
    """A real daemon on two SIMULATED GPUs, with its in-process traylm-gpud, and FAKE vLLM envs
    for the CPU and for CUDA."""
    d = ThreadedDaemon(paths, sim_settings()).start()
    yield d
    d.stop()


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """The FAKE Hugging Face Hub on loopback (tests/fakes/hub_server.py), reached by the REAL
    huggingface_hub client in the daemon through HF_ENDPOINT."""
    hub = FakeHub(page_size=4).start()
    hub.add_repo(tiny_llama_repo())
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    yield hub
    hub.stop()


def fast_hub() -> HubSettings:
    """Hub settings for tests: fast retries, no free-space floor."""
    return HubSettings(
        retry_max=3, retry_backoff_s=0.05, retry_backoff_max_s=0.2, stall_timeout_s=30,
        read_timeout_s=5, min_free_gib=0.0, parallel_files=1,
    )  # fmt: skip


@pytest.fixture
def hub_daemon_thread(paths: Paths, fake_env: Path, fake_hub: FakeHub) -> Iterator[ThreadedDaemon]:
    """A real daemon using the FAKE Hub (fast retries, no free-space floor), on two SIMULATED
    GPUs so that fit badges cover one and two GPUs."""
    d = ThreadedDaemon(paths, dataclasses.replace(sim_settings(), hub=fast_hub())).start()
    yield d
    d.stop()


AppFactory = Callable[..., DesktopApp]


@pytest.fixture
def app_factory(qtbot: Any, paths: Paths) -> Iterator[AppFactory]:
    apps: list[DesktopApp] = []

    def make(
        *, spawn_daemon: bool = False, connect: bool = True, offer_setup: bool = False, **kw: Any
    ) -> DesktopApp:
        """The app (without the first-run setup popping up unless a test asks for it)."""
        app = DesktopApp(paths, spawn_daemon=spawn_daemon, offer_setup=offer_setup, **kw)
        apps.append(app)
        app.start()
        if connect:
            qtbot.waitUntil(
                lambda: app.state.connection.state == LinkState.CONNECTED, timeout=15000
            )
            qtbot.waitUntil(lambda: app.state.settings is not None, timeout=5000)
        return app

    yield make
    for app in apps:
        if not app._finished:
            app.shutdown()


@pytest.fixture
def app(daemon_thread: ThreadedDaemon, app_factory: AppFactory) -> DesktopApp:
    """The app connected to ``daemon_thread`` (set up after it, so it is closed before it)."""
    return app_factory()


@pytest.fixture
def sim_app(qtbot: Any, sim_daemon_thread: ThreadedDaemon, app_factory: AppFactory) -> DesktopApp:
    """The app connected to ``sim_daemon_thread``, with the GPU overview loaded (until it is,
    the GPU pages are disabled and drop mouse input)."""
    app = app_factory()
    qtbot.waitUntil(lambda: app.state.gpu.available, timeout=15000)
    return app
