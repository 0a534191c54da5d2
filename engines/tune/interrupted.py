"""What ran before a tune, kept on disk while it runs, so a daemon killed mid-tune (SIGKILL, a
crash, a power cut) starts it again at its next start and says the tune was interrupted.

``data/tune/running.json``: the tune's id and profile, and each engine the tune stopped, as its
profile ran (written atomically before each stop; removed once the tune has restored them, or
the daemon stops cleanly). Blocking file I/O: call from a thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from pathlib import Path

from engines.config.profiles import Profile, profile_from_mapping, profile_to_mapping
from engines.config.tomlfile import write_bytes_atomic
from engines.errors import ConfigError

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Interrupted:
    job_id: int
    profile: str
    started_s: float
    stopped: tuple[Profile, ...]


class RunningTuneFile:
    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, job_id: int, profile: str, started_s: float, stopped: list[Profile]) -> None:
        data = {
            "job_id": job_id,
            "profile": profile,
            "started_s": started_s,
            "stopped": [{"name": p.name, "fields": profile_to_mapping(p)} for p in stopped],
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(self.path, json.dumps(data).encode(), mode=0o600)

    def clear(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def take(self) -> Interrupted | None:
        """The tune a stopped daemon left running (the file removed), or None; an unreadable
        file is logged and dropped."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        self.clear()
        try:
            data = json.loads(raw)
            stopped = tuple(
                profile_from_mapping(str(p["name"]), p["fields"], where=str(self.path))
                for p in data["stopped"]
            )
            return Interrupted(
                int(data["job_id"]), str(data["profile"]), float(data["started_s"]), stopped
            )
        except (ValueError, KeyError, TypeError, ConfigError) as exc:
            log.warning("ignored %s, which cannot be read: %s", self.path, exc)
            return None
