"""``daemon.json``: how every client (the CLI, the tray app) finds the running daemon: its pid,
URL, port, control token and version, mode 0600, written once the gateway serves. Kept while
the daemon runs (written again when it was removed or changed), removed on the way out only by
the daemon that wrote it."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path

from engines.config.tomlfile import write_bytes_atomic

log = logging.getLogger(__name__)

CHECK_S = 2.0


class DaemonFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._info: dict[str, object] = {}

    def write(self, info: Mapping[str, object]) -> None:
        self._info = {"pid": os.getpid(), **info}
        self._write()

    async def keep(self) -> None:
        """Write it again when it was deleted or overwritten (runs until cancelled)."""
        while True:
            await asyncio.sleep(CHECK_S)
            try:
                if not await asyncio.to_thread(self._intact):
                    await asyncio.to_thread(self._write)
                    log.warning("%s was removed or changed; wrote it again", self.path)
            except OSError as exc:
                log.warning("cannot write %s: %s", self.path, exc.strerror)

    def remove(self) -> None:
        """Remove it if this process wrote it (a newer daemon's file stays)."""
        try:
            if json.loads(self.path.read_text())["pid"] == os.getpid():
                self.path.unlink()
        except (OSError, ValueError, KeyError):
            pass

    def _write(self) -> None:
        write_bytes_atomic(self.path, json.dumps(self._info).encode(), mode=0o600)

    def _intact(self) -> bool:
        try:
            return bool(json.loads(self.path.read_text()) == self._info)
        except (OSError, ValueError):
            return False
