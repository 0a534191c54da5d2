"""Faults a download must survive or report clearly, injected by the FAKE Hub (5xx, stalls,
truncated and corrupted bodies) or done to the worker (kill -9), plus cancel and pause/resume.
In every case nothing is marked ready unless every file's hash matched."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest

from engines.events import DownloadState, DownloadStateChanged
from tests.conftest import RunningDaemon
from tests.engines.hub.conftest import (
    EventLog,
    big_repo,
    cache_repo,
    wait_download,
    wait_for,
)
from tests.fakes.hub_server import FakeHub

BIG = "traylm-test/big"
DONE = (DownloadState.READY, DownloadState.FAILED, DownloadState.CANCELLED)


def shard(hub: FakeHub, n: int, repo: str = BIG) -> str:
    """The CDN path of weight shard ``n`` (1-based)."""
    return f"/cdn/{hub.repos[repo].files[f'model-0000{n}-of-00002.safetensors'].sha256}"


def incomplete(hf_home: Path, repo: str = BIG) -> list[Path]:
    blobs = cache_repo(hf_home, repo) / "blobs"
    return sorted(blobs.glob("*.incomplete")) if blobs.is_dir() else []


async def _downloading_weights(d: RunningDaemon, download_id: str, min_bytes: int) -> int:
    """Wait until the worker has fetched ``min_bytes`` of the download; returns its pid."""
    pid = 0

    async def check() -> bool:
        nonlocal pid
        s = await d.client.download(download_id)
        pid = s.worker_pid or 0
        return bool(pid) and s.done_bytes >= min_bytes

    await wait_for(check, 30)
    return pid


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def test_cancel_mid_file_kills_the_worker_at_once_and_keeps_nothing(
    hub_daemon: RunningDaemon, fake_hub: FakeHub, hf_home: Path
) -> None:
    fake_hub.add_repo(big_repo())
    fake_hub.faults.throttle(8e6, "/cdn/*")
    status = await hub_daemon.client.pull(BIG)
    pid = await _downloading_weights(hub_daemon, status.id, 10 << 20)
    loop = asyncio.get_running_loop()
    began = loop.time()
    cancelled = await hub_daemon.client.download_action(status.id, "cancel")
    took_s = loop.time() - began
    assert cancelled.state == DownloadState.CANCELLED
    assert gone(pid), "the worker must be dead when cancel returns"
    assert took_s < 3, f"cancel took {took_s:.1f} s"
    assert not cache_repo(hf_home, BIG).exists(), "a cancelled download leaves nothing behind"
    assert all(m.repo_id != BIG for m in await hub_daemon.client.local_models())


@pytest.mark.slow
async def test_kill_9_of_the_worker_is_retried_and_never_marked_ready_before_verification(
    hub_daemon_factory, fake_hub: FakeHub, hf_home: Path
) -> None:
    d = await hub_daemon_factory(retry_backoff_s=2.0, retry_backoff_max_s=2.0)
    fake_hub.add_repo(big_repo())
    fake_hub.faults.throttle(8e6, "/cdn/*")
    status = await d.client.pull(BIG)
    pid = await _downloading_weights(d, status.id, 10 << 20)
    assert incomplete(hf_home), "the worker is writing its temporary files"
    os.kill(pid, signal.SIGKILL)
    retrying = await wait_download(d, status.id, (DownloadState.RETRYING, DownloadState.READY))
    assert retrying.state == DownloadState.RETRYING
    assert retrying.error_code == "worker_died" and "exit -9" in retrying.message
    assert incomplete(hf_home) == [], "the killed worker's partial files are removed"
    [local] = [m for m in await d.client.local_models() if m.repo_id == BIG]
    assert local.verified == "unverified"
    fake_hub.faults.throttle(None)
    final = await wait_download(d, status.id, DONE)
    assert final.state == DownloadState.READY and final.attempts == 2
    [local] = [m for m in await d.client.local_models() if m.repo_id == BIG]
    assert local.verified == "verified"


async def test_a_stalled_transfer_is_restarted_by_the_watchdog(
    hub_daemon_factory, fake_hub: FakeHub
) -> None:
    d = await hub_daemon_factory(stall_timeout_s=2.0, read_timeout_s=60)
    fake_hub.add_repo(big_repo(weight_bytes=8 << 20))
    fake_hub.faults.stall(shard(fake_hub, 1), after_bytes=1 << 20, seconds=None)
    status = await d.client.pull(BIG)
    final = await wait_download(d, status.id, DONE)
    assert final.state == DownloadState.READY, final.message
    assert final.attempts == 2


CHUNK = 10 << 20  # huggingface_hub writes the body in 10 MiB chunks (DOWNLOAD_CHUNK_SIZE)


async def test_a_short_stall_resumes_in_place_from_the_last_whole_chunk(
    hub_daemon_factory, fake_hub: FakeHub
) -> None:
    """Measured: within one run huggingface_hub resumes with a Range request, but only from the
    last whole 10 MiB chunk it wrote; bytes of a partial chunk are fetched again."""
    d = await hub_daemon_factory(stall_timeout_s=30.0, read_timeout_s=1)
    fake_hub.add_repo(big_repo(weight_bytes=32 << 20))
    path = shard(fake_hub, 1)
    size = fake_hub.repos[BIG].files["model-00001-of-00002.safetensors"].size
    fake_hub.faults.stall(path, after_bytes=14 << 20, seconds=4)
    status = await d.client.pull(BIG)
    final = await wait_download(d, status.id, DONE)
    assert final.state == DownloadState.READY and final.attempts == 1
    gets = [r for r in fake_hub.requests if r.path == path and r.method == "GET"]
    assert [r.range for r in gets] == [None, f"bytes={CHUNK}-"]
    assert fake_hub.bytes_served(path) == size + (14 << 20) - CHUNK


async def test_server_errors_are_retried_with_backoff(
    hub_daemon: RunningDaemon, fake_hub: FakeHub
) -> None:
    fake_hub.faults.fail("/cdn/*", status=503, times=2, methods=("GET",))
    log = EventLog(hub_daemon, ("download",))
    await log.opened()
    status = await hub_daemon.client.pull("traylm-test/tiny-llama")
    final = await wait_download(hub_daemon, status.id, DONE)
    await log.close()
    assert final.state == DownloadState.READY, final.message
    assert final.attempts >= 2
    retries = [
        e.status
        for e in log.events
        if isinstance(e, DownloadStateChanged) and e.status.state == DownloadState.RETRYING
    ]
    assert retries and retries[0].error_code == "server" and "retrying in" in retries[0].message


async def test_a_truncated_body_is_resumed_within_the_run(
    hub_daemon: RunningDaemon, fake_hub: FakeHub
) -> None:
    fake_hub.add_repo(big_repo(weight_bytes=32 << 20))
    path = shard(fake_hub, 2)
    fake_hub.faults.truncate(path, after_bytes=12 << 20)
    status = await hub_daemon.client.pull(BIG)
    final = await wait_download(hub_daemon, status.id, DONE)
    assert final.state == DownloadState.READY and final.attempts == 1, final.message
    gets = [r for r in fake_hub.requests if r.path == path and r.method == "GET"]
    assert [r.range for r in gets] == [None, f"bytes={CHUNK}-"]


async def test_a_corrupted_file_is_caught_by_verification_and_never_ready(
    hub_daemon: RunningDaemon, fake_hub: FakeHub, hf_home: Path
) -> None:
    fake_hub.add_repo(big_repo(weight_bytes=4 << 20))
    fake_hub.faults.corrupt(shard(fake_hub, 1))  # every time: a bad mirror, not a blip
    status = await hub_daemon.client.pull(BIG)
    final = await wait_download(hub_daemon, status.id, DONE)
    assert final.state == DownloadState.FAILED
    assert final.error_code == "integrity"
    assert "model-00001-of-00002.safetensors" in final.message
    assert "gave up after 4 attempts" in final.message
    repo = fake_hub.repos[BIG]
    blob = (
        cache_repo(hf_home, BIG) / "blobs" / repo.files["model-00001-of-00002.safetensors"].sha256
    )
    assert not blob.exists(), "the bad file is deleted"
    assert all(m.verified != "verified" for m in await hub_daemon.client.local_models())


async def test_a_corrupted_transfer_once_is_fetched_again_and_then_ready(
    hub_daemon: RunningDaemon, fake_hub: FakeHub
) -> None:
    fake_hub.add_repo(big_repo(weight_bytes=4 << 20))
    fake_hub.faults.corrupt(shard(fake_hub, 2), times=1)
    status = await hub_daemon.client.pull(BIG)
    final = await wait_download(hub_daemon, status.id, DONE)
    assert final.state == DownloadState.READY and final.attempts == 2


async def test_pause_resume_keeps_finished_files_and_restarts_the_current_one(
    hub_daemon_factory, fake_hub: FakeHub
) -> None:
    """The measurement behind RESUME_NOTE, with the installed huggingface_hub."""
    d = await hub_daemon_factory(parallel_files=1)
    repo = fake_hub.add_repo(big_repo(weight_bytes=32 << 20))
    first, second = shard(fake_hub, 1), shard(fake_hub, 2)
    size = repo.files["model-00002-of-00002.safetensors"].size
    fake_hub.faults.throttle(8e6, second)
    status = await d.client.pull(BIG)
    await wait_for(lambda: fake_hub.bytes_served(second) >= 10 << 20, 30)
    paused = await d.client.download_action(status.id, "pause")
    assert paused.state == DownloadState.PAUSED
    assert "starts again from its beginning" in paused.resume_note
    partial = fake_hub.bytes_served(second)
    fake_hub.faults.throttle(None)
    await d.client.download_action(status.id, "resume")
    final = await wait_download(d, status.id, DONE)
    assert final.state == DownloadState.READY
    assert fake_hub.bytes_served(first) == size, "the finished file is not fetched again"
    gets = [r for r in fake_hub.requests if r.path == second and r.method == "GET"]
    assert [r.range for r in gets] == [None, None], "the second file restarts from byte 0"
    assert fake_hub.bytes_served(second) == size + partial
    mib = 2**20
    print(f"paused at {partial / mib:.1f} of {size / mib:.1f} MiB: resume fetched it all again")


async def test_a_download_running_when_the_daemon_stops_is_paused_after_restart(
    hub_daemon_factory, fake_hub: FakeHub, paths
) -> None:
    d = await hub_daemon_factory()
    fake_hub.add_repo(big_repo())
    fake_hub.faults.throttle(8e6, "/cdn/*")
    status = await d.client.pull(BIG)
    pid = await _downloading_weights(d, status.id, 10 << 20)
    d.daemon.request_stop("test")
    await wait_for(lambda: not paths.daemon_json.exists(), 30)
    assert gone(pid), "the daemon's shutdown kills its download workers"
    fake_hub.faults.throttle(None)
    d2 = await hub_daemon_factory()
    after = await d2.client.download(status.id)
    assert after.state == DownloadState.PAUSED and "traylm stopped" in after.message
    await d2.client.download_action(status.id, "resume")
    final = await wait_download(d2, status.id, DONE)
    assert final.state == DownloadState.READY


async def test_temp_files_abandoned_by_a_dead_worker_are_removed_but_live_ones_kept(
    hub_daemon: RunningDaemon, fake_hub: FakeHub, hf_home: Path
) -> None:
    """A daemon killed with -9 takes its worker with it (the worker stops when its stdin
    closes), leaving a temporary file that nobody will ever reuse."""
    repo_id = "traylm-test/tiny-llama"
    sha = fake_hub.repos[repo_id].files["model-00001-of-00002.safetensors"].sha256
    blobs = cache_repo(hf_home, repo_id) / "blobs"
    blobs.mkdir(parents=True)
    dead = blobs / f"{sha}.0badf00d.incomplete"
    live = blobs / f"{sha}.1ive1ive.incomplete"
    dead.write_bytes(b"x" * 1000)
    live.write_bytes(b"y" * 1000)
    os.utime(dead, (1, 1))  # untouched for a long time
    status = await hub_daemon.client.pull(repo_id)
    final = await wait_download(hub_daemon, status.id, DONE)
    assert final.state == DownloadState.READY
    assert not dead.exists() and live.exists()


async def test_one_at_a_time_a_queued_download_waits_and_a_paused_one_stays_paused(
    hub_daemon_factory: Any, fake_hub: FakeHub
) -> None:
    """hub.parallel_downloads = 1: the downloads are queued jobs (engines/core/jobs.py); the
    second waits for the first; one paused while it waits is not started when its turn comes;
    a resumed one runs."""
    d: RunningDaemon = await hub_daemon_factory(parallel_downloads=1)
    fake_hub.add_repo(big_repo())
    fake_hub.faults.throttle(8e6, "/cdn/*")
    first = await d.client.pull(BIG)
    await _downloading_weights(d, first.id, 1 << 20)
    second = await d.client.pull("traylm-test/tiny-llama")
    assert (await d.client.download(second.id)).state == DownloadState.QUEUED
    paused = await d.client.download_action(second.id, "pause")
    assert paused.state == DownloadState.PAUSED
    fake_hub.faults.throttle(None)
    await wait_download(d, first.id, DONE)
    assert (await d.client.download(second.id)).state == DownloadState.PAUSED
    await d.client.download_action(second.id, "resume")
    assert (await wait_download(d, second.id, DONE)).state == DownloadState.READY
