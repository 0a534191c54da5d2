"""The few file operations traylm does itself in the shared Hugging Face cache.

Layout (huggingface_hub's): ``models--org--name/blobs/<etag>``,
``snapshots/<commit>/<path>`` (symlinks to blobs), ``refs/<branch>``. A download in progress
writes ``blobs/<etag>.<random>.incomplete``; huggingface_hub removes it on an exception, but a
killed worker leaves it behind, so traylm removes the ones its own worker left.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterable
from pathlib import Path

from engines.hub.names import cache_folder_name, validate_commit, validate_filename
from engines.hub.verify import ExpectedFile


def repo_dir(cache_dir: Path, repo_id: str) -> Path:
    return cache_dir / cache_folder_name(repo_id)


def snapshot_dir(cache_dir: Path, repo_id: str, commit_sha: str) -> Path:
    return repo_dir(cache_dir, repo_id) / "snapshots" / validate_commit(commit_sha)


def present_etags(cache_dir: Path, repo_id: str, files: Iterable[ExpectedFile]) -> set[str]:
    blobs = repo_dir(cache_dir, repo_id) / "blobs"
    return {f.etag for f in files if (blobs / f.etag).is_file()}


def incomplete_files(cache_dir: Path, repo_id: str, files: Iterable[ExpectedFile]) -> set[Path]:
    blobs = repo_dir(cache_dir, repo_id) / "blobs"
    if not blobs.is_dir():
        return set()
    found: set[Path] = set()
    for f in files:
        found.update(blobs.glob(f"{f.etag}.*incomplete"))
    return found


def remove_paths(paths: Iterable[Path]) -> int:
    """Remove files; returns the bytes freed."""
    freed = 0
    for p in paths:
        with contextlib.suppress(OSError):
            freed += p.stat().st_size
            p.unlink()
    return freed


def remove_added_files(
    cache_dir: Path,
    repo_id: str,
    commit_sha: str,
    files: Iterable[ExpectedFile],
    keep_etags: set[str],
) -> None:
    """Undo a cancelled download: drop the links and blobs it added (not the ones that were
    there before it started), then empty folders."""
    root = repo_dir(cache_dir, repo_id)
    snap = snapshot_dir(cache_dir, repo_id, commit_sha)
    for f in files:
        if f.etag in keep_etags:
            continue
        (snap / validate_filename(f.path)).unlink(missing_ok=True)
        (root / "blobs" / f.etag).unlink(missing_ok=True)
    _prune_empty(snap)
    snapshots = root / "snapshots"
    if root.is_dir() and (not snapshots.is_dir() or not any(snapshots.iterdir())):
        blobs = root / "blobs"
        if not blobs.is_dir() or not any(blobs.iterdir()):
            shutil.rmtree(root, ignore_errors=True)


def _prune_empty(folder: Path) -> None:
    if not folder.is_dir():
        return
    for sub in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if sub.is_dir() and not sub.is_symlink():
            with contextlib.suppress(OSError):
                sub.rmdir()
    with contextlib.suppress(OSError):
        folder.rmdir()


def free_bytes(path: Path) -> int:
    """Free space on the filesystem that holds ``path`` (or its nearest existing parent)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free
