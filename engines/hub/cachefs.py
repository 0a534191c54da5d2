"""The few file operations traylm does itself in the shared Hugging Face cache.

Layout (huggingface_hub's): ``models--org--name/blobs/<etag>``,
``snapshots/<commit>/<path>`` (symlinks to blobs), ``refs/<branch>``. A download in progress
writes ``blobs/<etag>.<random>.incomplete``; huggingface_hub removes it on an exception, but a
killed worker leaves it behind, so traylm removes the ones its own worker left.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from engines.hub.names import (
    COMMIT_RE,
    cache_folder_name,
    repo_id_from_cache_folder,
    validate_commit,
    validate_filename,
)
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


def remove_stale_incomplete(
    cache_dir: Path, repo_id: str, files: Iterable[ExpectedFile], older_than_s: float
) -> int:
    """Temporary files nobody writes any more (a worker that died with its daemon): a live
    download touches its file every few seconds, so an old mtime means it is abandoned."""
    limit = time.time() - older_than_s
    stale = []
    for path in incomplete_files(cache_dir, repo_id, files):
        with contextlib.suppress(OSError):
            if path.stat().st_mtime < limit:
                stale.append(path)
    return remove_paths(stale)


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


# --------------------------------------------------------------------------- scan and delete


@dataclass(frozen=True)
class CachedRevision:
    """One snapshot in the cache. Unlike huggingface_hub's ``scan_cache_dir``, a snapshot with a
    broken link (a blob deleted or never finished) is listed, with the file in ``missing``."""

    repo_id: str
    commit_hash: str
    snapshot_path: Path
    refs: frozenset[str]
    size_on_disk: int
    nb_files: int
    last_modified: float
    missing: tuple[str, ...]


def scan_models(cache_dir: Path) -> list[CachedRevision]:
    if not cache_dir.is_dir():
        return []
    out = []
    for folder in sorted(cache_dir.iterdir()):
        repo_id = repo_id_from_cache_folder(folder.name)
        snapshots = folder / "snapshots"
        if repo_id is None or not snapshots.is_dir():
            continue
        refs = _refs(folder)
        for snap in sorted(snapshots.iterdir()):
            if snap.is_dir() and COMMIT_RE.match(snap.name):
                out.append(_revision(repo_id, snap, refs.get(snap.name, set())))
    return out


def _refs(folder: Path) -> dict[str, set[str]]:
    by_commit: dict[str, set[str]] = {}
    refs_dir = folder / "refs"
    if refs_dir.is_dir():
        for ref in refs_dir.rglob("*"):
            if ref.is_file():
                with contextlib.suppress(OSError):
                    commit = ref.read_text().strip()
                    by_commit.setdefault(commit, set()).add(ref.relative_to(refs_dir).as_posix())
    return by_commit


def _revision(repo_id: str, snap: Path, refs: set[str]) -> CachedRevision:
    blobs: dict[Path, int] = {}
    missing = []
    files = 0
    newest = snap.stat().st_mtime
    for link in snap.rglob("*"):
        if link.is_dir():
            continue
        files += 1
        target = link.resolve()
        try:
            st = target.stat()
        except OSError:
            missing.append(link.relative_to(snap).as_posix())
            continue
        blobs[target] = st.st_size
        newest = max(newest, st.st_mtime)
    return CachedRevision(
        repo_id=repo_id,
        commit_hash=snap.name,
        snapshot_path=snap,
        refs=frozenset(refs),
        size_on_disk=sum(blobs.values()),
        nb_files=files,
        last_modified=newest,
        missing=tuple(sorted(missing)),
    )


def delete_revisions(cache_dir: Path, repo_id: str, commits: Iterable[str]) -> int:
    """Delete snapshots and the blobs no other snapshot uses; returns the bytes freed."""
    root = repo_dir(cache_dir, repo_id)
    doomed = {validate_commit(c) for c in commits}
    keep_blobs: set[Path] = set()
    drop_blobs: set[Path] = set()
    for snap in (root / "snapshots").iterdir() if (root / "snapshots").is_dir() else ():
        targets = {p.resolve() for p in snap.rglob("*") if p.is_symlink()}
        (drop_blobs if snap.name in doomed else keep_blobs).update(targets)
    freed = remove_paths(drop_blobs - keep_blobs)
    for commit in doomed:
        shutil.rmtree(root / "snapshots" / commit, ignore_errors=True)
    refs_dir = root / "refs"
    for ref in list(refs_dir.rglob("*")) if refs_dir.is_dir() else []:
        with contextlib.suppress(OSError):
            if ref.is_file() and ref.read_text().strip() in doomed:
                ref.unlink()
    snapshots = root / "snapshots"
    if not snapshots.is_dir() or not any(snapshots.iterdir()):
        freed += remove_paths(p for p in root.rglob("*") if p.is_file())
        shutil.rmtree(root, ignore_errors=True)
    return freed
