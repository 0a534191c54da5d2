"""The tray says when the disk of the daemon's data folder is full, for real (a small tmpfs as
the data folder, filled while the daemon runs): a warning notification with the "Free space"
fix, and a line in the tooltip from /api/status's ``disk`` until there is room again."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from desktop.app import DesktopApp
from desktop.daemon.notify import Notification
from engines.config.sections import Paths
from engines.errors import ControlAPIError
from tests.data_disk import DataDisk, tmpfs_data_folder
from tests.desktop.conftest import AppFactory, ThreadedDaemon


@pytest.fixture
def data_disk(paths: Paths) -> Iterator[DataDisk]:
    """Set up before the daemon (listed before daemon_thread), unmounted after it stopped."""
    with tmpfs_data_folder(paths) as disk:
        yield disk


@pytest.fixture
def disk_app(
    data_disk: DataDisk, daemon_thread: ThreadedDaemon, app_factory: AppFactory
) -> DesktopApp:
    return app_factory()


def is_disk_full(note: Any) -> bool:
    return isinstance(note, Notification) and note.title == "Disk full"


@pytest.mark.slow
def test_the_tray_warns_of_a_full_disk_until_there_is_room(
    qtbot: Any, disk_app: DesktopApp, daemon_thread: ThreadedDaemon, data_disk: DataDisk
) -> None:
    app = disk_app
    assert daemon_thread.daemon is not None
    bus = daemon_thread.daemon.bus
    qtbot.waitUntil(lambda: bus.subscriber_count > 0, timeout=15000)  # the app's event stream
    assert "DISK FULL" not in app.tray.icon.toolTip()
    data_disk.fill()
    with (
        qtbot.waitSignal(app.notifier.notified, timeout=15000, check_params_cb=is_disk_full) as n,
        pytest.raises(ControlAPIError),
    ):
        daemon_thread.run(lambda c: c.create_chat(model="fake"))
    note = n.args[0]
    assert note.level == "warning" and str(daemon_thread.paths.data_dir) in note.message
    assert note.fix is not None and note.fix.label.startswith("Free space")
    qtbot.waitUntil(lambda: "DISK FULL" in app.tray.icon.toolTip(), timeout=15000)
    assert str(daemon_thread.paths.data_dir) in app.tray.icon.toolTip()

    data_disk.free()
    daemon_thread.run(lambda c: c.create_chat(model="fake"))
    qtbot.waitUntil(lambda: "DISK FULL" not in app.tray.icon.toolTip(), timeout=15000)
