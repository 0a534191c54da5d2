"""The download worker on its own (a real subprocess, the real huggingface_hub, the FAKE Hub)
and the hash it takes while the file downloads."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from engines.hub.tailhash import TailHasher
from tests.fakes.hub_server import FakeHub, tiny_llama_repo


def _run_worker(hub: FakeHub, repo_id: str, cache: Path) -> list[dict]:
    repo = hub.repos[repo_id]
    files = [
        {
            "path": f.path,
            "size_bytes": f.size,
            "sha256": f.sha256 if f.lfs else None,
            "git_sha1": f.git_sha1,
        }
        for f in repo.files.values()
        if f.path.endswith((".safetensors", "config.json"))
    ]
    job = {
        "repo_id": repo_id,
        "commit_sha": repo.sha,
        "revision": "main",
        "endpoint": hub.url,
        "cache_dir": str(cache),
        "token": None,
        "files": files,
        "parallel_files": 2,
        "hash_while_downloading": True,
    }
    env = dict(os.environ, HF_ENDPOINT=hub.url, HF_HUB_DISABLE_PROGRESS_BARS="1")
    with subprocess.Popen(
        [sys.executable, "-m", "engines.hub.worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(job) + "\n")
        proc.stdin.flush()  # stdin stays open: the worker stops when its parent closes it
        lines = [json.loads(line) for line in proc.stdout]
    return lines


def test_the_worker_stops_when_its_parent_goes_away(fake_hub: FakeHub, tmp_path: Path) -> None:
    fake_hub.faults.throttle(1e5, "/cdn/*")
    repo = fake_hub.repos["traylm-test/tiny-llama"]
    f = repo.files["model-00001-of-00002.safetensors"]
    job = {
        "repo_id": repo.repo_id,
        "commit_sha": repo.sha,
        "endpoint": fake_hub.url,
        "cache_dir": str(tmp_path),
        "files": [{"path": f.path, "size_bytes": f.size, "sha256": f.sha256, "git_sha1": "0"}],
    }
    with subprocess.Popen(
        [sys.executable, "-m", "engines.hub.worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        env=dict(os.environ, HF_ENDPOINT=fake_hub.url),
    ) as proc:
        assert proc.stdin is not None
        proc.stdin.write((json.dumps(job) + "\n").encode())
        proc.stdin.close()  # the daemon died
        assert proc.wait(20) == 3


def test_big_files_are_hashed_while_they_download(fake_hub: FakeHub, tmp_path: Path) -> None:
    fake_hub.add_repo(tiny_llama_repo("traylm-test/big", weight_bytes=64 << 20))
    fake_hub.faults.throttle(32e6, "/cdn/*")
    lines = _run_worker(fake_hub, "traylm-test/big", tmp_path / "cache")
    assert lines[-1]["type"] == "done"
    verified = {m["path"]: m["hashed_while_downloading"] for m in lines if m["type"] == "verify"}
    assert verified["model-00001-of-00002.safetensors"] is True
    assert verified["config.json"] is False  # small files are hashed after, in full


def test_a_served_corruption_is_not_confirmed_and_gets_the_full_check(
    fake_hub: FakeHub, tmp_path: Path
) -> None:
    repo = fake_hub.add_repo(tiny_llama_repo("traylm-test/big", weight_bytes=64 << 20))
    shard = repo.files["model-00002-of-00002.safetensors"]
    fake_hub.faults.corrupt(f"/cdn/{shard.sha256}")
    lines = _run_worker(fake_hub, "traylm-test/big", tmp_path / "cache")
    assert lines[-1]["type"] == "error" and lines[-1]["code"] == "integrity"
    assert "model-00002-of-00002.safetensors" in lines[-1]["message"]


def _writer(path: Path, chunks: list[bytes], final: Path, rewind_after: int | None) -> None:
    with path.open("wb") as fh:
        for i, chunk in enumerate(chunks):
            fh.write(chunk)
            fh.flush()
            time.sleep(0.01)
            if rewind_after == i:
                fh.seek(0)
                fh.truncate()
                fh.write(b"".join(chunks[: i + 1]))
                fh.flush()
    path.rename(final)


def test_tail_hash_matches_a_file_appended_then_renamed(tmp_path: Path) -> None:
    chunks = [os.urandom(1 << 20) for _ in range(20)]
    data = b"".join(chunks)
    etag = hashlib.sha256(data).hexdigest()
    hasher = TailHasher(tmp_path, etag, len(data))
    hasher.start()
    writer = threading.Thread(
        target=_writer, args=(tmp_path / f"{etag}.abc.incomplete", chunks, tmp_path / etag, None)
    )
    writer.start()
    writer.join()
    hasher.finish()
    assert hasher.digest == etag and hasher.inode == (tmp_path / etag).stat().st_ino


def test_tail_hash_is_not_trusted_after_a_rewind(tmp_path: Path) -> None:
    chunks = [os.urandom(1 << 20) for _ in range(20)]
    data = b"".join(chunks)
    etag = hashlib.sha256(data).hexdigest()
    hasher = TailHasher(tmp_path, etag, len(data))
    hasher.start()
    writer = threading.Thread(
        target=_writer, args=(tmp_path / f"{etag}.abc.incomplete", chunks, tmp_path / etag, 10)
    )
    writer.start()
    writer.join()
    hasher.invalidate()  # what the worker does when huggingface_hub reports a negative update
    hasher.finish()
    assert hasher.digest is None


def test_xet_progress_is_counted_once(monkeypatch) -> None:
    """Xet-backed repos (most of the real Hub) report network and disk bytes separately; the
    worker's progress must count the file once. The fake Hub serves no Xet, so this drives
    huggingface_hub's own Xet progress reporter with the worker's bar class directly."""
    from types import SimpleNamespace

    from huggingface_hub.utils._xet_progress_reporting import XetDownloadProgressReporter

    from engines.hub import worker

    seen: list[tuple[str, dict]] = []
    monkeypatch.setattr(worker, "emit", lambda kind, **data: seen.append((kind, data)))
    monkeypatch.setattr(worker, "PROGRESS_INTERVAL_S", 0.0)
    progress = worker.Progress()
    reporter = XetDownloadProgressReporter(
        reconstruction_desc="x",
        total=100 << 20,
        log_level=30,
        tqdm_class=progress.bar_class("model.safetensors"),
    )
    for done in (10, 60, 100):
        report = SimpleNamespace(
            total_bytes_completed=done << 20,
            total_transfer_bytes_completed=(done << 20) // 2,  # dedup: fewer network bytes
            total_bytes_completion_rate=None,
            total_transfer_bytes_completion_rate=None,
            total_bytes=100 << 20,
        )
        reporter.update_progress(report)
    reporter.close()
    assert seen[-1] == ("progress", {"done_bytes": 100 << 20, "current_file": "model.safetensors"})
