"""Private files: traylm's folders are open only to their owner (0700), and so are its files
(0600). The database holds chat history, the logs hold engine output (prompts can appear in
it), daemon.json holds the control token.

``private_umask()`` makes every file and folder this process creates from then on private (the
``traylm`` command calls it first, so the daemon and every subcommand run under it).
``make_private(paths)`` fixes an install whose files were created before (0644 files in 0755
folders); the daemon runs it at start. Subprocesses that write outside traylm's folders (engines,
Hub downloads into the Hugging Face cache other tools share) get the user's own umask back
(``keep_user_umask()``), so traylm changes nothing about files that are not its own.
"""

from __future__ import annotations

import functools
import logging
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from engines.config.paths import Paths

log = logging.getLogger(__name__)

DIR_MODE = 0o700
FILE_MODE = 0o600
PRIVATE_UMASK = 0o077

_user_umask: int | None = None


def private_umask() -> None:
    """From now on this process creates files 0600 and folders 0700 (idempotent)."""
    global _user_umask
    previous = os.umask(PRIVATE_UMASK)
    if _user_umask is None:
        _user_umask = previous


def user_umask() -> int:
    """The umask the user started traylm with (for subprocesses writing outside its folders)."""
    if _user_umask is not None:
        return _user_umask
    current = os.umask(PRIVATE_UMASK)
    os.umask(current)
    return current


def keep_user_umask() -> Callable[[], None]:
    """For ``preexec_fn``: the child gets the user's umask back (as ``umask=`` would, which
    uvloop's subprocess_exec does not take)."""
    return functools.partial(_set_umask, user_umask())


def _set_umask(mask: int) -> None:
    os.umask(mask)


def make_private(paths: Paths) -> list[str]:
    """Create traylm's folders 0700 and take group and other access away from the folders and
    the files that hold private data. Blocking (call from a thread). Returns one line per path
    whose mode changed (the daemon logs them once)."""
    fixed: list[str] = []
    for folder in (paths.config_dir, paths.data_dir, paths.state_dir, paths.cache_dir):
        folder.mkdir(parents=True, exist_ok=True)
        _tighten(folder, DIR_MODE, fixed)
    for path in _private_files(paths):
        _tighten(path, DIR_MODE if path.is_dir() else FILE_MODE, fixed)
    return fixed


def _private_files(paths: Paths) -> Iterator[Path]:
    """The config (settings, profiles, model folders), the database with its WAL and shared
    memory files, and the state folder (daemon.json, pids, locks, every log) with its
    subfolders. Engine venvs and built engines sit inside the 0700 data folder."""
    yield from paths.config_dir.rglob("*")
    yield from paths.data_dir.glob(f"{paths.db_path.name}*")
    yield from paths.state_dir.rglob("*")


def _tighten(path: Path, mode: int, fixed: list[str]) -> None:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.getuid():
        return  # a link's target is not ours to change; nor is another user's file
    current = stat.S_IMODE(st.st_mode)
    if current & 0o077:
        try:
            path.chmod((current | mode) & 0o700)
        except OSError as exc:
            log.warning("could not make %s private: %s", path, exc.strerror)
            return
        fixed.append(f"{path}: {current:o} -> {stat.S_IMODE(path.stat().st_mode):o}")
