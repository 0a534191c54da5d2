"""Batches (OpenAI's Batch API at the gateway, engines/batch/, `traylm batches`): a running
batch's counts as its lines finish, and its end."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from engines.events.codec import Event


@dataclasses.dataclass(frozen=True, kw_only=True)
class BatchProgress(Event):
    """A running batch: its counts, at most about once a second and at its start."""

    kind: ClassVar[str] = "batch.progress"
    batch_id: str
    status: str  # OpenAI's: validating | in_progress | finalizing | cancelling
    total: int
    completed: int
    failed: int
    model: str = ""  # "" when its lines ask for several


@dataclasses.dataclass(frozen=True, kw_only=True)
class BatchFinished(Event):
    """A batch ended: completed, cancelled, failed or expired (read it with GET
    /v1/batches/{id})."""

    kind: ClassVar[str] = "batch.finished"
    batch_id: str
    status: str  # completed | cancelled | failed | expired
    total: int
    completed: int
    failed: int
    detail: str = ""
