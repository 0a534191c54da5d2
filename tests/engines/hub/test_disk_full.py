"""A full disk, for real: the HF cache on a 24 MiB tmpfs (mounted when the tests run as root,
as they do in this project's containers; skipped otherwise). The pre-check refuses a model that
cannot fit; a disk that fills up during the download fails it once, with what to do, and leaves
nothing marked ready and no partial files."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engines.config.sections import Paths
from engines.errors import ControlAPIError
from engines.events import DownloadState
from tests.conftest import RunningDaemon
from tests.data_disk import DataDisk, tmpfs_data_folder
from tests.engines.hub.conftest import big_repo, cache_repo, wait_download, wait_for
from tests.fakes.hub_server import FakeHub

SIZE_MIB = 24


@pytest.fixture
def small_disk(hf_home: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (the project's test containers are)")
    mount = hf_home / "hub"
    mount.mkdir(parents=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SIZE_MIB}m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(folder: Path) -> int:
    """Write until the filesystem is full; returns the bytes written."""
    written = 0
    block = b"\0" * (1 << 20)
    with (folder / "filler").open("wb") as fh, contextlib.suppress(OSError):
        while True:
            try:
                fh.write(block)
                fh.flush()
                written += len(block)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                raise
    return written


async def test_a_model_larger_than_the_free_space_is_refused_before_downloading(
    hub_daemon: RunningDaemon, fake_hub: FakeHub, small_disk: Path, hf_home: Path
) -> None:
    fake_hub.add_repo(big_repo("traylm-test/too-big", weight_bytes=48 << 20))
    with pytest.raises(ControlAPIError) as err:
        await hub_daemon.client.pull("traylm-test/too-big")
    assert err.value.code == "disk_full" and err.value.http_status == 507
    assert "free" in err.value.message and str(small_disk) in err.value.message
    assert not cache_repo(hf_home, "traylm-test/too-big").exists()
    assert not any(r.path.startswith("/cdn/") for r in fake_hub.requests)


async def test_a_disk_that_fills_during_the_download_fails_it_cleanly(
    hub_daemon: RunningDaemon, fake_hub: FakeHub, small_disk: Path, hf_home: Path
) -> None:
    repo_id = "traylm-test/fits-at-first"
    fake_hub.add_repo(big_repo(repo_id, weight_bytes=16 << 20))
    fake_hub.faults.throttle(4e6, "/cdn/*")
    status = await hub_daemon.client.pull(repo_id)
    await wait_for(lambda: fake_hub.bytes_served() > 1 << 20, 30)
    filled = _fill(small_disk)  # another program takes the space meanwhile
    assert filled > 0
    final = await wait_download(hub_daemon, status.id, (DownloadState.READY, DownloadState.FAILED))
    assert final.state == DownloadState.FAILED
    assert final.error_code == "disk_full" and final.attempts == 1, final.message
    assert "is full" in final.message and "HF_HOME" in final.message
    blobs = cache_repo(hf_home, repo_id) / "blobs"
    assert not list(blobs.glob("*.incomplete")), "partial files are removed"
    assert all(m.verified != "verified" for m in await hub_daemon.client.local_models())


@pytest.fixture
def full_data_folder(paths: Paths) -> Iterator[DataDisk]:
    """traylm's data folder (the SQLite store) on its own tmpfs, set up before the daemon."""
    with tmpfs_data_folder(paths) as disk:
        yield disk


async def test_a_pull_goes_on_while_the_store_cannot_save_its_state(
    full_data_folder: DataDisk,
    hub_daemon_factory: Callable[..., Any],
    fake_hub: FakeHub,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The data folder (not the model cache) is full: the download's state is not saved, but
    the download goes on to READY in memory and in its events, with no traceback."""
    d: RunningDaemon = await hub_daemon_factory()
    full_data_folder.fill()
    status = await d.client.pull("traylm-test/tiny-llama")
    final = await wait_download(d, status.id, (DownloadState.READY, DownloadState.FAILED))
    assert final.state == DownloadState.READY, final.message
    assert not [r.getMessage() for r in caplog.records if r.exc_info]
    full_data_folder.free()
