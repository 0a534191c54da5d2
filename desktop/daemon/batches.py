"""The batches running or waiting in the daemon (/api/status ``batches``: OpenAI Batch
objects), as the tray tooltip and the dashboard say them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def batch_text(status: Mapping[str, object]) -> str:
    """One line while batches run or wait: the first one's progress; else ""."""
    batches = status.get("batches")
    if not isinstance(batches, Sequence) or not batches or not isinstance(batches[0], Mapping):
        return ""
    counts = batches[0].get("request_counts")
    counts = counts if isinstance(counts, Mapping) else {}
    done = int(counts.get("completed", 0)) + int(counts.get("failed", 0))
    more = f" (+{len(batches) - 1} waiting)" if len(batches) > 1 else ""
    return f"batch: {done}/{counts.get('total', 0)} done{more}"
