"""A paired box in the desktop app, against a real daemon whose BoxReplicas
asks a real HTTP server standing in for box-b's /peer/models (FakeBox, plain http: the mutual
TLS is tests/engines/peers/test_box_replicas.py's): the Engines table lists its replica with
the box's name (and "away" with why), the GPUs page shows its GPUs under its name, and the
tray offers its model "on box-b"."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from desktop.app import DesktopApp
from desktop.daemon.link import DaemonLink
from desktop.dashboard.engines_page import EnginesPage
from desktop.dashboard.gpus_page import GPUsPage
from engines.client import DaemonClient
from engines.config.sections import Paths, PeersSettings
from engines.core.procs import free_loopback_port
from tests.conftest import fast_settings
from tests.desktop.conftest import AppFactory
from tests.desktop.threaded_daemon import ThreadedDaemon
from tests.engines.peers.test_box_registry import FakeBox, StubPeers

SERVES = {
    "name": "box-b",
    "models": [{"name": "chat", "names": ["chat"], "engine": "vllm", "gpus": [1],
                "in_flight": 0, "waiting": 0}],
    "gpus": [{"index": 0, "name": "NVIDIA GeForce RTX 4090", "memory_total_bytes": 24 * 10**9},
             {"index": 1, "name": "NVIDIA RTX A6000", "memory_total_bytes": 48 * 10**9}],
}  # fmt: skip
AWAY = "box 'box-b' refused to say what it serves: boom"


@dataclasses.dataclass
class PairedBox:
    daemon: ThreadedDaemon
    fake: FakeBox

    def answers(self, answer: tuple[int, Any]) -> None:
        """box-b answers so from now on; the daemon asks it once (its poll waits for a real
        pairing, so nothing else asks)."""
        self.fake.answer = answer
        assert self.daemon.daemon is not None
        boxes = self.daemon.daemon.boxes
        self.daemon.run(lambda _c: boxes.refresh())


@pytest.fixture
def box_daemon(
    paths: Paths, fake_env: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[PairedBox]:
    settings = dataclasses.replace(
        fast_settings(free_loopback_port()), peers=PeersSettings(replicas_poll_s=0.5)
    )
    d = ThreadedDaemon(paths, settings).start()
    fake = FakeBox()
    app = web.Application()
    app.router.add_get("/peer/models", fake.models)
    server = TestServer(app, host="127.0.0.1")

    async def start() -> None:
        await server.start_server()

    d.run(lambda _c: start())
    stub = StubPeers(f"127.0.0.1:{server.port}")
    stub.pair()
    assert d.daemon is not None
    for method in ("names", "peer", "session", "client_context"):  # what BoxReplicas asks
        monkeypatch.setattr(d.daemon.peers, method, getattr(stub, method))
    yield PairedBox(d, fake)
    d.run(lambda _c: server.close())
    d.stop()


def test_a_paired_box_s_replica_and_gpus_show_with_its_name(
    qtbot: Any, box_daemon: PairedBox, app_factory: AppFactory
) -> None:
    app: DesktopApp = app_factory()
    gpus = app.open_dashboard("gpus").page("gpus")
    assert isinstance(gpus, GPUsPage)
    assert gpus.boxes.isHidden()  # no box heard of: nothing said
    box_daemon.answers((200, SERVES))
    qtbot.waitUntil(lambda: bool(app.state.box_replicas), timeout=10000)

    assert not gpus.boxes.isHidden()
    text = gpus.boxes.text()
    assert "box-b" in text and "NVIDIA RTX A6000, 48.0 GB — serves chat" in text
    assert "GPU 0: NVIDIA GeForce RTX 4090, 24.0 GB" in text

    engines = app.open_dashboard("engines").page("engines")
    assert isinstance(engines, EnginesPage)
    row = [engines.table.item(0, c).text() for c in range(engines.table.columnCount())]
    assert row[:3] == ["chat@box-b", "ready", "chat (on box-b)"]
    assert row[6] == "on box-b: GPU 1 NVIDIA RTX A6000"
    engines.table.selectRow(0)
    assert "served by the paired box <b>box-b</b>" in engines.detail.text()
    assert not engines.stop_button.isEnabled() and not engines.restart_button.isEnabled()

    app.tray.menu.aboutToShow.emit()
    [chat] = [a for a in app.tray.models_menu.actions() if a.objectName() == "model:chat"]
    assert chat.text() == "Chat with chat (on box-b)" and chat.isEnabled()

    box_daemon.answers((500, {"error": {"message": "boom"}}))
    qtbot.waitUntil(lambda: app.state.box_replicas[0].away == AWAY, timeout=10000)
    assert [engines.table.item(0, c).text() for c in (1, 2)] == [
        "away",
        f"chat (on box-b, away: {AWAY})",
    ]
    away = gpus.boxes.text()
    assert "away:</b> box &#x27;box-b&#x27; refused" in away and "GPU 1: NVIDIA" in away
    app.tray.menu.aboutToShow.emit()
    [chat] = [a for a in app.tray.models_menu.actions() if a.objectName() == "model:chat"]
    assert "away" in chat.text() and not chat.isEnabled()


def test_a_box_change_between_the_snapshot_and_the_subscription_is_shown(
    qtbot: Any, box_daemon: PairedBox, app_factory: AppFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """box-b starts serving right after the app's last status read of its snapshot (the one
    after the settings): the BoxesChanged the daemon publishes then must reach the app (it
    subscribes first, then reads), where it was lost when the app subscribed after its snapshot
    and its resync re-read only the engines. (A change made after an earlier status read was
    picked up by the later one, so this test passed on that code too.)"""
    real_load_settings = DaemonLink.load_settings
    changed: list[bool] = []

    async def load_settings(self: DaemonLink, client: DaemonClient) -> None:
        await real_load_settings(self, client)  # its status read is the snapshot's last
        if not changed:
            changed.append(True)
            box_daemon.answers((200, SERVES))  # the daemon publishes BoxesChanged now

    monkeypatch.setattr(DaemonLink, "load_settings", load_settings)
    app: DesktopApp = app_factory()
    qtbot.waitUntil(lambda: bool(changed), timeout=10000)
    qtbot.waitUntil(lambda: bool(app.state.box_replicas), timeout=10000)
    assert [r.box for r in app.state.box_replicas] == ["box-b"]
