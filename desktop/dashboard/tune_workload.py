"""What the Tune page offers to tune against, and the user's recorded traffic as a workload file.

The presets are the tuner's (engines/tune/workloads.py); "my recorded traffic" is the request
recorder's export (what `traylm requests export` writes), taken when the tune starts into a file
of the app's own, so the tuner replays the requests this computer really served.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from engines.client import DaemonClient
from engines.config.tomlfile import write_bytes_atomic
from engines.errors import ConfigError

RECORDED = "recorded"  # the page's own choice: exported at start, then a "file" workload
FILE = "file"
WORKLOADS = (
    ("chat", "Chat: short prompts, 8 in flight"),
    ("rag", "Long-prompt RAG: 1,536-token prompts, 4 in flight"),
    ("agent", "Agent with tools: 768-token prompts, short replies"),
    ("batch", "Batch throughput: 32 in flight"),
    (RECORDED, "My recorded traffic (the request recorder)"),
    (FILE, "A workload file (JSONL)…"),
)
GOALS = (
    ("throughput", "Throughput: output tokens/s"),
    ("latency", "Latency: time to first token, p95"),
    ("efficiency", "Efficiency: joules per token"),
    ("quiet", "Quiet: least power drawn"),
)
SKIPPED_PREFIX = b'{"traylm_skipped"'


async def export_recorded(client: DaemonClient, folder: Path) -> tuple[Path, int]:
    """The recorder's export written to a new file in ``folder`` (renamed into place when
    whole); ConfigError when it holds no request the tuner could replay."""
    lines = [line async for line in client.requests_export()]
    kept = [line for line in lines if line.strip() and not line.startswith(SKIPPED_PREFIX)]
    if not kept:
        raise ConfigError(
            "the request recorder holds no request to replay yet (it keeps those with a whole "
            "JSON body): use the model through the gateway first, or pick a preset"
        )
    path = folder / time.strftime("recorded-%Y%m%d-%H%M%S.jsonl")
    await asyncio.to_thread(write_bytes_atomic, path, b"".join(kept), 0o600)
    return path, len(kept)
