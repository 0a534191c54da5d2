"""One attempt of a download: the worker process (engines/hub/worker.py), its stall watchdog,
and the translation of its JSON lines into job progress and an ``Outcome``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engines.config.sections import HubSettings
from engines.core.filemodes import keep_user_umask
from engines.events.hub import DownloadState
from engines.hub.access import HubAccess
from engines.hub.jobs import Job

log = logging.getLogger(__name__)


def hash_while_downloading() -> bool:
    """Hash big files during the transfer (no wait after it) only with CPUs to spare: on a
    2-core machine the overlap slowed the whole pull by ~25 % (tests/perf/download_bench.py),
    while hashing after it cost ~10 %."""
    return (os.cpu_count() or 1) >= 4


@dataclass(frozen=True)
class Outcome:
    ok: bool
    code: str = ""
    retryable: bool = False
    message: str = ""


class Attempt:
    def __init__(
        self,
        job: Job,
        access: HubAccess,
        settings: HubSettings,
        *,
        python: str,
        logs_dir: Path,
        on_started: Callable[[], Awaitable[None]],
        on_progress: Callable[[], None],
        on_verifying: Callable[[], None],
    ) -> None:
        self.job = job
        self.access = access
        self.settings = settings
        self._python = python
        self._logs_dir = logs_dir
        self._on_started = on_started
        self._on_progress = on_progress
        self._on_verifying = on_verifying
        self.proc: asyncio.subprocess.Process | None = None

    def kill(self) -> None:
        """SIGKILL the worker's process group: immediate, whatever it is doing."""
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    async def run(self) -> Outcome:
        job, access, s = self.job, self.access, self.settings
        self._logs_dir.mkdir(parents=True, exist_ok=True)
        log_fh = (self._logs_dir / f"{job.id}.log").open("ab")
        proc = await asyncio.create_subprocess_exec(
            self._python,
            "-m",
            "engines.hub.worker",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=log_fh,
            env=access.worker_env(os.environ, read_timeout_s=s.read_timeout_s),
            start_new_session=True,
            preexec_fn=keep_user_umask(),  # it writes into the Hugging Face cache other tools share
        )
        self.proc = proc
        job.worker_pid = proc.pid
        outcome: Outcome | None = None
        try:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write((json.dumps(self._job_spec()) + "\n").encode())
            with contextlib.suppress(ConnectionError):
                await proc.stdin.drain()
            await self._on_started()
            while outcome is None or not outcome.ok:
                try:
                    raw = await asyncio.wait_for(proc.stdout.readline(), s.stall_timeout_s)
                except TimeoutError:
                    outcome = Outcome(
                        False,
                        "stalled",
                        True,
                        f"no data from {access.endpoint} for {s.stall_timeout_s:.0f} s",
                    )
                    break
                if not raw:
                    break
                outcome = self._on_message(raw) or outcome
        finally:
            self.kill()
            await proc.wait()
            if proc.stdin is not None:
                proc.stdin.close()
            log_fh.close()
            job.worker_pid = None
        if outcome is None:
            outcome = Outcome(
                False,
                "worker_died",
                True,
                f"the download worker stopped unexpectedly (exit {proc.returncode})",
            )
        return outcome

    def _job_spec(self) -> dict[str, Any]:
        job, access, s = self.job, self.access, self.settings
        return {
            "repo_id": job.repo_id,
            "revision": job.revision,
            "commit_sha": job.commit_sha,
            "endpoint": access.endpoint,
            "cache_dir": str(access.cache_dir),
            "token": access.token,
            "files": [asdict(f) for f in job.files],
            "parallel_files": s.parallel_files,
            "hash_while_downloading": hash_while_downloading(),
        }

    def _on_message(self, raw: bytes) -> Outcome | None:
        job = self.job
        try:
            msg = json.loads(raw)
        except ValueError:
            log.warning("download worker %s said %r", job.id, raw[:200])
            return None
        kind = msg.get("type")
        if kind == "file_start":
            job.current_file = str(msg["path"])
        elif kind in ("progress", "file_done"):
            job.done_bytes = int(msg["done_bytes"])
            job.files_done += kind == "file_done"
            job.rate.add(job.done_bytes)
            self._on_progress()
        elif kind in ("verify", "verify_progress"):
            job.current_file = str(msg.get("path", ""))
            if job.state != DownloadState.VERIFYING:
                job.state = DownloadState.VERIFYING
                self._on_verifying()
        elif kind == "error":
            code = str(msg.get("code", "internal"))
            return Outcome(False, code, bool(msg.get("retryable")), self._advice(code, msg))
        elif kind == "done":
            job.snapshot_path = str(msg.get("snapshot_path", ""))
            log.info("download %s done; worker peak RSS %s KiB", job.id, msg.get("maxrss_kib"))
            return Outcome(True)
        return None

    def _advice(self, code: str, msg: dict[str, Any]) -> str:
        job, access = self.job, self.access
        detail = str(msg.get("message", ""))
        advice = {
            "gated": access.gated_advice(job.repo_id),
            "forbidden": access.gated_advice(job.repo_id),
            "not_found": f"{job.repo_id} (or one of its files) is gone from {access.endpoint}",
            "revision_not_found": f"{job.repo_id} no longer has commit {job.commit_sha[:12]}",
            "disk_full": f"the disk holding {access.cache_dir} is full: free some space or "
            "move the Hugging Face cache (HF_HOME), then resume",
            "network": f"lost the connection to {access.endpoint} ({detail})",
            "server": f"{access.endpoint} answered with a server error ({detail})",
            "integrity": f"{detail}; the bad files were deleted",
        }
        return advice.get(code, detail or code)
