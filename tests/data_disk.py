"""A real full disk for tests: traylm's data folder on a small tmpfs of its own (a mount needs
root; without it the test is skipped, saying why), filled with a file and emptied again."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from engines.config.sections import Paths

TMPFS_SIZE = "4m"


class DataDisk:
    """The data folder on its own tmpfs; ``fill`` takes all its room, ``free`` gives it back."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.filler = folder / "filler.bin"

    def fill(self) -> None:
        with self.filler.open("ab", buffering=0) as f:
            with contextlib.suppress(OSError):  # ENOSPC: full
                while True:
                    f.write(b"\0" * 65536)
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0")

    def free(self) -> None:
        self.filler.unlink()


@contextlib.contextmanager
def tmpfs_data_folder(paths: Paths) -> Iterator[DataDisk]:
    """Mount it before the daemon starts and leave this only after it stopped (unmounted
    lazily if something still holds a file there)."""
    paths.data_dir.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0700", "tmpfs", paths.data_dir],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield DataDisk(paths.data_dir)
    finally:
        if subprocess.run(["umount", paths.data_dir], check=False).returncode != 0:
            subprocess.run(["umount", "-l", paths.data_dir], check=True)
