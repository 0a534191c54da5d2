"""A batch survives a daemon SIGKILLed halfway (real `traylm serve` processes, FAKE engine):
at the next start on the same home the open lines resume, and the output file answers every
line exactly once. The model is not loaded when the batch starts: the batch loads it."""

from __future__ import annotations

import io
import json
import signal
import time
from pathlib import Path

import openai
import psutil
import pytest

from engines.config.sections import Paths
from engines.config.tomlfile import write_toml_atomic
from engines.core.procs import free_loopback_port
from tests.engines.cli.test_cli import serve, stop_daemon

pytestmark = pytest.mark.slow
LINES = 1000
CHAT = "/v1/chat/completions"


def counts(client: openai.OpenAI, batch_id: str) -> tuple[str, int]:
    """The batch's status and completed lines ("" while the daemon does not answer)."""
    try:
        batch = client.batches.retrieve(batch_id)
    except openai.APIConnectionError:
        return "", 0
    assert batch.request_counts is not None
    return batch.status, batch.request_counts.completed


def until(client: openai.OpenAI, batch_id: str, done: int, timeout_s: float = 120) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        status, completed = counts(client, batch_id)
        if completed >= done or status in ("completed", "cancelled", "failed"):
            return status
        assert time.monotonic() < deadline, f"{completed} of {done} lines after {timeout_s} s"
        time.sleep(0.05)


def test_a_batch_killed_halfway_finishes_after_restart_each_line_once(
    env: dict[str, str], tmp_path: Path
) -> None:
    paths = Paths.from_env(env)
    write_toml_atomic(
        paths.profiles_dir / "chat.toml",
        {
            "model": "org/chat",
            "served_name": "chat",
            "device": "cpu",
            "env": {"FAKE_ENGINE_ARGS": "--token-delay 0.02"},
        },
    )
    rows = [
        {
            "custom_id": f"line-{n}",
            "method": "POST",
            "url": CHAT,
            "body": {
                "model": "chat",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4,
            },
        }
        for n in range(LINES)
    ]
    data = b"".join(json.dumps(r).encode() + b"\n" for r in rows)
    port = free_loopback_port()
    daemon = serve(env, "--port", str(port))
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
    try:
        made = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
        batch = client.batches.create(input_file_id=made.id, endpoint=CHAT, completion_window="24h")
        assert until(client, batch.id, LINES // 3) == "in_progress"
        engines = psutil.Process(daemon.pid).children(recursive=True)
        daemon.send_signal(signal.SIGKILL)
        daemon.wait(10)
        for p in engines:  # (the reaper's job too, at the next start)
            if p.is_running():
                p.kill()
        assert counts(client, batch.id) == ("", 0)  # the daemon is gone
        daemon = serve(env, "--port", str(port))
        assert until(client, batch.id, LINES + 1) == "completed"
        done = client.batches.retrieve(batch.id)
        assert done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (LINES, 0)
        out = client.files.content(done.output_file_id or "").content.splitlines()
        ids = [json.loads(line)["custom_id"] for line in out]
        assert sorted(ids) == sorted(r["custom_id"] for r in rows)  # each once, none twice
        assert done.error_file_id is None
    finally:
        client.close()
        stop_daemon(daemon)
