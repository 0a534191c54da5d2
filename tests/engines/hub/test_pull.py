"""A full pull through the daemon: the real huggingface_hub client in a worker process, against
the FAKE Hub on loopback; the model is ready only after every hash matched."""

from __future__ import annotations

import hashlib
from pathlib import Path

from engines.events import (
    DownloadProgress,
    DownloadState,
    DownloadStateChanged,
    LibraryChanged,
)
from tests.conftest import RunningDaemon
from tests.engines.hub.conftest import EventLog, cache_repo, wait_download, wait_for
from tests.fakes.hub_server import FakeHub

REPO = "traylm-test/tiny-llama"


async def test_full_pull_is_verified_pinned_and_fetches_only_engine_files(
    hub_daemon: RunningDaemon, fake_hub: FakeHub, hf_home: Path
) -> None:
    log = EventLog(hub_daemon, ("download", "library"))
    await log.opened()  # the SSE subscription is open before the pull starts
    status = await hub_daemon.client.pull(REPO)
    repo = fake_hub.repos[REPO]
    assert status.commit_sha == repo.sha
    assert status.state == DownloadState.QUEUED
    final = await wait_download(hub_daemon, status.id, (DownloadState.READY, DownloadState.FAILED))
    assert final.state == DownloadState.READY, final.message
    assert final.done_bytes == final.total_bytes

    # the event stream trails the status the API answered with
    def states() -> list[DownloadState]:
        return [e.status.state for e in log.events if isinstance(e, DownloadStateChanged)]

    await wait_for(lambda: states()[-1:] == [DownloadState.READY], 10)
    await wait_for(lambda: any(isinstance(e, LibraryChanged) for e in log.events), 10)
    await log.close()

    # only engine files, at the pinned commit, each equal to the Hub's bytes
    snapshot = cache_repo(hf_home, REPO) / "snapshots" / repo.sha
    got = sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file())
    assert got == sorted(
        [
            "config.json",
            "generation_config.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
            "special_tokens_map.json",
            "tokenizer.json",
            "tokenizer_config.json",
        ]
    )
    for name in got:
        fake = repo.files[name]
        assert hashlib.sha256((snapshot / name).read_bytes()).hexdigest() == fake.sha256
    assert (cache_repo(hf_home, REPO) / "refs" / "main").read_text() == repo.sha
    fetched = {r.path for r in fake_hub.requests if r.method == "GET"}
    assert not any(p.endswith(("pytorch_model.bin", "README.md", "params.json")) for p in fetched)

    # events: state changes through downloading to ready, progress with bytes, library refresh
    seen = states()
    assert seen[0] == DownloadState.DOWNLOADING or DownloadState.QUEUED in seen
    assert seen[-1] == DownloadState.READY
    assert DownloadState.VERIFYING in seen
    progress = [e for e in log.events if isinstance(e, DownloadProgress)]
    assert progress and progress[-1].done_bytes == final.total_bytes
    assert any(isinstance(e, LibraryChanged) and e.reason == "downloaded" for e in log.events)

    # the library lists it as verified, with the engines that can serve a Llama
    [local] = await hub_daemon.client.local_models()
    assert (local.repo_id, local.commit_sha, local.verified) == (REPO, repo.sha, "verified")
    assert local.engines == ("vllm", "trtllm")
    assert "main" in local.refs


async def test_a_second_pull_of_a_ready_model_downloads_nothing(
    hub_daemon: RunningDaemon, fake_hub: FakeHub
) -> None:
    first = await hub_daemon.client.pull(REPO)
    await wait_download(hub_daemon, first.id, (DownloadState.READY,))
    served = fake_hub.bytes_served()
    second = await hub_daemon.client.pull(REPO)
    final = await wait_download(hub_daemon, second.id, (DownloadState.READY,))
    assert final.message.startswith("all ")
    assert fake_hub.bytes_served() == served  # verified from the cache, not fetched again
