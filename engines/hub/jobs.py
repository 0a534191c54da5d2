"""One download job (mutable, owned by the DownloadManager on the event loop) and its rate meter.
The UI only ever sees the frozen ``DownloadStatus`` made by ``Job.status()``."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

from engines.events.hub import DownloadState, DownloadStatus
from engines.hub.verify import ExpectedFile

RATE_WINDOW_S = 5.0


class RateMeter:
    def __init__(self) -> None:
        self._samples: deque[tuple[float, int]] = deque()

    def reset(self) -> None:
        self._samples.clear()

    def add(self, done_bytes: int, now_s: float | None = None) -> None:
        now = time.monotonic() if now_s is None else now_s
        self._samples.append((now, done_bytes))
        while len(self._samples) > 2 and now - self._samples[0][0] > RATE_WINDOW_S:
            self._samples.popleft()

    @property
    def bytes_per_s(self) -> float:
        if len(self._samples) < 2:
            return 0.0
        (t0, b0), (t1, b1) = self._samples[0], self._samples[-1]
        return max(0.0, (b1 - b0) / (t1 - t0)) if t1 > t0 else 0.0


@dataclass
class Job:
    id: str
    repo_id: str
    revision: str
    commit_sha: str
    files: tuple[ExpectedFile, ...]
    state: DownloadState = DownloadState.QUEUED
    attempts: int = 0
    error_code: str = ""
    message: str = ""
    done_bytes: int = 0
    files_done: int = 0
    current_file: str = ""
    worker_pid: int | None = None
    snapshot_path: str = ""
    present_before: frozenset[str] = frozenset()
    created_s: float = field(default_factory=time.time)
    updated_s: float = field(default_factory=time.time)
    rate: RateMeter = field(default_factory=RateMeter)
    stop_reason: str = ""  # "pause" | "cancel" | "shutdown" while the worker is being stopped

    @property
    def total_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)

    @property
    def active(self) -> bool:
        return self.state in (
            DownloadState.QUEUED,
            DownloadState.DOWNLOADING,
            DownloadState.VERIFYING,
            DownloadState.RETRYING,
        )

    def eta_s(self) -> float | None:
        rate = self.rate.bytes_per_s
        if rate <= 0 or self.state != DownloadState.DOWNLOADING:
            return None
        return max(0.0, (self.total_bytes - self.done_bytes) / rate)

    def status(self, resume_note: str) -> DownloadStatus:
        return DownloadStatus(
            id=self.id,
            repo_id=self.repo_id,
            revision=self.revision,
            commit_sha=self.commit_sha,
            state=self.state,
            files_total=len(self.files),
            files_done=self.files_done,
            total_bytes=self.total_bytes,
            done_bytes=self.done_bytes,
            rate_bytes_per_s=round(self.rate.bytes_per_s, 1),
            eta_s=self.eta_s(),
            current_file=self.current_file,
            attempts=self.attempts,
            error_code=self.error_code,
            message=self.message,
            created_s=self.created_s,
            updated_s=self.updated_s,
            worker_pid=self.worker_pid,
            resume_note=resume_note,
            snapshot_path=self.snapshot_path,
        )

    def to_row(self) -> dict[str, Any]:
        return {
            "commit_sha": self.commit_sha,
            "files": [asdict(f) for f in self.files],
            "attempts": self.attempts,
            "error_code": self.error_code,
            "message": self.message,
            "done_bytes": self.done_bytes,
            "files_done": self.files_done,
            "snapshot_path": self.snapshot_path,
            "present_before": sorted(self.present_before),
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Job:
        data = row["data"]
        return cls(
            id=row["id"],
            repo_id=row["repo_id"],
            revision=row["revision"] or "main",
            commit_sha=data.get("commit_sha", ""),
            files=tuple(ExpectedFile(**f) for f in data.get("files", [])),
            state=DownloadState(row["state"]),
            attempts=int(data.get("attempts", 0)),
            error_code=str(data.get("error_code", "")),
            message=str(data.get("message", "")),
            done_bytes=int(data.get("done_bytes", 0)),
            files_done=int(data.get("files_done", 0)),
            snapshot_path=str(data.get("snapshot_path", "")),
            present_before=frozenset(data.get("present_before", [])),
            created_s=float(row["created_s"]),
            updated_s=float(row["updated_s"]),
        )
